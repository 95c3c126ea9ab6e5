"""Activation memory over time as a picture: one panel per rank, the memory limit drawn.

Takes what `zbkit.viz.timeline` accepts (a Simulation, a trace, a list of events) and returns
a `Figure`; nothing goes through pyplot. Split from `schedule_plot` (same inputs, same clock).
"""

from __future__ import annotations

from typing import Any

from zbkit.schedules import Costs, memory_deltas, memory_steps
from zbkit.schedules.core.costs import MEMORY_UNIT, TOL
from zbkit.viz._colors import LIMIT_COLOR, kind_color
from zbkit.viz._figure import DPI, ZbFigure, check_ranks
from zbkit.viz.timeline import Timeline, timeline


def _memory(t: Timeline, costs: Any) -> dict[int, tuple[list[float], list[float]]]:
    """Per rank (times, memory held), on the timeline's clock (it starts at 0).

    A Trace weighs its measured counts (by `costs`, else its own `trace.costs`); a
    Simulation has its memory already (recomputed when other `costs` are given); a plain
    event list gets the one memory rule with `costs` (default `Costs()`). Every path places
    the changes by `zbkit.schedules.core.events`' rule.
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
    width: float = 9.0,
    unit: str = "time",
) -> ZbFigure:
    """Activation memory over time, one panel per rank, with the memory limit drawn.

    Memory follows the `KINDS` table (`Costs.memory`: F adds `mem_activation`; I adds
    `mem_weight - mem_activation`; W subtracts `mem_weight`; B subtracts `mem_activation`) and
    the one timing rule of `zbkit.schedules.core.events`. `costs` defaults to the simulation's (or
    trace's) own; `limit` to its `memory_limit` when it has one.
    """
    t = timeline(simulation_or_trace)
    shown = check_ranks(ranks, t.num_ranks)
    if limit is None:
        limit = getattr(t.source, "memory_limit", None)
    steps = _memory(t, costs)

    height = 0.8 + 0.9 * len(shown)
    fig = ZbFigure(figsize=(width, height), dpi=DPI)
    axes = fig.subplots(len(shown), 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    fig.subplots_adjust(left=0.09, right=0.98, top=1 - 0.45 / height, bottom=0.5 / height)
    peaks = [
        _panel(ax, rank, steps[rank], limit, t.makespan)
        for ax, rank in zip(axes, shown, strict=True)
    ]
    axes[-1].set_xlabel(unit, fontsize=8)
    axes[0].set_ylim(bottom=min(0.0, *[min(steps[r][1]) for r in shown]))
    limit_text = f", limit {limit:.4g} (dashed)" if limit is not None else ""
    # the unit: one Costs is a rank's share (whatever its chunks), so one unit everywhere;
    # costs given per stage (e.g. measured) weigh each stage's microbatches their own way
    weights = costs if costs is not None else getattr(t.source, "costs", None)
    per_stage = weights is not None and not isinstance(weights, Costs)
    unit = "the per-stage costs' units" if per_stage else f"{MEMORY_UNIT} x mem_activation"
    axes[0].set_title(
        f"activation memory per rank, in {unit}: peak {max(peaks):.4g}{limit_text}",
        fontsize=9,
        loc="left",
    )
    fig._zb_summary = f"memory of {len(shown)} ranks, peak {max(peaks):.4g}"
    return fig


def _panel(
    ax: Any,
    rank: int,
    steps: tuple[list[float], list[float]],
    limit: float | None,
    makespan: float,
) -> float:
    """One rank's memory as a filled step line, its peak (red when over the limit) and the
    limit dashed; returns the peak."""
    times, values = steps
    peak = max(values)
    ax.step(times, values, where="post", color=kind_color("F"), lw=1.2, gid=f"memory{rank}")
    ax.fill_between(times, values, step="post", color=kind_color("F"), alpha=0.3)
    over = limit is not None and peak > limit + TOL
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
    ax.set_xlim(0, makespan if makespan > 0 else 1)
    return peak
