"""The exact solver: how long a proof takes, how far zb-auto is from the optimum, how tight the
instant bound is.

For a grid of small settings (p 2-4, m 2-8, three cost sets, three memory limits; the linear
placement, and the V for p <= 3) it solves each (`solve`, 60 s each) and prints the solve
time, the optimum (or the best found and its proven bound), zb-auto's longest rank span
beside it (its gap; zb-auto solves settings of at most 96 actions itself) and
`lower_bound`'s share of the optimum. Then the bound against zb-auto at larger sizes, where
nothing is proven (the bound's share of zb-auto's span is a floor on its share of the
optimum), and its time (budget: under 2 s at pp=32, m=256).
Budgets (issue 24): every setting proven within 60 s; the bound at least 90% of the optimum.

    .venv/bin/python benchmarks/exact.py                 # the whole grid (minutes)
    .venv/bin/python benchmarks/exact.py --quick         # p <= 3, m <= 4
    .venv/bin/python benchmarks/exact.py --placement v   # one placement's rows only
    .venv/bin/python benchmarks/exact.py --random 30     # random settings instead of the grid
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from zbkit.schedules import Costs, build_schedule, lower_bound, simulate, solve
from zbkit.schedules.optimum import walk

COSTS = {
    "equal": Costs(1, 1, 1),
    "W cheap, comm": Costs(1, 1.5, 0.5, comm=0.2),
    "paper-like": Costs(1.85, 1.81, 0.93, comm=0.06, mem_weight=0.4),
}
LIMITS = (0.75, 1.0, 1.5)  # times 1F1B's peak (p rank-microbatches)


def _sizes(placement: str, quick: bool) -> list[tuple[int, int]]:
    ranks = (2, 3, 4) if placement == "linear" else (2, 3)
    return [(p, m) for p in ranks for m in (2, 4, 8) if not quick or (p <= 3 and m <= 4)]


def _row(p: int, m: int, label: str, limit: float, placement: str, counts: dict) -> None:
    costs = COSTS[label]
    head = f"{placement:<6} {p:>2} {m:>2} {label:<14} {limit:>5.3g}"
    try:
        found = solve(pp=p, microbatches=m, costs=costs, memory_limit=limit, placement=placement)
    except ValueError:  # nothing fits this limit
        print(f"{head}  no schedule fits")
        return
    try:
        auto = build_schedule("zb-auto", pp=p, microbatches=m, costs=costs, memory_limit=limit,
                              placement=placement)  # fmt: skip
        span = max(simulate(auto, costs).span)
    except ValueError:
        span = float("nan")
    bound = lower_bound(pp=p, microbatches=m, costs=costs, memory_limit=limit, placement=placement)
    gap = span / found.value - 1
    counts["rows"] += 1
    counts["slow"] += not found.optimal
    counts["loose"] += found.optimal and bound < 0.9 * found.value
    counts["worse"] += found.optimal and gap > 1e-9
    mark = "" if found.optimal else f"  (not proven: >= {found.lower_bound:.4g})"
    print(f"{head} {found.seconds:>8.2f} {found.value:>9.4g} {span:>8.4g} {gap:>6.1%} "
          f"{bound / found.value:>9.1%}{mark}", flush=True)  # fmt: skip


def main(quick: bool, placements: list[str]) -> int:
    print(f"{'place':<6} {'p':>2} {'m':>2} {'costs':<14} {'limit':>5} {'solve s':>8} "
          f"{'optimum':>9} {'zb-auto':>8} {'gap':>6} {'bound/opt':>9}")  # fmt: skip
    counts = dict(rows=0, slow=0, loose=0, worse=0)
    for placement in placements:
        for p, m in _sizes(placement, quick):
            for label in COSTS:
                for share in LIMITS:
                    _row(p, m, label, share * p, placement, counts)
    print(
        f"\n{counts['rows']} settings; not proven within 60 s: {counts['slow']}; bound under "
        f"90% of a proven optimum: {counts['loose']}; zb-auto above a proven optimum: "
        f"{counts['worse']}"
    )
    print("\nthe bound at larger sizes, against zb-auto (a floor on its share of the optimum):")
    for p, m in ((8, 32), (16, 64)):
        for label, costs in COSTS.items():
            for share in LIMITS:
                auto = build_schedule("zb-auto", pp=p, microbatches=m, costs=costs,
                                      memory_limit=share * p)  # fmt: skip
                span = max(simulate(auto, costs).span)
                bound = lower_bound(pp=p, microbatches=m, costs=costs, memory_limit=share * p)
                print(f"  p={p:>2} m={m:>3} {label:<14} limit {share:g}p: "
                      f"bound/zb-auto {bound / span:.1%}")  # fmt: skip
    # up to 768 actions the bound walks every action (`walk.chains`), up to 192 it probes
    # pairs of forwards (only where a rank holds two stages: the V); beyond, closed forms
    sizes = [("linear", p, m) for p, m in ((4, 8), (8, 32), (8, 64), (16, 128), (32, 256))]
    for placement, p, m in [*sizes, ("v", 3, 8), ("v", 4, 8), ("v", 4, 32)]:
        walk._chains.cache_clear()  # the walk remembers settings: time it from nothing
        started = time.perf_counter()
        lower_bound(pp=p, microbatches=m, costs=COSTS["paper-like"], memory_limit=0.75 * p,
                    placement=placement)  # fmt: skip
        print(f"lower_bound at pp={p}, m={m} ({placement}, 0.75 p): "
              f"{time.perf_counter() - started:.4f} s (budget 2 s)")  # fmt: skip
    return 0


def random_settings(count: int, seed: int = 7) -> int:
    """Proofs on random settings of the issue's sizes (linear p <= 4, V p <= 3, m <= 8):
    per-stage costs (a third with one stage slower), comm and mem_weight half the time, a
    limit from a little over one microbatch's activations to 1.5 per stage."""
    rng = random.Random(seed)
    proven = tried = 0
    slowest, worst = 0.0, 1.0
    for trial in range(count):
        placement = "linear" if trial % 2 else "v"
        p, m = rng.randint(2, 4 if placement == "linear" else 3), rng.randint(2, 8)
        n = 2 * p if placement == "v" else p
        one = Costs(*(round(x, 2) for x in (rng.uniform(0.5, 2), rng.uniform(0.5, 2),
                     rng.uniform(0.2, 1.5), rng.choice([0.0, rng.uniform(0, 0.3)]), 1.0,
                     rng.choice([0.0, rng.uniform(0, 0.6)]))))  # fmt: skip
        per = [one] * (n - 1) + [Costs(2, 2.5, 1) if trial % 3 == 0 else one]
        held = 2 if placement == "v" else 1  # one microbatch's activations on a rank
        limit = round(rng.uniform(held + 0.25 * m, 1.5 * n), 2)
        try:
            found = solve(pp=p, microbatches=m, costs=per, memory_limit=limit,
                          placement=placement)  # fmt: skip
        except ValueError:  # nothing fits this limit
            continue
        bound = lower_bound(pp=p, microbatches=m, costs=per, memory_limit=limit,
                            placement=placement)  # fmt: skip
        tried, proven = tried + 1, proven + found.optimal
        slowest, worst = max(slowest, found.seconds), min(worst, bound / found.value)
        print(f"{placement:<6} p={p} m={m} limit {limit:<5g} {found.seconds:6.2f} s "
              f"{'proven' if found.optimal else 'not proven'}, bound/opt {bound / found.value:.1%}",
              flush=True)  # fmt: skip
    print(f"\nproven within 60 s: {proven} of {tried}; slowest {slowest:.1f} s; "
          f"the bound at least {worst:.1%} of the optimum")  # fmt: skip
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="p <= 3, m <= 4")
    parser.add_argument("--placement", choices=("linear", "v"), action="append")
    parser.add_argument("--random", type=int, metavar="N", help="N random settings instead")
    args = parser.parse_args()
    if args.random:
        sys.exit(random_settings(args.random))
    sys.exit(main(args.quick, args.placement or ["linear", "v"]))
