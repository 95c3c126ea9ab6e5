"""Pipeline schedules as pictures: one row per rank, boxes for F / I / W / B, bubbles shaded.

Both functions take a `Simulation` (from `zbkit.schedules.simulate`), a measured trace
(`runner.trace`), or a plain list of events `(rank, stage, kind, microbatch, start, end)`, and
return a `Figure`; nothing goes through pyplot.
"""

from __future__ import annotations

from typing import Any, Literal

from matplotlib.collections import PolyCollection
from matplotlib.patches import Patch

from zbkit.schedules import KINDS, Event, memory_deltas, memory_steps
from zbkit.viz._colors import COMM_COLOR, IDLE_COLOR, LIMIT_COLOR, kind_color
from zbkit.viz._figure import ZbFigure
from zbkit.viz.timeline import Timeline, timeline

_DPI = 100
_FONT_PX = 5.5  # rough width of one character at fontsize 7, in pixels at 100 dpi


def _describe(source: Any) -> str:
    """'zb-h1, pp=4, m=8' when the source knows its schedule, else ''."""
    schedule = getattr(source, "schedule", None)
    if schedule is None:
        return ""
    parts = [str(getattr(schedule, "name", "") or "")]
    for attr, short in (("pp", "pp"), ("microbatches", "m")):
        if getattr(schedule, attr, None) is not None:
            parts.append(f"{short}={getattr(schedule, attr)}")
    return ", ".join(p for p in parts if p)


def _numbers(t: Timeline) -> str:
    return f"makespan {t.makespan:.4g}, bubble {t.bubble_rate:.1%}"


def _check_ranks(ranks: list[int] | None, num_ranks: int) -> list[int]:
    if ranks is None:
        return list(range(num_ranks))
    bad = [r for r in ranks if not 0 <= r < num_ranks]
    if bad:
        raise ValueError(f"ranks {bad} are not in the run, which has ranks 0..{num_ranks - 1}")
    return list(ranks)


def _rects(events: list[Event], y: float, half: float) -> list[list[tuple[float, float]]]:
    return [
        [(e.start, y - half), (e.end, y - half), (e.end, y + half), (e.start, y + half)]
        for e in events
    ]


def plot_schedule(
    simulation_or_trace: Any,
    *,
    simulation: Any = None,
    compare: Literal["rows", "overlay"] = "rows",
    ranks: list[int] | None = None,
    title: str | None = None,
    labels: bool = True,
    comm: bool = False,
    width: float = 12.0,
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
    shown = _check_ranks(ranks, max(main.num_ranks, ref.num_ranks if ref else 0))

    # rows: (tick label, timeline, outline-only reference timeline or None)
    rows: list[tuple[str, int, Timeline, Timeline | None]] = []
    for r in shown:
        if ref is not None and compare == "rows":
            rows += [(f"rank {r} run", r, main, None), (f"rank {r} sim", r, ref, None)]
        else:
            rows.append((f"rank {r}", r, main, ref))
    span = max(main.makespan, ref.makespan if ref else 0.0)

    height = 0.9 + 0.42 * len(rows)
    fig = ZbFigure(figsize=(width, height), dpi=_DPI)
    ax = fig.add_axes((0.09, 0.5 / height + 0.05 / height, 0.89, 1 - 1.05 / height))
    px_per_unit = (0.89 * width * _DPI) / span if span > 0 else 0.0

    verts: list[list[tuple[float, float]]] = []
    colors: list[str] = []
    outline_verts: list[list[tuple[float, float]]] = []
    outline_colors: list[str] = []
    idle = []
    waits: list[list[tuple[float, float]]] = []
    for y, (_, rank, t, overlay) in enumerate(rows):
        idle.append([(0, y - 0.45), (span, y - 0.45), (span, y + 0.45), (0, y + 0.45)])
        if comm:  # the plan's waits on receives, on the timeline's clock
            for c in getattr(t.source, "comm", None) or []:
                if c.rank == rank and c.end > c.start:
                    a, b = c.start - t.t0, c.end - t.t0
                    waits.append([(a, y + 0.39), (b, y + 0.39), (b, y + 0.45), (a, y + 0.45)])
        events = [e for e in t.events if e.rank == rank]
        verts += _rects(events, y, 0.38)
        colors += [kind_color(e.kind) for e in events]
        if overlay is not None:
            theirs = [e for e in overlay.events if e.rank == rank]
            outline_verts += _rects(theirs, y, 0.44)
            outline_colors += ["#333333"] * len(theirs)
        if labels:
            for e in events:
                chars = (e.end - e.start) * px_per_unit / _FONT_PX
                text = e.label if chars >= len(e.label) + 1 else str(e.microbatch)
                if chars >= len(text) + 0.5:
                    ax.text((e.start + e.end) / 2, y, text, ha="center", va="center", fontsize=7)

    ax.add_collection(
        PolyCollection(idle, facecolors=IDLE_COLOR, edgecolors="none", hatch="//", gid="idle")
    )
    ax.add_collection(
        PolyCollection(verts, facecolors=colors, edgecolors="white", linewidths=0.5, gid="actions")
    )
    if waits:
        ax.add_collection(
            PolyCollection(waits, facecolors=COMM_COLOR, edgecolors="none", gid="comm")
        )
    if outline_verts:
        ax.add_collection(
            PolyCollection(
                outline_verts,
                facecolors="none",
                edgecolors=outline_colors,
                linewidths=0.8,
                linestyles="--",
                gid="simulated",
            )
        )

    ax.set_xlim(0, span * 1.005 if span > 0 else 1)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # rank 0 on top, like the paper's figures
    ax.set_yticks(range(len(rows)), [label for label, *_ in rows], fontsize=8)
    ax.set_xlabel(unit, fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)

    present = {e.kind for e in main.events} | ({e.kind for e in ref.events} if ref else set())
    kinds = [k for k in KINDS.values() if k.letter in present]  # the table's order
    handles = [Patch(facecolor=kind_color(k.letter), label=f"{k.letter}: {k.name}") for k in kinds]
    handles.append(Patch(facecolor=IDLE_COLOR, hatch="//", label="idle (bubble)"))
    if waits:
        handles.append(Patch(facecolor=COMM_COLOR, label="waiting on a receive"))
    if ref is not None and compare == "overlay":
        handles.append(Patch(facecolor="none", edgecolor="#333333", ls="--", label="simulated"))
    ax.legend(
        handles=handles,
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        ncol=len(handles),
        fontsize=7,
        frameon=False,
    )

    name = title if title is not None else _describe(main.source)
    if ref is None:
        numbers = _numbers(main)
    else:
        numbers = f"run: {_numbers(main)} | sim: {_numbers(ref)}"
    ax.set_title(f"{name}   {numbers}" if name else numbers, fontsize=9, loc="left", pad=14)
    fig._zb_summary = f"schedule of {len(shown)} ranks, {numbers}"
    return fig


def _memory(t: Timeline, costs: Any) -> dict[int, tuple[list[float], list[float]]]:
    """Per rank (times, memory held), on the timeline's clock (it starts at 0).

    A Trace weighs its measured counts (by `costs`, else its own `trace.costs`); a
    Simulation has its memory already (recomputed when other `costs` are given); a plain
    event list gets the one memory rule with `costs` (default `Costs()`). Every path places
    the changes by `zbkit.schedules.events`' rule.
    """
    source, t0 = t.source, t.t0  # the source's own steps are on its clock: shift them
    if hasattr(source, "memory_for"):
        per_rank = source.memory_for(costs)
    elif costs is None and isinstance(getattr(source, "memory", None), list):
        per_rank = source.memory
    else:  # the timeline's events are already shifted
        costs = costs if costs is not None else getattr(source, "costs", None)
        per_rank = memory_steps(t.events, memory_deltas(t.events, costs), t.num_ranks)
        t0 = 0.0
    steps = {}
    for rank in range(t.num_ranks):
        pairs = per_rank[rank] if rank < len(per_rank) else []
        times = [0.0] + [time - t0 for time, _ in pairs]
        values = [0.0] + [float(held) for _, held in pairs]
        steps[rank] = (times, values)
    return steps


def plot_memory(
    simulation_or_trace: Any,
    *,
    costs: Any = None,
    limit: float | None = None,
    ranks: list[int] | None = None,
    width: float = 12.0,
    unit: str = "time",
) -> ZbFigure:
    """Activation memory over time, one panel per rank, with the memory limit drawn.

    Memory follows the `KINDS` table (`Costs.memory`: F adds `mem_activation`; I adds
    `mem_weight - mem_activation`; W subtracts `mem_weight`; B subtracts `mem_activation`) and
    the one timing rule of `zbkit.schedules.events`. `costs` defaults to the simulation's (or
    trace's) own; `limit` to its `memory_limit` when it has one.
    """
    t = timeline(simulation_or_trace)
    shown = _check_ranks(ranks, t.num_ranks)
    if limit is None:
        limit = getattr(t.source, "memory_limit", None)
    steps = _memory(t, costs)

    height = 0.8 + 0.9 * len(shown)
    fig = ZbFigure(figsize=(width, height), dpi=_DPI)
    axes = fig.subplots(len(shown), 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    fig.subplots_adjust(left=0.09, right=0.98, top=1 - 0.45 / height, bottom=0.5 / height)
    peaks = []
    for ax, rank in zip(axes, shown, strict=True):
        times, values = steps[rank]
        peak = max(values)
        peaks.append(peak)
        ax.step(times, values, where="post", color=kind_color("F"), lw=1.2, gid=f"memory{rank}")
        ax.fill_between(times, values, step="post", color=kind_color("F"), alpha=0.3)
        over = limit is not None and peak > limit + 1e-9
        ax.text(
            1.0,
            0.9,
            f"peak {peak:.4g}" + (" > limit" if over else ""),
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=7,
            color=LIMIT_COLOR if over else "black",
        )
        if limit is not None:
            ax.axhline(limit, color=LIMIT_COLOR, linestyle="--", linewidth=1.0)
        ax.set_ylabel(f"rank {rank}", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_xlim(0, t.makespan if t.makespan > 0 else 1)
    axes[-1].set_xlabel(unit, fontsize=8)
    axes[0].set_ylim(bottom=min(0.0, *[min(steps[r][1]) for r in shown]))
    limit_text = f", limit {limit:.4g} (dashed)" if limit is not None else ""
    # the unit: Costs.mem_activation per microbatch of one stage; with several stages per
    # rank (zb-v's V) each is a chunk of the model part, so say so
    stages = {e.stage for e in t.events}
    v = len(stages) // max(t.num_ranks, 1)
    unit = f"chunk-microbatches (a chunk: 1/{v} of a rank's layers)" if v > 1 else "microbatches"
    axes[0].set_title(
        f"activation memory per rank, in {unit} x mem_activation: peak {max(peaks):.4g}"
        f"{limit_text}",
        fontsize=9,
        loc="left",
    )
    fig._zb_summary = f"memory of {len(shown)} ranks, peak {max(peaks):.4g}"
    return fig
