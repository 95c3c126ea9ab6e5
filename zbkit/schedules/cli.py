"""`zbkit schedule NAME --pp 4 -m 8`: build (or load), validate, simulate and print a schedule."""

from __future__ import annotations

import argparse
import sys

from zbkit.schedules.builders import PLACEMENTS, build_schedule, explain_auto
from zbkit.schedules.catalog import RECORDS, SCHEDULES, searchers
from zbkit.schedules.core.costs import MEMORY_UNIT, Costs
from zbkit.schedules.core.schedule import Schedule, ScheduleError
from zbkit.schedules.formulas import bubble, conditions
from zbkit.schedules.optimum.exact import bound_for, gap_line
from zbkit.schedules.search.candidates import Candidate
from zbkit.schedules.sim.simulate import Simulation, simulate
from zbkit.schedules.sim.validate import validate
from zbkit.schedules.throughput import throughput

_DEFAULT_COSTS = "1,1,1"
_GRID_RANKS = 64  # more ranks than this: no grid, lists shortened


def _shorten(values: list[str]) -> str:
    """'a, b, c' for a few values; the first and last 8 around '...' for many ranks."""
    if len(values) <= 2 * 8 + 1:
        return ", ".join(values)
    return f"{', '.join(values[:8])}, ... ({len(values)} ranks) ..., {', '.join(values[-8:])}"


def _takers(test) -> str:
    """The names of the schedules whose record passes `test`, for --help."""
    return ", ".join(r.name for r in RECORDS.values() if test(r))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    listing = "; ".join(f"{r.name}: {r.about}" for r in RECORDS.values())
    parser.add_argument("name", nargs="?", choices=SCHEDULES, help=f"schedule to build ({listing})")
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
        help=f"{', '.join(searchers())}: peak per rank in {MEMORY_UNIT} (x M_B)",
    )
    parser.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default=None,
        help=f"{_takers(lambda r: 'placement' in r.options)}: stage s on rank s (linear, "
        "default) or ZB-V's V (v)",
    )
    parser.add_argument(
        "--stages-per-rank",
        type=int,
        default=None,
        help=f"{_takers(lambda r: 'stages_per_rank' in r.options)}: v (default 2)",
    )
    parser.add_argument("--save", metavar="PATH", help="write the schedule as torch-style CSV")
    parser.add_argument("--load", metavar="PATH", help="read a torch-style CSV instead of building")


def _searches(args: argparse.Namespace) -> bool:
    """Whether the named schedule searches here: its record says always, or says when given
    costs or a limit and they were (zb-v without them is the paper's hand-written ZB-V)."""
    if not args.name or args.load:
        return False
    given = args.memory_limit is not None or args.costs != _DEFAULT_COSTS
    return RECORDS[args.name].searching(given)


def _search(args: argparse.Namespace, costs: Costs) -> tuple[Schedule, Candidate | None]:
    """Build by searching, and say which of zb-auto's candidates was kept (a proof: none)."""
    found = RECORDS[args.name]
    if "placement" in found.options:
        placement = args.placement or found.options["placement"]
    elif args.placement not in (None, found.placement):
        where = "the V" if found.placement == "v" else found.placement
        raise ValueError(f"{args.name}: its placement is {where}; drop --placement")
    else:
        placement = found.placement
    given = dict(costs=costs, memory_limit=args.memory_limit, placement=placement)
    if found.largest is not None:  # a proof (zb-opt), not zb-auto's search: nothing "kept"
        return build_schedule(args.name, pp=args.pp, microbatches=args.microbatches, **given), None
    searched = explain_auto(pp=args.pp, microbatches=args.microbatches, **given)
    searched.schedule.name = args.name
    return searched.schedule, searched.chosen


def _build(args: argparse.Namespace) -> Schedule:
    options = {}  # only what was given: a builder refuses options it does not take
    for key in ("stages_per_rank", "memory_limit", "placement"):
        if getattr(args, key) is not None:
            options[key] = getattr(args, key)
    return build_schedule(args.name, pp=args.pp, microbatches=args.microbatches, **options)


def _closed_form(schedule: Schedule, costs: Costs) -> str | None:
    """The closed form's line: the formulas leave communication out, so they are shown
    only when comm = 0."""
    form = bubble(
        schedule.name, schedule.pp, schedule.microbatches, schedule.stages_per_rank, costs
    )
    if form is not None and not costs.comm:
        return f"closed form: {form.rate:.4f}  ({form.formula} idle per rank)"
    if form is not None:
        return "closed form: not shown (it leaves comm out; the simulation above has it)"
    if conditions(schedule.name):
        return f"closed form: does not apply here (it needs {conditions(schedule.name)})"
    return None


def _report(schedule: Schedule, sim: Simulation, costs: Costs, chosen: Candidate | None) -> None:
    print(repr(schedule))
    if chosen is not None:  # a search: which candidate it kept
        print(f"{schedule.name} kept: {chosen.name} ({chosen.reason})")
    if schedule.pp <= _GRID_RANKS:  # a loaded torch file's transfers and FSDP actions too
        print(schedule.to_grid(comms=any(schedule.torch_ops.values())))
    else:
        print(f"(grid not printed above {_GRID_RANKS} ranks; --save PATH writes it as CSV)")
    print(f"\ncosts: {costs}")
    print(f"bubble rate: {sim.bubble_rate:.4f}  (makespan {sim.makespan:.4g}, one iteration)")
    # how far from the best any schedule of this placement could do in this memory
    gap = gap_line(max(sim.span), bound_for(schedule, costs, sim))
    print(f"longest rank span {max(sim.span):.4g}: {gap}")
    print(throughput(schedule, costs, simulated=sim))
    line = _closed_form(schedule, costs)
    if line is not None:
        print(line)
    peaks = _shorten([f"{m:.4g}" for m in sim.peak_memory])
    print(f"peak memory per rank ({MEMORY_UNIT} x mem_activation): {peaks}")


def main(args: argparse.Namespace) -> int:
    chosen: Candidate | None = None  # the candidate a search kept
    try:
        costs = Costs.parse(args.costs)
        if args.load:
            schedule = Schedule.load(args.load)
        elif _searches(args):
            schedule, chosen = _search(args, costs)
        elif args.name:
            schedule = _build(args)
        else:
            print("zbkit schedule: give a NAME or --load PATH", file=sys.stderr)
            return 2
        validate(schedule)
        sim = simulate(schedule, costs, check=False)
    except (ValueError, OSError) as err:  # ScheduleError is a ValueError
        kind = "invalid schedule" if isinstance(err, ScheduleError) else "error"
        print(f"zbkit schedule: {kind}: {err}", file=sys.stderr)
        return 1
    _report(schedule, sim, costs, chosen)
    if args.save:
        try:
            schedule.save(args.save)
        except OSError as err:
            print(f"zbkit schedule: cannot save to {args.save}: {err.strerror}", file=sys.stderr)
            return 1
        print(f"saved to {args.save}")
    return 0
