"""The demo's numbers from measured traces, and its self-contained HTML report.

A measured trace and a simulation have the same events ``(rank, stage, kind, microbatch,
start, end)``, so everything here reads both the same way. A comparison of schedules uses one
cost set: each block's F, I and W measured once (``zbkit.schedules.measure``), summed per
stage of each schedule (``stage_costs``), and one hop latency pooled over every run
(``compare``); so the simulated speed-ups compare like with like, and so do the measured ones
set beside them (``speedup_rows``).
"""

from __future__ import annotations

import base64
import html
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import graphviz
import torch

from zbkit.pipeline import Trace
from zbkit.schedules import Costs, Schedule, Simulation, bubble_rate, simulate
from zbkit.schedules.action import PARTS
from zbkit.schedules.measure import hop_latency, measured_costs


def grad_difference(per_rank: Sequence[dict], expected: dict[str, torch.Tensor]) -> float:
    """Largest |pipeline - one process| over every parameter; inf if one is missing or extra.

    ``per_rank``: each rank's ``{parameter name: grad or None}`` for the stages it holds.
    """
    worst, seen = 0.0, set()
    for grads in per_rank:
        for name, got in grads.items():
            seen.add(name)
            want = expected.get(name)
            if (got is None) != (want is None):
                return float("inf")
            if got is not None:
                worst = max(worst, (got - want).abs().max().item())
    return worst if seen == set(expected) else float("inf")


# ---------------------------------------------------------------------- one cost set
def stage_costs(
    block_costs: Sequence[Costs], spans: Sequence[tuple[int, int]], scale: float = 1.0
) -> list[Costs]:
    """Per stage: the sum of its blocks' F, I and W (``spans``: blocks ``(first, last)`` per
    stage), times ``scale``. Every schedule of a comparison gets its stages' costs from the
    same measured blocks, so a 1f1b stage of two blocks costs what two zb-v chunks cost."""
    out = []
    for first, last in spans:
        mine = block_costs[first:last]
        out.append(Costs(**{p: scale * sum(getattr(c, p) for c in mine) for p in PARTS}))
    return out


# ---------------------------------------------------------------------- one schedule's numbers
@dataclass
class Run:
    """What one schedule did on the ranks, beside its simulation with the comparison's costs."""

    name: str
    schedule: Schedule
    step: float  # seconds: median over rounds of the slowest rank's step
    trace: Trace  # the round with the median makespan, every rank merged
    sim: Simulation  # the schedule simulated with the comparison's costs and hop
    grad_diff: float | None = None  # largest |pipeline - one process| (real stages only)

    @property
    def bubble(self) -> float:
        return bubble_rate(self.trace.events)

    @property
    def unit(self) -> str:
        """What the memory counts count: a microbatch's activations of one stage, or of one
        chunk when a rank holds several stages (zb-v: 2 chunks, each half a stage)."""
        v = self.schedule.stages_per_rank
        return "microbatches" if v == 1 else f"microbatch-chunks (1/{v} stage each)"


def compare(
    schedules: dict[str, Schedule],
    runs: dict[str, Sequence[dict]],
    costs: dict[str, list[Costs]],
    expected: dict[str, torch.Tensor] | None = None,
) -> tuple[list[Run], float]:
    """Every schedule's run beside its simulation with ``costs[name]`` (one measured cost set
    for all) and one hop latency: the median over every schedule's measured rounds.

    ``runs[name]``: every rank's ``{"times", "traces", "grads"?}`` (traces on rank 0, one per
    round). Returns the runs and the hop latency (seconds).
    """
    hops = [hop_latency(t.events) for per_rank in runs.values() for t in per_rank[0]["traces"]]
    comm = statistics.median(hops) if hops else 0.0
    out = []
    for name, per_rank in runs.items():
        traces: list[Trace] = per_rank[0]["traces"]
        rounds = zip(*(r["times"] for r in per_rank), strict=True)  # per round: every rank
        step = statistics.median(max(times) for times in rounds)
        spans = [t.makespan for t in traces]
        typical = traces[spans.index(sorted(spans)[len(spans) // 2])]
        sim = simulate(schedules[name], [replace(c, comm=comm) for c in costs[name]])
        diff = None
        if expected is not None:
            diff = grad_difference([r["grads"] for r in per_rank], expected)
        out.append(Run(name, schedules[name], step, typical, sim, diff))
    return out, comm


def slowdown(runs: Sequence[Run], costs: dict[str, list[Costs]]) -> float:
    """How much longer the runs' actions took than the costs say, median over schedules: the
    sum over stages of measured median F + I + W over that of ``costs``."""
    ratios = []
    for r in runs:
        measured = measured_costs(r.trace.events, r.schedule.num_stages)
        work = sum(c.F + c.I + c.W for c in costs[r.name])
        ratios.append(sum(c.F + c.I + c.W for c in measured) / work if work else 1.0)
    return statistics.median(ratios)


# ---------------------------------------------------------------------- the tables
SPEEDUP_HEADER = ("schedule", "step ms", "sim ms", "speed-up run", "speed-up sim", "run / sim",
                  "bubble run", "bubble sim")  # fmt: skip
REAL_HEADER = ("schedule", "step ms", "sim ms", "bubble run", "bubble sim", "peak held run | sim",
               "held in", "peak act. bytes", "max grad diff")  # fmt: skip


def _counts(xs: Iterable[float]) -> str:
    return " ".join(f"{x:g}" for x in xs)


def format_bytes(values: Sequence[int]) -> str:
    """Per rank, one unit for all: '1.21 0.93 0.61 0.30 MiB'."""
    unit, div = ("MiB", 2**20) if max(values, default=0) >= 2**20 else ("KiB", 2**10)
    return " ".join(f"{v / div:.{2 if unit == 'MiB' else 1}f}" for v in values) + f" {unit}"


def speedup_rows(runs: Sequence[Run], baseline: str) -> list[list[str]]:
    """Step time and speed-up over ``baseline``, measured and simulated with the same costs,
    and their ratio (1.00: the run gains exactly what the simulation says)."""
    base = next(r for r in runs if r.name == baseline)
    rows = []
    for r in runs:
        run, sim = base.step / r.step, base.sim.makespan / r.sim.makespan
        rows.append([r.name, f"{r.step * 1e3:.1f}", f"{r.sim.makespan * 1e3:.1f}",
                     f"{run:.2f}x", f"{sim:.2f}x", f"{run / sim:.2f}",
                     f"{r.bubble:.1%}", f"{r.sim.bubble_rate:.1%}"])  # fmt: skip
    return rows


def real_rows(runs: Sequence[Run]) -> list[list[str]]:
    """Step time, bubbles, memory (counts in the schedule's units, and bytes), gradients."""
    return [
        [
            r.name,
            f"{r.step * 1e3:.1f}",
            f"{r.sim.makespan * 1e3:.1f}",
            f"{r.bubble:.1%}",
            f"{r.sim.bubble_rate:.1%}",
            f"{_counts(r.trace.peak_memory)} | {_counts(r.sim.peak_memory)}",
            r.unit,
            format_bytes(r.trace.peak_bytes),
            f"{r.grad_diff:.2e}",
        ]  # fmt: skip
        for r in runs
    ]


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Aligned plain-text table: the first column left, the numbers right."""
    table = [header, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        )
        for r in table
    )


class Progress:
    """A text progress bar on stderr: redrawn in place on a terminal, one line per step else."""

    def __init__(self, total: int, width: int = 24) -> None:
        self.total, self.done, self.width = total, 0, width
        self.tty = sys.stderr.isatty()
        self.t0 = time.perf_counter()

    def step(self, what: str) -> None:
        self.done += 1
        filled = self.width * self.done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        line = f"[{bar}] {self.done}/{self.total} {what} ({time.perf_counter() - self.t0:.1f} s)"
        end = "\n" if not self.tty or self.done == self.total else ""
        print(("\r\033[K" if self.tty else "") + line, end=end, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- the HTML report
_CSS = """
body { font-family: system-ui, sans-serif; max-width: 1250px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; margin: 0.6em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
img, svg { max-width: 100%; height: auto; }
.note { color: #555; font-size: 0.9em; }
"""


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def inline_svg(svg: str) -> str:
    """An SVG document as an element to paste into HTML (no XML prolog or doctype)."""
    start = svg.find("<svg")
    if start < 0:
        raise ValueError("not an SVG document: no <svg element found")
    return svg[start:]


def _graph_html(graph: graphviz.Digraph) -> str:
    try:
        return inline_svg(graph.pipe(format="svg", encoding="utf-8"))
    except graphviz.ExecutableNotFound:  # the source still shows the graph's structure
        return (
            "<p class=note>Graphviz's <code>dot</code> was not found, so here is the DOT source "
            "(paste it into https://dreampuf.github.io/GraphvizOnline).</p>"
            f"<pre>{html.escape(graph.source)}</pre>"
        )


def _figure(run: Run, title: str) -> str:
    from zbkit import viz  # only the report draws

    fig = viz.plot_schedule(run.trace, simulation=run.sim, title=title, unit="seconds")
    png = base64.b64encode(fig.to_png()).decode("ascii")
    alt = html.escape(f"{title}: each rank measured (run) above its simulation (sim)")
    return f'<img alt="{alt}" src="data:image/png;base64,{png}">'


def _section(real: Run, timed: Run | None, out: Path) -> list[str]:
    name = html.escape(real.name)
    parts = [f"<h2 id={name}>{name}</h2>"]
    if timed is not None:
        parts += [
            f"<p>Timed with synthetic stages: step {timed.step * 1e3:.1f} ms, simulated "
            f"{timed.sim.makespan * 1e3:.1f} ms; bubble rate {timed.bubble:.1%} measured, "
            f"{timed.sim.bubble_rate:.1%} simulated.</p>",
            _figure(timed, f"{real.name}, synthetic stages"),
        ]
    ms = [[s, *(f"{getattr(c, k) * 1e3:.3f}" for k in PARTS)] for s, c in enumerate(real.sim.costs)]
    chrome = f"trace-{real.name}.json"
    real.trace.to_chrome(out / chrome)  # every rank's actions, waits and memory, for Perfetto
    parts += [
        f"<p>The real transformer: step {real.step * 1e3:.1f} ms (median over rounds), simulated "
        f"{real.sim.makespan * 1e3:.1f} ms; bubble rate {real.bubble:.1%} measured, "
        f"{real.sim.bubble_rate:.1%} simulated. Peak activations held per rank "
        f"({real.unit}) {_counts(real.trace.peak_memory)}, simulated "
        f"{_counts(real.sim.peak_memory)}; in bytes {format_bytes(real.trace.peak_bytes)}. "
        f"Largest gradient difference from one process: {real.grad_diff:.2e}.</p>",
        _figure(real, f"{real.name}, the real transformer"),
        "<p class=note>The simulation's costs for the real run: each stage's F, I, W (ms), "
        f"from the blocks measured once in one process, and a hop of "
        f"{real.sim.costs[0].comm * 1e3:.2f} ms between ranks.</p>",
        _table(["stage", "F", "I", "W"], ms),
        f'<p class=note>The real run\'s drawn round as a Chrome trace: <a href="{chrome}">{chrome}'
        "</a> (open it in https://ui.perfetto.dev).</p>",
    ]
    return parts


def write_report(
    out: Path,
    *,
    title: str,
    intro: Sequence[str],
    real: Sequence[Run],
    timed: Sequence[Run] | None,
    baseline: str,
    analysis_text: str,
    graph: graphviz.Digraph,
) -> Path:
    """Writes ``out/index.html``, every image inside it, and returns its path.

    ``timed``: the synthetic runs, or None when the real runs are the timed ones.
    """
    out.mkdir(parents=True, exist_ok=True)
    parts = [
        f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        *(f"<p>{html.escape(line)}</p>" for line in intro),
        f"<h2>Speed-up over {html.escape(baseline)}, measured and simulated with the same costs"
        "</h2>",
        _table(SPEEDUP_HEADER, speedup_rows(timed or real, baseline)),
        "<h2>The real transformer on the ranks</h2>",
        _table(REAL_HEADER, real_rows(real)),
        "<p class=note>Bubble rate, run and sim alike: (longest rank span - busiest rank's "
        "busy time) / longest rank span, the simulator's formula (zbkit.schedules.bubble_rate). "
        "Peak held: activations held between F and I (or B), per rank, counted in microbatches "
        "of one stage, or of one chunk where a rank holds several stages (zb-v: two chunks, each "
        "half a stage, so 8 chunks hold about what 4 whole-stage microbatches hold); bytes: "
        "what autograd saved for them. Step: the slowest rank's, median over rounds.</p>",
        "<h2>A stage's backward, split</h2>",
        "<p>I (the input gradient, which the previous stage waits for) runs the ops in the "
        "input closure; each parameter group's W starts at its marked split point and can "
        "wait for a bubble. The graph is collapsed to one box per module.</p>",
        f"<pre>{html.escape(analysis_text)}</pre>",
        _graph_html(graph),
    ]
    by_name = {r.name: r for r in timed or []}
    for r in real:
        parts += _section(r, by_name.get(r.name), out)
    parts.append("</body></html>\n")
    path = out / "index.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
