"""The demo's self-contained HTML report: one ``index.html`` with every image inside it.

The tables of the terminal (``_report``), the split stage's groups and graph (inline SVG),
then a section per schedule: each run drawn over its simulation (inline PNG), the stage costs
the simulation used, and the run's Chrome trace written beside the page.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import graphviz

from zbkit.demo._report import (
    REAL_HEADER,
    SPEEDUP_HEADER,
    Run,
    format_bytes,
    format_counts,
    real_rows,
    speedup_rows,
)
from zbkit.schedules.core.action import PARTS
from zbkit.schedules.core.costs import per_stage

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
    costs = per_stage(real.sim.costs, real.schedule.stage_to_rank)  # as simulated: one per stage
    ms = [[s, *(f"{getattr(c, k) * 1e3:.3f}" for k in PARTS)] for s, c in enumerate(costs)]
    chrome = f"trace-{real.name}.json"
    real.trace.to_chrome(out / chrome)  # every rank's actions, waits and memory, for Perfetto
    parts += [
        f"<p>The real transformer: step {real.step * 1e3:.1f} ms (median over rounds), simulated "
        f"{real.sim.makespan * 1e3:.1f} ms; bubble rate {real.bubble:.1%} measured, "
        f"{real.sim.bubble_rate:.1%} simulated. Peak activations held per rank "
        f"({real.unit}) {format_counts(real.peaks)}, simulated "
        f"{format_counts(real.sim.peak_memory)}; in bytes {format_bytes(real.trace.peak_bytes)}. "
        f"Largest gradient difference from one process: {real.grad_diff:.2e}.</p>",
        _figure(real, f"{real.name}, the real transformer"),
        "<p class=note>The simulation's costs for the real run: each stage's F, I, W (ms), "
        f"from the blocks measured once in one process, and a hop of "
        f"{costs[0].comm * 1e3:.2f} ms between ranks.</p>",
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
        "Peak held: activations held between F and I (or B), per rank, counted in "
        "rank-microbatches (one microbatch through all of a rank's blocks; a zb-v chunk holds "
        "half of one, so ZB-V's peak compares with 1F1B's as it is); bytes: what autograd "
        "saved for them. Step: the slowest rank's, median over rounds.</p>",
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
