"""The `zbkit` command. Each subcommand lives beside the code it shows.

Only the chosen subcommand's module is imported: `zbkit schedule` is pure Python and starts
in a fraction of a second, while `zbkit demo` pulls in torch and the launcher. `zbkit schedule
--profile PATH` is added here, not in `zbkit.schedules` (which may not import the planner):
the schedule's own output, then the planner's prediction from a saved profile.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from zbkit import __version__

if TYPE_CHECKING:  # names for the hints; the planner itself loads only with --profile
    from zbkit.planner import Prediction, Profile

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
    "plan": (
        "zbkit.planner.cli",
        "choose the schedule, stages and microbatches that run fastest within a memory budget",
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
            if name == "schedule":
                _add_profile_option(command)
    args = parser.parse_args(argv)
    if args.command == "schedule" and args.profile is not None:
        return _schedule_with_profile(args)
    module = importlib.import_module(_COMMANDS[args.command][0])
    return int(module.main(args) or 0)


# ---- zbkit schedule --profile PATH: the schedule in seconds and bytes -----------------------


def _add_profile_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile",
        metavar="PATH",
        help="a planner.Profile saved as JSON (Profile.save): also print each rank's predicted "
        "peak bytes, what is held at that peak, and the step's seconds (planner.predict; "
        "loads torch)",
    )


def _schedule_with_profile(args: argparse.Namespace) -> int:
    """The profile read first (a bad file: one line, exit 2, before anything is printed),
    then the schedule's own output, then the prediction (exit 2 if the profile cannot fill
    the schedule's stages)."""
    # here, not at the top: torch loads only when --profile is given
    from zbkit import planner
    from zbkit.schedules import cli as schedule_cli  # the schedule's own output, as without

    if args.memory_limit is not None:  # zb-auto's limit is in --costs' M_B, the planner's bytes
        return _refuse("--memory-limit counts --costs' M_B, not bytes: drop it with --profile")
    try:
        profile = planner.Profile.load(args.profile)
    except OSError as err:
        return _refuse(f"--profile {args.profile}: {err.strerror}")
    except (ValueError, KeyError, TypeError, AttributeError) as err:  # JSON, not a Profile's
        return _refuse(
            f"--profile {args.profile} is not a profile saved by planner.Profile.save "
            f"({type(err).__name__}: {err})"
        )
    code = int(schedule_cli.main(args) or 0)
    if code:  # the schedule itself was refused, and said why
        return code
    try:
        prediction = _predict(profile, args)
    except ValueError as err:  # e.g. fewer layers than the schedule has stages
        return _refuse(str(err))
    what = f"{len(profile)} layers, {profile.device}, {profile.dtype}, {profile.optimizer}"
    print(f"\npredicted from {args.profile} ({what}), in its seconds and bytes, not --costs:")
    print(_prediction_table(prediction))
    return 0


def _refuse(message: str) -> int:
    print(f"zbkit schedule: {message}", file=sys.stderr)
    return 2


def _predict(profile: Profile, args: argparse.Namespace) -> Prediction:
    """`planner.predict` of the schedule printed above: the loaded one, or the name with the
    options given (a schedule that searches searches again, on the profile's costs)."""
    from zbkit import planner  # here, not at the top: torch loads only with --profile
    from zbkit.schedules import Schedule  # as `_COMMANDS`: loaded by the command that uses it

    if args.load:
        loaded = Schedule.load(args.load)
        return planner.predict(profile, loaded, pp=loaded.pp, microbatches=loaded.microbatches)
    options = {k: getattr(args, k) for k in ("stages_per_rank", "placement")}
    options = {k: v for k, v in options.items() if v is not None}  # a builder refuses others
    return planner.predict(
        profile, args.name, pp=args.pp, microbatches=args.microbatches, **options
    )


def _prediction_table(prediction: Prediction) -> str:
    """Per rank: the peak bytes and when it is, the compute's peak and what it holds, and
    the rank's seconds; then the stages' layers and the step."""
    parts = prediction.ranks[0].breakdown
    head = ["rank", "peak bytes", "peak at", "compute peak", *parts, "ms"]
    rows = [
        [
            str(r),
            f"{p.peak_bytes:,}",
            "optimizer step" if p.at_step else "compute",
            f"{sum(p.breakdown.values()):,}",
            *(f"{v:,}" for v in p.breakdown.values()),
            f"{p.seconds * 1e3:.4g}",
        ]
        for r, p in enumerate(prediction.ranks)
    ]
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    lines = [
        "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in [head, *rows]
    ]
    spans = ", ".join(f"{s.start}-{s.stop - 1}" if len(s) > 1 else str(s.start)
                      for s in prediction.stages)  # fmt: skip
    lines += [
        "compute peak: the sum of the columns after it, the most held while F, I and W run; "
        "peak bytes: that or the optimizer step's, whichever is more",
        f"stages' layers: {spans}; on ranks {prediction.schedule.stage_to_rank}",
        f"step: {prediction.step_seconds * 1e3:.4g} ms (the slowest rank, its optimizer step "
        "included)",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
