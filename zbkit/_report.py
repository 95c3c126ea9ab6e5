"""The demo's numbers from measured traces, and its self-contained HTML report.

A measured trace and a simulation have the same events ``(rank, stage, kind, microbatch,
start, end)``, so everything here reads both the same way:

- per stage, the median F, I and W a run took and the hop latency between ranks
  (``zbkit.schedules.measure``): what to simulate with;
"""

from __future__ import annotations

import base64
import html
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
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


# ---------------------------------------------------------------------- one schedule's numbers
HEADER = ("schedule", "step ms", "sim ms", "hop ms", "bubble sim", "bubble run",
          "peak act run | sim", "max grad diff")  # fmt: skip


@dataclass
class Result:
    """What one schedule did on the ranks, beside its simulation with the measured costs."""

    name: str
    step: float  # seconds: median over rounds of the slowest rank's step
    trace: Trace  # the round with the median makespan, every rank merged
    costs: list[Costs]  # per stage: medians over every measured round
    sim: Simulation
    grad_diff: float

    @property
    def bubble(self) -> float:
        return bubble_rate(self.trace.events)

    def row(self) -> list[str]:
        fmt = lambda xs: " ".join(f"{x:g}" for x in xs)  # noqa: E731
        return [
            self.name,
            f"{self.step * 1e3:.1f}",
            f"{self.sim.makespan * 1e3:.1f}",
            f"{self.costs[0].comm * 1e3:.2f}",
            f"{self.sim.bubble_rate:.1%}",
            f"{self.bubble:.1%}",
            f"{fmt(self.trace.peak_memory)} | {fmt(self.sim.peak_memory)}",
            f"{self.grad_diff:.2e}",
        ]


def summarise(
    name: str, schedule: Schedule, per_rank: Sequence[dict], expected: dict[str, torch.Tensor]
) -> Result:
    """From every rank's ``{"times", "grads", "traces"}`` (traces on rank 0: one per round)."""
    traces: list[Trace] = per_rank[0]["traces"]
    rounds = zip(*(r["times"] for r in per_rank), strict=True)  # per round: every rank's time
    step = statistics.median(max(times) for times in rounds)
    spans = [t.makespan for t in traces]
    typical = traces[spans.index(sorted(spans)[len(spans) // 2])]
    events = [e for t in traces for e in t.events]  # every round: steadier medians
    costs = measured_costs(events, schedule.num_stages, hop_latency(typical.events))
    sim = simulate(schedule, costs)
    diff = grad_difference([r["grads"] for r in per_rank], expected)
    return Result(name, step, typical, costs, sim, diff)


def format_table(rows: Sequence[Sequence[str]]) -> str:
    """Aligned plain-text table: the first column left, the numbers right."""
    table = [HEADER, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADER))]
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


def _section(r: Result, out: Path) -> list[str]:
    from zbkit import viz  # only the report draws

    fig = viz.plot_schedule(r.trace, simulation=r.sim, title=r.name, unit="seconds")
    png = base64.b64encode(fig.to_png()).decode("ascii")
    fmt = lambda xs: " ".join(f"{x:g}" for x in xs)  # noqa: E731
    ms = [[s, *(f"{getattr(c, k) * 1e3:.2f}" for k in PARTS)] for s, c in enumerate(r.costs)]
    name = html.escape(r.name)
    chrome = f"trace-{r.name}.json"
    r.trace.to_chrome(out / chrome)  # every rank's actions, waits and memory, for Perfetto
    return [
        f"<h2 id={name}>{name}</h2>",
        f"<p>Step {r.step * 1e3:.1f} ms (median over rounds); the drawn round's makespan "
        f"{r.trace.makespan * 1e3:.1f} ms, simulated {r.sim.makespan * 1e3:.1f} ms. Bubble rate "
        f"{r.bubble:.1%} measured, {r.sim.bubble_rate:.1%} simulated. Peak activations per rank "
        f"(microbatches held) {fmt(r.trace.peak_memory)}, simulated {fmt(r.sim.peak_memory)}. "
        f"Largest gradient difference from one process: {r.grad_diff:.2e}.</p>",
        f'<img alt="{name}: each rank measured (run) above its simulation (sim)" '
        f'src="data:image/png;base64,{png}">',
        f"<p class=note>The simulation's costs: median times per stage (ms) in this run, and "
        f"a hop of {r.costs[0].comm * 1e3:.2f} ms between ranks.</p>",
        _table(["stage", "F", "I", "W"], ms),
        f'<p class=note>The drawn round as a Chrome trace: <a href="{chrome}">{chrome}</a> '
        "(open it in https://ui.perfetto.dev).</p>",
    ]


def write_report(
    out: Path,
    *,
    title: str,
    intro: str,
    results: Sequence[Result],
    analysis_text: str,
    graph: graphviz.Digraph,
) -> Path:
    """Writes ``out/index.html``, every image inside it, and returns its path."""
    out.mkdir(parents=True, exist_ok=True)
    parts = [
        f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{html.escape(intro)}</p>",
        _table(HEADER, [r.row() for r in results]),
        "<p class=note>Bubble rate, run and sim alike: (longest rank span - busiest rank's "
        "busy time) / longest rank span, the simulator's formula (zbkit.schedules.bubble_rate). "
        "Peak activations: microbatches held "
        "between F and I (or B), per rank. Step: the slowest rank's, median over rounds.</p>",
        "<h2>A stage's backward, split</h2>",
        "<p>I (the input gradient, which the previous stage waits for) runs the ops in the "
        "input closure; each parameter group's W starts at its marked split point and can "
        "wait for a bubble.</p>",
        f"<pre>{html.escape(analysis_text)}</pre>",
        _graph_html(graph),
    ]
    for r in results:
        parts += _section(r, out)
    parts.append("</body></html>\n")
    path = out / "index.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
