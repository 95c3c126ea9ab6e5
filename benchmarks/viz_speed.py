"""How fast ScheduleExplorer redraws for p = 8, m = 32 (the budget is 200 ms).

One redraw = build the schedule, simulate it, draw the figure, render the PNG. The baseline,
measured side by side in the same process (paired, alternating), is the obvious matplotlib
version: one `barh` rectangle and one label per action, rendered the same way. Prints medians
and the ratio ours / baseline.

    .venv/bin/python benchmarks/viz_speed.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import gc
import io
import statistics
import time

from matplotlib.figure import Figure

from zbkit.schedules import Costs, build_schedule, simulate
from zbkit.widgets import ScheduleExplorer
from zbkit.widgets.schedule_explorer import _DPI

P, M = 8, 32
BUDGET_S = 0.200


def baseline_redraw(name: str, costs: Costs) -> bytes:
    """A straightforward Gantt chart: a Rectangle artist and a text per action."""
    sim = simulate(build_schedule(name, pp=P, microbatches=M), costs, check=False)
    fig = Figure(figsize=(11, 0.9 + 0.42 * P))
    ax = fig.add_subplot()
    colors = {"F": "tab:blue", "I": "tab:cyan", "W": "tab:green", "B": "tab:purple"}
    for e in sim.events:
        ax.barh(e.rank, e.end - e.start, left=e.start, color=colors[e.kind], edgecolor="white")
        ax.text((e.start + e.end) / 2, e.rank, str(e.microbatch), ha="center", fontsize=6)
    ax.invert_yaxis()
    ax.set_title(f"{name} bubble {sim.bubble_rate:.1%}")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI)
    return buf.getvalue()


def _median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1e3


def _timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process): on a busy machine the CPU time is what
    the redraw would take on an idle core; the wall time is what this machine gave."""
    gc.collect()  # collect the previous figures now, not inside the next timed call
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    explorer = ScheduleExplorer("zb-h1", pp=P, microbatches=M)
    f_slider = explorer.controls["F"]
    print(f"ScheduleExplorer redraw, p={P}, m={M}, {args.repeats} paired runs, medians in ms")
    print("  cost: a cost slider moved (schedule reused, re-simulated, redrawn)")
    print("  rebuild: the schedule built from scratch too (as after a pp or m change)")
    print("  baseline: a naive barh-per-action chart of the same simulation, same dpi")
    print("  wall / cpu: elapsed time / this process's CPU time (the machine may be shared)")
    print(
        f"{'schedule':<9}{'cost wall':>10}{'cpu':>7}{'rebuild wall':>13}{'cpu':>7}"
        f"{'baseline wall':>14}{'cpu':>7}{'ratio (cpu)':>12}"
    )
    worst = 0.0
    for name in ("1f1b", "zb-h1", "zb-h2", "zb-v", "zb-auto"):
        explorer.controls["schedule"].value = name  # warm-up draw for this name
        baseline_redraw(name, explorer.costs())
        runs: dict[str, list[tuple[float, float]]] = {"cost": [], "rebuild": [], "base": []}
        for i in range(args.repeats):
            # F cycles through 1.1 .. 1.4: every set is a change, so every run really redraws
            runs["cost"].append(
                _timed(lambda i=i: setattr(f_slider, "value", 1.1 + 0.1 * (2 * i % 4)))
            )
            explorer._built.clear()  # forget built schedules: the next redraw rebuilds
            runs["rebuild"].append(
                _timed(lambda i=i: setattr(f_slider, "value", 1.1 + 0.1 * ((2 * i + 1) % 4)))
            )
            runs["base"].append(_timed(lambda n=name: baseline_redraw(n, explorer.costs())))
        med = {
            k: (_median_ms([w for w, _ in v]), _median_ms([c for _, c in v]))
            for k, v in runs.items()
        }
        worst = max(worst, med["cost"][1], med["rebuild"][1])
        print(
            f"{name:<9}{med['cost'][0]:>10.1f}{med['cost'][1]:>7.1f}"
            f"{med['rebuild'][0]:>13.1f}{med['rebuild'][1]:>7.1f}"
            f"{med['base'][0]:>14.1f}{med['base'][1]:>7.1f}"
            f"{med['cost'][1] / med['base'][1]:>12.2f}"
        )
    verdict = "within" if worst < BUDGET_S * 1e3 else "OVER"
    print(f"worst median CPU time of a redraw: {worst:.1f} ms ({verdict} the 200 ms budget)")


if __name__ == "__main__":
    main()
