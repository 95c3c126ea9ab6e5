"""The `zbkit` command. Each subcommand lives beside the code it shows.

Only the chosen subcommand's module is imported: `zbkit schedule` is pure Python and starts
in a fraction of a second, while `zbkit demo` pulls in torch and the launcher.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import PackageNotFoundError, version

from zbkit import __version__

# subcommand -> module with `add_arguments(parser)` and `main(args) -> int`
_COMMANDS = {
    "demo": (
        "zbkit.demo",
        "split backward vs autograd, then real pipelines vs their simulations, HTML report",
    ),
    "doctor": (
        "zbkit.doctor._cli",
        "say which known traps a pipeline setup will fall into, before the run",
    ),
    "schedule": ("zbkit.schedules.cli", "build, validate and simulate a pipeline schedule"),
}


def _version() -> str:
    try:
        return version("zbkit")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return __version__


def _chosen(argv: list[str]) -> str | None:
    """The subcommand named on the command line: the first word that is not an option."""
    words = [a for a in argv if not a.startswith("-")]
    return words[0] if words and words[0] in _COMMANDS else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="zbkit", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"zbkit {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    chosen = _chosen(argv)
    for name, (module_name, help_text) in _COMMANDS.items():
        command = sub.add_parser(name, help=help_text)
        if name == chosen:  # the others' options are only read by `zbkit <other> --help`
            importlib.import_module(module_name).add_arguments(command)
    args = parser.parse_args(argv)
    module = importlib.import_module(_COMMANDS[args.command][0])
    return int(module.main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
