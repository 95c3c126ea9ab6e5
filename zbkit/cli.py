"""The `zbkit` command. Each subcommand lives beside the code it shows."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module with `add_arguments(parser)` and `main(args) -> int`
_COMMANDS = {
    "demo": (
        "zbkit.demo",
        "split backward vs autograd, then real pipelines vs their simulations, HTML report",
    ),
    "schedule": ("zbkit.schedules.cli", "build, validate and simulate a pipeline schedule"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zbkit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in _COMMANDS.items():
        module = importlib.import_module(module_name)
        module.add_arguments(sub.add_parser(name, help=help_text))
    args = parser.parse_args(argv)
    module = importlib.import_module(_COMMANDS[args.command][0])
    return int(module.main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
