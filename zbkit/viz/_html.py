"""Rich notebook displays of a Schedule, a Simulation and a Trace: the grid, coloured by kind.

The rank-by-step grid (what `print(schedule)` shows) as an HTML table, each cell coloured like
the drawings (`_colors.py`), with the key numbers above it: bubble rate, makespan, peak memory.
Plain strings, no matplotlib: `Simulation._repr_html_` and `Trace._repr_html_` import this
module inside the method, so the core install pays nothing until a notebook asks.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from zbkit._display import renders
from zbkit.schedules.core.costs import MEMORY_UNIT
from zbkit.viz._colors import kind_color

__all__ = ["schedule_html", "simulation_html", "trace_html"]

MAX_STEPS = 128  # per rank; a longer program is cut, and the table says how much is left
_CELL = "padding:1px 4px;font-family:monospace;font-size:11px;text-align:center"


def _cell(text: str, kinds: Sequence[str]) -> str:
    """One grid cell; an item of several actions (an overlapped pair) gets each colour."""
    colors = [kind_color(k) for k in kinds] or ["#ffffff"]
    if len(colors) == 1:
        background = f"background:{colors[0]}"
    else:  # side by side, as the pair runs at once
        stops = ",".join(
            f"{c} {100 * i // len(colors)}% {100 * (i + 1) // len(colors)}%"
            for i, c in enumerate(colors)
        )
        background = f"background:linear-gradient(90deg,{stops})"
    return f"<td style='{_CELL};{background}'>{html.escape(text)}</td>"


def _grid(rows: dict[int, list[tuple[str, Sequence[str]]]]) -> str:
    """rank -> [(cell text, kinds)] in order -> an HTML table, rank 0 on top."""
    width = min(max((len(r) for r in rows.values()), default=0), MAX_STEPS)
    head = "".join(f"<th style='{_CELL}'>{s}</th>" for s in range(width))
    body = []
    for rank in sorted(rows):
        items = rows[rank]
        cells = "".join(_cell(text, kinds) for text, kinds in items[:MAX_STEPS])
        if len(items) > MAX_STEPS:
            cells += f"<td style='{_CELL}'>+{len(items) - MAX_STEPS} more</td>"
        body.append(f"<tr><th style='{_CELL}'>rank {rank}</th>{cells}</tr>")
    return (
        "<table class='zb-grid' style='border-collapse:collapse'>"
        f"<tr><th style='{_CELL}'>step</th>{head}</tr>{''.join(body)}</table>"
    )


def _numbers(items: list[tuple[str, str]]) -> str:
    return "<p>" + "; ".join(f"{html.escape(k)} <b>{html.escape(v)}</b>" for k, v in items) + "</p>"


def _fmt(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.4g}" for v in values)


def _schedule_rows(schedule: Any) -> dict[int, list[tuple[str, Sequence[str]]]]:
    rows: dict[int, list[tuple[str, Sequence[str]]]] = {}
    for rank in range(schedule.pp):
        rows[rank] = [
            (str(item), [h.kind for h in getattr(item, "halves", (item,))])
            for item in schedule.program.get(rank, [])
        ]
    return rows


def _title(schedule: Any) -> str:
    return (
        f"<b>{html.escape(str(schedule.name or 'schedule'))}</b>, pp={schedule.pp}, "
        f"m={schedule.microbatches}, {schedule.num_stages} stages"
    )


@renders("Schedule")
def schedule_html(schedule: Any) -> str:
    """The schedule's grid (one row per rank, one column per step), kinds coloured."""
    return (
        f"<div class='zb-schedule'><p>{_title(schedule)}</p>{_grid(_schedule_rows(schedule))}</div>"
    )


@renders("Simulation")
def simulation_html(sim: Any) -> str:
    """The simulation's numbers (bubble rate, makespan, peak memory per rank) over its grid."""
    numbers = _numbers(
        [
            ("bubble rate", f"{sim.bubble_rate:.2%}"),
            ("makespan", f"{sim.makespan:.4g}"),
            (f"peak memory per rank ({MEMORY_UNIT})", _fmt(sim.peak_memory)),
        ]
    )
    grid = _grid(_schedule_rows(sim.schedule))
    return (
        f"<div class='zb-simulation'><p>simulated {_title(sim.schedule)}</p>{numbers}{grid}</div>"
    )


@renders("Trace")
def trace_html(trace: Any) -> str:
    """A measured run: its numbers over the grid of what each rank ran, in time order."""
    rows: dict[int, list[tuple[str, Sequence[str]]]] = {}
    for e in sorted(trace.events, key=lambda e: (e.rank, e.start)):
        rows.setdefault(e.rank, []).append((e.label, [e.kind]))
    units = f" {MEMORY_UNIT}" if trace.costs is None else ""
    numbers = _numbers(
        [
            ("bubble rate", f"{trace.bubble_rate:.2%}"),
            ("makespan", f"{trace.makespan:.4g} s"),
            ("peak memory per rank", _fmt(trace.peak_memory) + units),
        ]
    )
    head = f"<p>measured run: {len(rows)} ranks, {len(trace.events)} actions</p>"
    return f"<div class='zb-trace'>{head}{numbers}{_grid(rows)}</div>"
