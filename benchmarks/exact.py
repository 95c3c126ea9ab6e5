"""The exact solver: how long a proof takes, how far zb-auto is from the optimum, how tight the
instant bound is.

For a grid of small settings (p 2-4, m 2-8, three cost sets, three memory limits, linear
placement) it solves each to optimality (`solve`, 60 s each) and prints the solve time, the
proven optimum, zb-auto's longest rank span beside it (its gap) and `lower_bound`'s share of
the optimum. Then the bound's time at larger sizes (budget: under 2 s at pp=32, m=256).
Budgets (issue 24): every setting proven within 60 s; the bound at least 90% of the optimum.

    .venv/bin/python benchmarks/exact.py            # the whole grid (minutes)
    .venv/bin/python benchmarks/exact.py --quick    # p <= 3, m <= 4
"""

from __future__ import annotations

import sys
import time

from zbkit.schedules import Costs, build_schedule, lower_bound, simulate, solve

COSTS = {
    "equal": Costs(1, 1, 1),
    "W cheap, comm": Costs(1, 1.5, 0.5, comm=0.2),
    "paper-like": Costs(1.85, 1.81, 0.93, comm=0.06, mem_weight=0.4),
}
LIMITS = (0.75, 1.0, 1.5)  # times 1F1B's peak (p rank-microbatches)


def main(quick: bool) -> int:
    sizes = [(p, m) for p in (2, 3, 4) for m in (2, 4, 8) if not quick or (p <= 3 and m <= 4)]
    print(f"{'p':>2} {'m':>2} {'costs':<14} {'limit':>5} {'solve s':>8} {'optimum':>9} "
          f"{'zb-auto':>8} {'gap':>6} {'bound/opt':>9}")  # fmt: skip
    slow, loose, worse = 0, 0, 0
    for p, m in sizes:
        for label, costs in COSTS.items():
            for share in LIMITS:
                limit = share * p
                try:
                    found = solve(pp=p, microbatches=m, costs=costs, memory_limit=limit)
                except ValueError:  # nothing fits this limit
                    print(f"{p:>2} {m:>2} {label:<14} {limit:>5.3g}  no schedule fits")
                    continue
                try:
                    auto = build_schedule(
                        "zb-auto", pp=p, microbatches=m, costs=costs, memory_limit=limit
                    )
                    span = max(simulate(auto, costs).span)
                except ValueError:
                    span = float("nan")
                bound = lower_bound(pp=p, microbatches=m, costs=costs, memory_limit=limit)
                gap = span / found.value - 1
                slow += not found.optimal
                loose += bound < 0.9 * found.value
                worse += gap > 1e-9
                mark = "" if found.optimal else "  (not proven)"
                print(f"{p:>2} {m:>2} {label:<14} {limit:>5.3g} {found.seconds:>8.2f} "
                      f"{found.value:>9.4g} {span:>8.4g} {gap:>6.1%} "
                      f"{bound / found.value:>9.1%}{mark}")  # fmt: skip
    print(
        f"\nnot proven within 60 s: {slow}; bound under 90% of the optimum: {loose}; "
        f"zb-auto above the optimum: {worse}"
    )
    for p, m in ((8, 64), (16, 128), (32, 256)):
        started = time.perf_counter()
        lower_bound(pp=p, microbatches=m, costs=COSTS["paper-like"])
        print(f"lower_bound at pp={p}, m={m}: {time.perf_counter() - started:.4f} s (budget 2 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main("--quick" in sys.argv))
