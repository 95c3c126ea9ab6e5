"""`zbkit schedule NAME --pp 4 -m 8`: build (or load), validate, simulate and print a schedule."""

from __future__ import annotations

import argparse
import sys

from zbkit.schedules.builders import PLACEMENTS, SCHEDULES, build_schedule, explain_auto
from zbkit.schedules.costs import MEMORY_UNIT
from zbkit.schedules.formulas import CONDITIONS, bubble
from zbkit.schedules.schedule import Schedule, ScheduleError
from zbkit.schedules.simulate import Costs, simulate
from zbkit.schedules.throughput import throughput
from zbkit.schedules.validate import validate

_DEFAULT_COSTS = "1,1,1"
_GRID_RANKS = 64  # more ranks than this: no grid, lists shortened


def _shorten(values: list[str]) -> str:
    """'a, b, c' for a few values; the first and last 8 around '...' for many ranks."""
    if len(values) <= 2 * 8 + 1:
        return ", ".join(values)
    return f"{', '.join(values[:8])}, ... ({len(values)} ranks) ..., {', '.join(values[-8:])}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", choices=SCHEDULES, help="schedule to build")
    parser.add_argument("--pp", type=int, default=4, help="pipeline ranks (default 4)")
    parser.add_argument("-m", "--microbatches", type=int, default=8, help="default 8")
    parser.add_argument(
        "--costs",
        default=_DEFAULT_COSTS,
        help="F,I,W[,comm[,M_B[,M_W]]]: one rank's share of the model per microbatch, split "
        "evenly over a rank's chunks (default 1,1,1)",
    )
    parser.add_argument(
        "--memory-limit",
        type=float,
        default=None,
        help=f"zb-auto, zb-v: peak per rank in {MEMORY_UNIT} (x M_B)",
    )
    parser.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default=None,
        help="zb-auto: stage s on rank s (linear, default) or ZB-V's V (v)",
    )
    parser.add_argument(
        "--stages-per-rank",
        type=int,
        default=None,
        help="interleaved-1f1b, looped-bfs, interleaved-zb: v (default 2)",
    )
    parser.add_argument("--save", metavar="PATH", help="write the schedule as torch-style CSV")
    parser.add_argument("--load", metavar="PATH", help="read a torch-style CSV instead of building")


def _searches(args: argparse.Namespace) -> bool:
    """zb-auto always searches; zb-v does when given costs or a limit (else it is the
    paper's hand-written ZB-V)."""
    given = args.memory_limit is not None or args.costs != _DEFAULT_COSTS
    return args.name == "zb-auto" or (args.name == "zb-v" and given)


def main(args: argparse.Namespace) -> int:
    try:
        costs = Costs.parse(args.costs)
        if args.load:
            schedule = Schedule.load(args.load)
        elif _searches(args):  # say which candidate it kept
            if args.name == "zb-v" and args.placement not in (None, "v"):
                raise ValueError("zb-v: its placement is the V; drop --placement")
            found = explain_auto(
                pp=args.pp,
                microbatches=args.microbatches,
                costs=costs,
                memory_limit=args.memory_limit,
                placement="v" if args.name == "zb-v" else args.placement or "linear",
            )
            schedule, chosen = found.schedule, found.chosen
            schedule.name = args.name
        elif args.name:
            options = {}  # only what was given: a builder refuses options it does not take
            for key in ("stages_per_rank", "memory_limit", "placement"):
                if getattr(args, key) is not None:
                    options[key] = getattr(args, key)
            schedule = build_schedule(
                args.name, pp=args.pp, microbatches=args.microbatches, **options
            )
        else:
            print("zbkit schedule: give a NAME or --load PATH", file=sys.stderr)
            return 2
        validate(schedule)
        sim = simulate(schedule, costs, check=False)
    except (ValueError, OSError) as err:  # ScheduleError is a ValueError
        kind = "invalid schedule" if isinstance(err, ScheduleError) else "error"
        print(f"zbkit schedule: {kind}: {err}", file=sys.stderr)
        return 1
    print(repr(schedule))
    if _searches(args) and not args.load:
        print(f"{args.name} kept: {chosen.name} ({chosen.reason})")
    if schedule.pp <= _GRID_RANKS:  # a loaded torch file's transfers and FSDP actions too
        print(schedule.to_grid(comms=any(schedule.torch_ops.values())))
    else:
        print(f"(grid not printed above {_GRID_RANKS} ranks; --save PATH writes it as CSV)")
    print(f"\ncosts: {costs}")
    print(f"bubble rate: {sim.bubble_rate:.4f}  (makespan {sim.makespan:.4g}, one iteration)")
    print(throughput(schedule, costs, simulated=sim))
    # the formulas leave communication out, so they are shown only when comm = 0
    form = bubble(
        schedule.name, schedule.pp, schedule.microbatches, schedule.stages_per_rank, costs
    )
    if form is not None and not costs.comm:
        print(f"closed form: {form.rate:.4f}  ({form.formula} idle per rank)")
    elif form is not None:
        print("closed form: not shown (it leaves comm out; the simulation above has it)")
    elif schedule.name in CONDITIONS:
        print(f"closed form: does not apply here (it needs {CONDITIONS[schedule.name]})")
    peaks = _shorten([f"{m:.4g}" for m in sim.peak_memory])
    print(f"peak memory per rank ({MEMORY_UNIT} x mem_activation): {peaks}")
    if args.save:
        try:
            schedule.save(args.save)
        except OSError as err:
            print(f"zbkit schedule: cannot save to {args.save}: {err.strerror}", file=sys.stderr)
            return 1
        print(f"saved to {args.save}")
    return 0
