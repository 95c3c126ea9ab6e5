"""Speed of build + validate + simulate, the loop behind a schedule slider.

Budgets (issue 3): zb-h1 at p=32, m=256 under 0.2 s; zb-auto at p=16, m=128 under 2 s.
Each case is timed as a median over paired runs against a baseline measured side by side
in the same process (1F1B at the same size: the simplest schedule through the same path),
so a noisy machine shifts both and the ratio stays meaningful.

    .venv/bin/python benchmarks/schedules_speed.py
"""

from __future__ import annotations

import statistics
import time

from zbkit.schedules import Costs, build_schedule, simulate, validate

# 14.6B model of the Zero Bubble paper (Table 6, m=128): T_F, T_B (our I), T_W, T_comm in ms
PAPER = Costs(F=11.325, I=11.308, W=8.109, comm=0.378, mem_activation=1.0, mem_weight=0.44)


def once(name: str, pp: int, m: int, **options) -> tuple[float, float]:
    """(wall, CPU) seconds; CPU time is what a busy shared machine distorts least."""
    wall, cpu = time.perf_counter(), time.process_time()
    schedule = build_schedule(name, pp=pp, microbatches=m, **options)
    validate(schedule)
    simulate(schedule, options.get("costs") or Costs(), check=False)
    return time.perf_counter() - wall, time.process_time() - cpu


def paired(name: str, pp: int, m: int, repeats: int, **options) -> tuple[float, float, float]:
    """Medians of (wall, CPU) for `name` and of wall for the 1F1B baseline, run alternately."""
    runs, cpus, base = [], [], []
    for _ in range(repeats):
        wall, cpu = once(name, pp, m, **options)
        runs.append(wall)
        cpus.append(cpu)
        base.append(once("1f1b", pp, m)[0])
    return statistics.median(runs), statistics.median(cpus), statistics.median(base)


def main() -> None:
    cases = [
        ("zb-h1", 32, 256, 0.2, 7, {}),
        ("zb-auto", 16, 128, 2.0, 3, {"costs": PAPER, "memory_limit": 16.0}),
    ]
    print(f"{'schedule':<10} {'pp':>3} {'m':>4} {'wall s':>8} {'cpu s':>7} {'budget s':>9} "
          f"{'of budget':>9} {'vs 1f1b':>8}")  # fmt: skip
    for name, pp, m, budget, repeats, options in cases:
        t, cpu, base = paired(name, pp, m, repeats, **options)
        print(
            f"{name:<10} {pp:>3} {m:>4} {t:>8.3f} {cpu:>7.3f} {budget:>9.1f} {t / budget:>8.0%} "
            f"{t / base:>7.1f}x"
        )


if __name__ == "__main__":
    main()
