"""Pipeline schedules as pictures: one row per rank, boxes for F / I / W / B, bubbles hatched.

`plot_schedule` takes a `Simulation` (from `zbkit.schedules.simulate`), a measured trace
(`runner.trace`), or a plain list of events `(rank, stage, kind, microbatch, start, end)`, and
returns a `Figure`; nothing goes through pyplot. What it shades is computed in `_gantt`:
hatched = idle inside the rank's span (what the bubble rate counts), plain light grey = before
the rank's first action or after its last. `plot_memory` lives in `memory_plot`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

import matplotlib
from matplotlib.collections import PolyCollection
from matplotlib.font_manager import FontProperties
from matplotlib.legend_handler import HandlerTuple
from matplotlib.patches import Patch
from matplotlib.textpath import TextToPath

from zbkit.schedules import KINDS
from zbkit.viz._colors import COMM_COLOR, EDGE_COLOR, IDLE_COLOR, chunk_color, kind_color
from zbkit.viz._figure import DPI, ZbFigure, check_ranks
from zbkit.viz._gantt import box_texts, chunks, idle_gaps, pair_spans, text_color
from zbkit.viz.memory_plot import plot_memory  # noqa: F401 - its old home, still importable
from zbkit.viz.timeline import Timeline, timeline

_FONT_SIZE = 8  # box labels, in points
_PAD_PX = 2.5  # clear space each side of a label: neighbours' labels never run together
_LINE_PX = 1.2 * _FONT_SIZE * DPI / 72  # one line of a label, with its leading
_BOX_HALF = 0.38  # half a box's height, in rows


@lru_cache(maxsize=256)
def _char_px(char: str, family: tuple[str, ...]) -> float:
    """Width of one character of a box label, in pixels, in the font that will draw it."""
    width, _, _ = TextToPath().get_text_width_height_descent(
        char, FontProperties(family=list(family), size=_FONT_SIZE), ismath=False
    )
    return width * DPI / 72  # points -> pixels


def _fits(text: str, width_px: float, height_px: float) -> bool:
    lines = text.split("\n")
    family = tuple(matplotlib.rcParams["font.family"])
    widest = max(sum(_char_px(ch, family) for ch in line) for line in lines)
    return widest + 2 * _PAD_PX <= width_px and len(lines) * _LINE_PX <= height_px


def _describe(source: Any) -> str:
    """'zb-h1, pp=4, m=8' when the source knows its schedule, else ''."""
    schedule = getattr(source, "schedule", None)
    if schedule is None:
        return ""
    parts = [str(getattr(schedule, "name", "") or "")]
    k = getattr(source, "iterations", 1)  # a Simulation of k iterations: m per iteration
    for attr, short in (("pp", "pp"), ("microbatches", "m")):
        if getattr(schedule, attr, None) is not None:
            value = getattr(schedule, attr)
            parts.append(f"{short}={value // k if short == 'm' else value}")
    if k > 1:
        sync = "optimizer synced" if source.optimizer_sync else "no optimizer sync"
        parts.append(f"x {k} iterations, {sync}, throughput {source.throughput:.4g}")
    return ", ".join(p for p in parts if p)


def _numbers(t: Timeline) -> str:
    return f"makespan {t.makespan:.4g}, bubble {t.bubble_rate:.1%}"


def _rects(spans: list[tuple[float, float]], y: float, half: float) -> list[list[tuple]]:
    return [[(a, y - half), (b, y - half), (b, y + half), (a, y + half)] for a, b in spans]


def _chunk_legend(
    chunk_of: dict[tuple[int, int], int], n: int, kinds: list[str]
) -> tuple[list[tuple[Patch, ...]], list[str]]:
    """Per chunk, its kinds' colours side by side and its stages: 'chunk 1: stages 4-7'."""
    handles, labels = [], []
    for c in range(n):
        stages = sorted({s for (_, s), i in chunk_of.items() if i == c})
        held = f"{stages[0]}-{stages[-1]}" if len(stages) > 1 else f"{stages[0]}"
        handles.append(tuple(Patch(facecolor=chunk_color(k, c, n)) for k in kinds))
        labels.append(f"chunk {c}: stages {held}")
    return handles, labels


@dataclass
class _Layers:
    """What one figure draws, layer by layer (bottom to top), as PolyCollection vertices."""

    edges: list[list[tuple]] = field(default_factory=list)  # before first / after last
    idle: list[list[tuple]] = field(default_factory=list)  # bubbles inside a rank's span
    boxes: list[list[tuple]] = field(default_factory=list)  # one per action
    colors: list[str] = field(default_factory=list)  # the boxes' fills
    waits: list[list[tuple]] = field(default_factory=list)  # waits on receives (comm=True)
    pairs: list[list[tuple]] = field(default_factory=list)  # around an overlapped pair
    simulated: list[list[tuple]] = field(default_factory=list)  # overlay outlines


def plot_schedule(
    simulation_or_trace: Any,
    *,
    simulation: Any = None,
    compare: Literal["rows", "overlay"] = "rows",
    ranks: list[int] | None = None,
    title: str | None = None,
    labels: bool = True,
    comm: bool = False,
    width: float = 9.0,
    unit: str = "time",
) -> ZbFigure:
    """Draw a schedule's events: one row per rank, idle time shaded, numbers in the title.

    Args:
        simulation_or_trace: a Simulation, a runner trace, or a list of events.
        simulation: a Simulation to compare a measured trace with: either two aligned rows per
            rank (`compare="rows"`, the run above its simulation) or the simulated boxes drawn as
            outlines over the measured ones (`compare="overlay"`).
        ranks: the ranks to show (all by default).
        labels: write `stage kind microbatch` (e.g. `1I3`) in boxes wide enough for it.
        comm: under each row, a thin bar where the rank waited on a receive of its plan
            (`Trace.comm` measured, `Simulation.comm` modelled).
    """
    if compare not in ("rows", "overlay"):
        raise ValueError(f"compare={compare!r}; use 'rows' or 'overlay'")
    main = timeline(simulation_or_trace)
    ref = timeline(simulation, num_ranks=main.num_ranks) if simulation is not None else None
    shown = check_ranks(ranks, max(main.num_ranks, ref.num_ranks if ref else 0))
    rows = _rows(shown, main, ref if compare == "rows" else None, ref)
    span = max(main.makespan, ref.makespan if ref else 0.0)
    fig, ax, px_per_unit, box_px = _figure(len(rows), width, span)
    # several stages per rank (zb-v, interleaved): chunk 0 in the kind's colour, the last dark
    chunk_of = chunks([*main.events, *(ref.events if ref else [])])
    num_chunks = max(chunk_of.values(), default=0) + 1

    layers = _Layers()
    for y, (_, rank, t, overlay) in enumerate(rows):
        inside, outside = idle_gaps(t.events, rank, span)
        layers.idle += _rects(inside, y, 0.45)
        layers.edges += _rects(outside, y, 0.45)
        if comm:
            layers.waits += _waits(t, rank, y)
        events = [e for e in t.events if e.rank == rank]
        fills = [chunk_color(e.kind, chunk_of[rank, e.stage], num_chunks) for e in events]
        layers.boxes += _rects([(e.start, e.end) for e in events], y, _BOX_HALF)
        layers.colors += fills
        layers.pairs += _rects(pair_spans(events), y, _BOX_HALF)
        if overlay is not None:
            theirs = [(e.start, e.end) for e in overlay.events if e.rank == rank]
            layers.simulated += _rects(theirs, y, 0.44)
        if labels:
            _label_boxes(ax, events, fills, y, px_per_unit, box_px)
    _draw(ax, layers)
    _axes(ax, [label for label, *_ in rows], span, unit)
    overlaid = ref is not None and compare == "overlay"
    _legend(ax, [main, *([ref] if ref else [])], chunk_of, num_chunks, layers, overlaid)
    numbers = _title(ax, title, main, ref)
    fig._zb_summary = f"schedule of {len(shown)} ranks, {numbers}"
    return fig


def _figure(rows: int, width: float, span: float) -> tuple[ZbFigure, Any, float, float]:
    """The figure, its axes, and how many pixels a time unit and a box's height take."""
    height = 0.9 + 0.42 * rows
    fig = ZbFigure(figsize=(width, height), dpi=DPI)
    ax = fig.add_axes((0.09, 0.5 / height + 0.05 / height, 0.89, 1 - 1.05 / height))
    px_per_unit = (0.89 * width * DPI) / span if span > 0 else 0.0
    box_px = 2 * _BOX_HALF * (height - 1.05) * DPI / rows  # a box's height in pixels
    return fig, ax, px_per_unit, box_px


def _rows(
    shown: list[int], main: Timeline, beside: Timeline | None, ref: Timeline | None
) -> list[tuple[str, int, Timeline, Timeline | None]]:
    """(tick label, rank, timeline, timeline drawn as outlines over it or None) per row: a
    reference `beside` the run gets rows of its own, else `ref` is an overlay."""
    rows: list[tuple[str, int, Timeline, Timeline | None]] = []
    for r in shown:
        if beside is not None:
            rows += [(f"rank {r} run", r, main, None), (f"rank {r} sim", r, beside, None)]
        else:
            rows.append((f"rank {r}", r, main, ref))
    return rows


def _waits(t: Timeline, rank: int, y: float) -> list[list[tuple]]:
    """The plan's waits on receives, on the timeline's clock: a thin bar under the row."""
    bars = []
    for c in getattr(t.source, "comm", None) or []:
        if c.rank == rank and c.end > c.start:
            a, b = c.start - t.t0, c.end - t.t0
            bars.append([(a, y + 0.39), (b, y + 0.39), (b, y + 0.45), (a, y + 0.45)])
    return bars


def _label_boxes(
    ax: Any, events: list[Any], fills: list[str], y: float, px_per_unit: float, box_px: float
) -> None:
    """`1I3` (or a shorter form) in each box wide enough for it."""
    for e, fill in zip(events, fills, strict=True):
        # measured as if the kind were W, the widest letter: boxes of one width all
        # say the same (not `5F` over `3` beside a bare `W` over `3`)
        room = (e.end - e.start) * px_per_unit
        texts = box_texts(e)
        text = next((t for t in texts if _fits(t.replace(e.kind, "W"), room, box_px)), "")
        if text:
            ax.text(
                (e.start + e.end) / 2,
                y,
                text,
                ha="center",
                va="center",
                fontsize=_FONT_SIZE,
                color=text_color(fill),
            )


def _draw(ax: Any, layers: _Layers) -> None:
    """The layers, bottom to top; each a PolyCollection with a `gid` tests and tools find."""
    ax.add_collection(
        PolyCollection(layers.edges, facecolors=EDGE_COLOR, edgecolors="none", gid="edges")
    )
    ax.add_collection(
        PolyCollection(
            layers.idle,
            facecolors=IDLE_COLOR,
            edgecolors="#bbbbbb",
            hatch="//",
            gid="idle",
            linewidths=0,
        )
    )
    ax.add_collection(
        PolyCollection(
            layers.boxes,
            facecolors=layers.colors,
            edgecolors="white",
            linewidths=0.5,
            gid="actions",
        )
    )
    if layers.waits:
        ax.add_collection(
            PolyCollection(layers.waits, facecolors=COMM_COLOR, edgecolors="none", gid="comm")
        )
    if layers.pairs:  # an overlapped pair is one action: one box around its two halves
        ax.add_collection(
            PolyCollection(
                layers.pairs, facecolors="none", edgecolors="#222222", linewidths=1.6, gid="pairs"
            )
        )
    if layers.simulated:
        ax.add_collection(
            PolyCollection(
                layers.simulated,
                facecolors="none",
                edgecolors="#111111",
                linewidths=1.4,
                linestyles=(0, (4, 2)),
                zorder=3,  # over the measured boxes, not hidden by them
                gid="simulated",
            )
        )


def _axes(ax: Any, row_labels: list[str], span: float, unit: str) -> None:
    ax.set_xlim(0, span * 1.005 if span > 0 else 1)
    ax.set_ylim(len(row_labels) - 0.5, -0.5)  # rank 0 on top, like the paper's figures
    ax.set_yticks(range(len(row_labels)), row_labels, fontsize=8)
    ax.set_xlabel(unit, fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _legend(
    ax: Any,
    drawn: list[Timeline],
    chunk_of: dict[tuple[int, int], int],
    num_chunks: int,
    layers: _Layers,
    overlaid: bool,
) -> None:
    """Above the plot, right: the kinds drawn (the table's order), the chunks, then each
    layer that is there (`overlaid`: a simulation drawn as outlines)."""
    present = {e.kind for t in drawn for e in t.events}
    kinds = [k for k in KINDS.values() if k.letter in present]
    handles: list[Any] = [Patch(facecolor=kind_color(k.letter)) for k in kinds]
    names = [f"{k.letter}: {k.name}" for k in kinds]
    if num_chunks > 1:
        more, more_names = _chunk_legend(chunk_of, num_chunks, [k.letter for k in kinds])
        handles, names = handles + more, names + more_names
    handles.append(Patch(facecolor=IDLE_COLOR, edgecolor="#bbbbbb", hatch="//"))
    names.append("idle (bubble)")
    handles.append(Patch(facecolor=EDGE_COLOR, edgecolor="#cccccc"))
    names.append("before first / after last action")
    if layers.waits:
        handles.append(Patch(facecolor=COMM_COLOR))
        names.append("waiting on a receive")
    if layers.pairs:
        handles.append(Patch(facecolor="none", edgecolor="#222222", lw=1.6))
        names.append("overlapped F+B pair")
    if overlaid:
        handles.append(Patch(facecolor="none", edgecolor="#111111", ls="--", lw=1.4))
        names.append("simulated")
    ax.legend(
        handles=handles,
        labels=names,
        handler_map={tuple: HandlerTuple(ndivide=None, pad=0.0)},  # a chunk: its kinds' colours
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        ncol=len(handles) if len(handles) <= 5 else -(-len(handles) // 2),  # one or two rows
        fontsize=7,
        frameon=False,
        handlelength=1.4,
        columnspacing=1.0,
    )


def _title(ax: Any, title: str | None, main: Timeline, ref: Timeline | None) -> str:
    """The schedule's name (and iterations) and its numbers; returns the numbers."""
    name = title if title is not None else _describe(main.source)
    numbers = _numbers(main) if ref is None else f"run: {_numbers(main)} | sim: {_numbers(ref)}"
    # lines short enough that the title never runs into the legend on its right: about 70
    # characters of 9-pt text beside the legend at 12 in, fewer on a narrower figure
    room = 70 * ax.figure.get_figwidth() / 12
    lines = [f"{name}   {numbers}" if name else numbers]
    if len(lines[0]) > room:
        lines = [name, numbers] if name else [numbers]
    if len(lines[-1]) > room and ref is not None:  # the run's numbers above the simulation's
        lines[-1:] = [f"run: {_numbers(main)}", f"sim: {_numbers(ref)}"]
    if len(lines) > 2:  # the figure's top margin holds two: grow it, the axes unchanged
        _grow_top(ax, 0.18 * (len(lines) - 2))
    ax.set_title("\n".join(lines), fontsize=9, loc="left", pad=14)
    return numbers


def _grow_top(ax: Any, inches: float) -> None:
    """Make the figure `inches` taller at the top, the axes keeping their size in inches."""
    fig = ax.figure
    old = fig.get_figheight()
    box = ax.get_position()
    fig.set_figheight(old + inches)
    scale = old / (old + inches)
    ax.set_position((box.x0, box.y0 * scale, box.width, box.height * scale))
