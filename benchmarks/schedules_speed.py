"""Speed of build + validate + simulate, the loop behind a schedule slider.

Budgets (issue 13): every builder, validate and simulate together under 0.2 s at pp=16,
m=64 and under 1 s at pp=64, m=512. Each case is timed as a median over paired runs
against a baseline measured side by side in the same process (1F1B at the same size: the
simplest schedule through the same path), so a noisy machine shifts both and the ratio
stays meaningful. zb-auto runs with its default costs and limit, and with the Zero Bubble
paper's times (limit p*M_B, its ZB-1p; for the V the default 2p halves), in both
placements; it forgets its remembered searches before each run (a slider's next value
is a new question). A Simulation's per-action events are made when first read (a slider
shows the numbers), so they are not part of the time.

    .venv/bin/python benchmarks/schedules_speed.py           # both sizes
    .venv/bin/python benchmarks/schedules_speed.py 16        # pp=16, m=64 only
"""

from __future__ import annotations

import statistics
import sys
import time

from zbkit.schedules import Costs, build_schedule, simulate
from zbkit.schedules.builders import SCHEDULES
from zbkit.schedules.search import auto

# 14.6B model of the Zero Bubble paper (Table 6, m=128): T_F, T_B (our I), T_W, T_comm in ms
PAPER = Costs(F=11.325, I=11.308, W=8.109, comm=0.378, mem_activation=1.0, mem_weight=0.44)
SIZES = {16: (64, 0.2, 5), 64: (512, 1.0, 3)}  # pp: (m, budget s, repeats)


def once(name: str, pp: int, m: int, **options) -> tuple[float, float, float, float]:
    """(wall, CPU, build, validate + simulate) seconds; CPU is what a busy machine distorts
    least; the split says which part to make faster."""
    auto._RECENT.clear()  # zb-auto: time the search, not the memory of one
    wall, cpu = time.perf_counter(), time.process_time()
    schedule = build_schedule(name, pp=pp, microbatches=m, **options)
    built = time.perf_counter()
    # validate and simulate together, as a slider does: simulate(check=True) runs the
    # validator's checks and finds a deadlock in its own walk of the ranks
    simulate(schedule, options.get("costs") or Costs())
    end = time.perf_counter()
    return end - wall, time.process_time() - cpu, built - wall, end - built


def paired(name: str, pp: int, m: int, repeats: int, **options) -> tuple[float, ...]:
    """Medians of (wall, CPU, build, check) for `name` and of wall for the 1F1B baseline,
    run alternately."""
    rows, base = [], []
    for _ in range(repeats):
        rows.append(once(name, pp, m, **options))
        base.append(once("1f1b", pp, m)[0])
    return (
        *(statistics.median(column) for column in zip(*rows, strict=True)),
        *[statistics.median(base)],
    )


def cases(pp: int) -> list[tuple[str, str, dict]]:
    """(schedule, what is set, options): every builder at its defaults, zb-auto four ways."""
    out = [(name, "", {}) for name in SCHEDULES if name != "zb-auto"]
    for placement in ("linear", "v"):
        out.append(("zb-auto", f"{placement} default", {"placement": placement}))
        paper = {"placement": placement, "costs": PAPER}
        if placement == "linear":
            paper["memory_limit"] = float(pp)  # the paper's ZB-1p
        out.append(("zb-auto", f"{placement} paper", paper))
    return out


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or list(SIZES)
    print(
        f"{'schedule':<16} {'settings':<15} {'pp':>3} {'m':>4} {'wall s':>7} {'cpu s':>6} "
        f"{'build':>6} {'check':>6} {'budget':>6} {'of it':>6} {'vs 1f1b':>7}"
    )
    for pp in sizes:
        m, budget, repeats = SIZES[pp]
        for name, settings, options in cases(pp):
            try:
                t, cpu, build, check, base = paired(name, pp, m, repeats, **options)
            except ValueError as err:  # a builder that refuses these sizes says why
                print(f"{name:<16} {settings:<15} {pp:>3} {m:>4}  refused: {err}")
                continue
            mark = "" if t <= budget else "  over"
            print(
                f"{name:<16} {settings:<15} {pp:>3} {m:>4} {t:>7.3f} {cpu:>6.3f} {build:>6.3f} "
                f"{check:>6.3f} {budget:>6.1f} {t / budget:>6.0%} {t / base:>6.1f}x{mark}"
            )


if __name__ == "__main__":
    main()
