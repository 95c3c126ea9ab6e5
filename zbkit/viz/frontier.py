"""Every schedule on one picture: bubble rate against peak memory, the Pareto frontier marked.

Which schedule to pick under which memory budget: each fixed schedule is one point, zb-auto
is a curve (its search under each memory limit, once per placement), and the frontier joins
the points no other point beats on both axes. Every number comes from `simulate`. What is
drawn (a point, or a curve per placement a search builds for) is each schedule's record
(`zbkit.schedules.catalog`); its colour and marker are `STYLES` below.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any, NamedTuple

from matplotlib.lines import Line2D
from matplotlib.ticker import PercentFormatter

from zbkit.schedules import SCHEDULES, Costs, build_schedule, simulate
from zbkit.schedules.catalog import RECORDS
from zbkit.schedules.core.costs import MEMORY_UNIT, per_stage
from zbkit.schedules.core.placement import stage_to_rank
from zbkit.schedules.optimum import bounds
from zbkit.viz._figure import ZbFigure


class Style(NamedTuple):
    colour: str  # a matplotlib colour
    marker: str  # a matplotlib marker


# per label: a schedule's point, or a search's curve per placement ("zb-auto (v)"). 1F1B's
# family blue, ZB-H green, V red, the searches apart; DualPipeV not zb-auto's orange, which
# it sits next to
STYLES: dict[str, Style] = {
    "gpipe": Style("#7f7f7f", "o"),
    "1f1b": Style("#1f77b4", "s"),
    "interleaved-1f1b": Style("#17becf", "D"),
    "zb-h1": Style("#2ca02c", "^"),
    "zb-h2": Style("#98c379", "v"),
    "zb-v": Style("#d62728", "<"),
    "zb-auto (linear)": Style("#ff7f0e", ">"),
    "zb-auto (v)": Style("#9467bd", "p"),
    "zb-opt (linear)": Style("#000000", "*"),
    "zb-opt (v)": Style("#000000", "X"),
    "looped-bfs": Style("#8c564b", "h"),
    "interleaved-zb": Style("#bcbd22", "X"),
    "v-half": Style("#c51b8a", "*"),
    "v-min": Style("#9e1f63", "P"),
    "dualpipev": Style("#2c3e50", "d"),
}
_OTHER_MARKERS = "osD^v<>phX*P8d"


def _labels(name: str) -> list[str]:
    """A schedule's labels: its name, or one per placement for a search."""
    found = RECORDS[name]
    return [f"{name} ({p})" for p in found.placements] if found.placements else [name]


def _styles() -> dict[str, Style]:
    """(colour, marker) per label: `STYLES`, or for a schedule registered without one, a
    colour and marker by its position."""
    out: dict[str, Style] = {}
    for i, name in enumerate(RECORDS):
        for label in _labels(name):
            out[label] = STYLES.get(label) or Style(
                f"C{i % 10}", _OTHER_MARKERS[i % len(_OTHER_MARKERS)]
            )
    return out


class FrontierPoint(NamedTuple):
    label: str  # "zb-h1", or "zb-auto (v)" for a point of a zb-auto curve
    limit: float | None  # zb-auto's memory limit, in the x axis' units; None for the others
    memory: float  # peak memory of the busiest rank, in whole-rank units (x)
    bubble: float  # Simulation.bubble_rate (y)
    on_frontier: bool = False


def _on_frontier(points: Sequence[FrontierPoint], eps: float = 1e-9) -> list[bool]:
    """Pareto: a point is on the frontier when no other point has <= memory and <= bubble,
    one of them strictly less. Equal points are all on it."""

    def beats(a: FrontierPoint, b: FrontierPoint) -> bool:
        no_worse = a.memory <= b.memory + eps and a.bubble <= b.bubble + eps
        better = a.memory < b.memory - eps or a.bubble < b.bubble - eps
        return no_worse and better

    return [not any(beats(other, p) for other in points) for p in points]


def _check(pp, microbatches, costs, schedules, memory_limits) -> tuple[Costs, list, list]:
    for label, value in (("pp", pp), ("microbatches", microbatches)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"plot_frontier: {label} must be an int >= 1, got {value!r}")
    costs = Costs() if costs is None else costs
    if not isinstance(costs, Costs):
        raise ValueError(
            f"plot_frontier: costs must be one Costs (the same for every stage), "
            f"got {type(costs).__name__}"
        )
    # by default every schedule but the proofs (zb-opt: seconds a point), drawn when named
    default = [n for n in SCHEDULES if RECORDS[n].largest is None]
    names = list(default if schedules is None else schedules)
    unknown = [n for n in names if n not in SCHEDULES]
    if unknown or not names:
        raise ValueError(
            f"plot_frontier: unknown schedules {unknown or 'none given'}; "
            f"choose from {', '.join(SCHEDULES)}"
        )
    if memory_limits is None:
        # half of 1F1B's rank-0 peak to twice it, in eighths of it
        unit = costs.mem_activation or 1.0
        memory_limits = [pp * unit * k / 8 for k in range(4, 17)]
    limits = list(memory_limits)
    bad = [x for x in limits if not isinstance(x, int | float) or isinstance(x, bool) or x <= 0]
    if bad or not limits:
        raise ValueError(
            f"plot_frontier: memory_limits must be numbers > 0, got {bad or 'an empty list'}"
        )
    return costs, names, sorted(set(limits))


def _first_line(error: ValueError) -> str:
    return str(error).splitlines()[0]


def _point(schedule, costs, label, limit=None) -> FrontierPoint:
    """Simulate (one `Costs`: every schedule runs the same model, so peaks are in one unit).
    A schedule the builder made must simulate: errors here propagate."""
    sim = simulate(schedule, costs)
    return FrontierPoint(label, limit, max(sim.peak_memory), sim.bubble_rate)


def _curve(pp, m, costs, name, placement, limits, points, skipped) -> None:
    """A search's points under each limit (`name (placement)`), and the limits it refused."""
    label = f"{name} ({placement})"
    refused: list[tuple[float, str]] = []
    for limit in limits:
        options = dict(costs=costs, memory_limit=limit, placement=placement)
        try:
            schedule = build_schedule(name, pp=pp, microbatches=m, **options)
        except ValueError as error:  # nothing fits this limit
            refused.append((limit, _first_line(error)))
            continue
        points.append(_point(schedule, costs, label, limit))
    if refused:
        which = ", ".join(f"{x:g}" for x, _ in refused)
        said = refused[-1][1].rstrip(":")
        skipped[label] = f"no schedule under memory limits {which}; the search says: {said}"


def _collect(pp, m, costs, names, limits) -> tuple[list[FrontierPoint], dict[str, str]]:
    """Every point: a fixed schedule's (built without costs), or a search's curves."""
    points: list[FrontierPoint] = []
    skipped: dict[str, str] = {}
    for name in names:
        for placement in RECORDS[name].placements:  # a search: one curve per placement
            _curve(pp, m, costs, name, placement, limits, points, skipped)
        if RECORDS[name].placements:
            continue
        try:
            schedule = build_schedule(name, pp=pp, microbatches=m)
        except ValueError as error:  # the builder's "cannot build this", with its reason
            skipped[name] = _first_line(error).removeprefix(f"{name}: ")
            continue
        points.append(_point(schedule, costs, name))
    return points, skipped


def plot_frontier(
    pp: int,
    microbatches: int,
    costs: Costs | None = None,
    *,
    schedules: Sequence[str] | None = None,
    memory_limits: Sequence[float] | None = None,
    width: float = 9.0,
) -> ZbFigure:
    """Bubble rate (y) against the busiest rank's peak memory (x) for every schedule.

    Args:
        pp, microbatches: the pipeline's size; every schedule is built for it.
        costs: one `Costs`, a rank's share of the model (`Costs`' rule: a schedule with v
            chunks per rank gives each 1/v of it), passed as is to `simulate`, so every point
            runs the same model.
        schedules: names from `SCHEDULES` (default: all). A schedule that cannot be built for
            these sizes (interleaved-1f1b needs microbatches a multiple of pp) is not drawn;
            the figure says why, and `fig.skipped` maps its name to the builder's reason.
        memory_limits: zb-auto's limits, in the x axis' units (default: pp/2 to 2*pp times
            mem_activation, in steps of pp/8). zb-auto is searched under each, once per
            placement (linear, V), and drawn as a curve; these searches are most of the time
            the drawing takes.
        width: inches at 100 dpi (9: 900 px, JupyterLab's column shows it at full size).

    Each fixed schedule's point carries its name; the legend holds only the search curves,
    the frontier and the floors. x is the simulated peak in rank-microbatches (`MEMORY_UNIT`):
    a microbatch through all of a rank's layers holds `mem_activation`, whatever the
    schedule's chunks; zb-auto's points
    sit at their peaks, at or under their limits. `fig.points` lists every point drawn
    (`FrontierPoint`), `on_frontier` set for the Pareto-optimal ones.
    """
    costs, names, limits = _check(pp, microbatches, costs, schedules, memory_limits)
    points, skipped = _collect(pp, microbatches, costs, names, limits)
    points = [p._replace(on_frontier=f) for p, f in zip(points, _on_frontier(points), strict=True)]
    notes = [f"not drawn: {name}: {why}" for name, why in skipped.items()]
    wrapped = [line for note in notes for line in textwrap.wrap(note, int(width * 13))]
    height = 5.4 + 0.17 * len(wrapped)  # tall: points 1% of bubble apart stay apart
    fig = ZbFigure(figsize=(width, height), dpi=100)
    bottom = (0.75 + 0.17 * len(wrapped)) / height
    ax = fig.add_axes((0.08, bottom, 0.64, 1 - bottom - 0.45 / height))

    floors = _floors(pp, microbatches, costs, points)
    handles = _draw_points(ax, points) + _draw_frontier(ax, points) + _draw_floors(ax, floors)
    _label_axes(ax, pp, microbatches, costs)
    ax.legend(
        handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False
    )
    if wrapped:
        note = "\n".join(wrapped)
        fig.text(0.01, 0.1 / height, note, fontsize=7, va="bottom", color="#b00000", gid="skipped")

    # the numbers drawn, on the figure itself (a Figure takes new attributes; its stub has none)
    fig.points = points  # type: ignore[attr-defined]
    fig.skipped = skipped  # type: ignore[attr-defined]
    fig.floors = floors  # type: ignore[attr-defined]
    fig._zb_summary = _summary(points, skipped, pp, microbatches, floors)
    return fig


def _draw_points(ax: Any, points: list[FrontierPoint]) -> list[Line2D]:
    """Each fixed schedule's point and each search's curve; their legend handles."""
    # the same colour and marker for a schedule in every figure, whatever else is drawn
    styles = _styles()
    handles: list[Line2D] = []
    fixed: list[FrontierPoint] = []
    for label in dict.fromkeys(p.label for p in points):
        colour, marker = styles[label]
        mine = [p for p in points if p.label == label]
        star = " *" if any(p.on_frontier for p in mine) else ""
        if mine[0].limit is None:  # a fixed schedule: one point, named beside it
            (p,) = mine
            # above the frontier's rings (zorder 4), a white edge: never hidden by a ring
            style: dict[str, Any] = dict(color=colour, ms=8, mec="white", mew=0.6, zorder=5)
            ax.plot(p.memory, p.bubble, marker, gid=f"point:{label}", **style)
            fixed.append(p)
            continue
        # a search's curve, in the order of the limits; each point its own artist (gid: limit)
        xs, ys = [p.memory for p in mine], [p.bubble for p in mine]
        ax.plot(xs, ys, "-", color=colour, lw=1, alpha=0.6)
        for p in mine:
            gid = f"point:{label}@{p.limit:g}"
            ax.plot(p.memory, p.bubble, marker, color=colour, ms=4.5, zorder=2, gid=gid)
        name = f"{label}, limits {mine[0].limit:g}-{mine[-1].limit:g}{star}"
        handles.append(Line2D([], [], marker=marker, color=colour, ms=4.5, label=name))
    _name_points(ax, fixed)
    return handles


def _name_points(ax: Any, fixed: list[FrontierPoint]) -> None:
    """Each fixed schedule's name beside its point (a legend of 15 could not be matched to
    the picture): above it and to the right, to the left near the right edge, and a ringed
    point's name marked " *" (it is on the frontier)."""
    if not fixed:
        return
    xs = [p.memory for p in fixed]
    low, high = min(xs), max(xs)
    for p in fixed:
        left = high > low and p.memory > low + 0.8 * (high - low)
        name = p.label + (" *" if p.on_frontier else "")
        ax.annotate(
            name,
            (p.memory, p.bubble),
            xytext=(-5 if left else 5, 3),
            textcoords="offset points",
            ha="right" if left else "left",
            va="bottom",
            fontsize=7,
            zorder=6,
            gid=f"name:{p.label}",
        )


def _floors(pp: int, m: int, costs: Costs, points: list[FrontierPoint]) -> dict[str, list]:
    """The certified floor of each searched placement: at each peak x, the least bubble rate
    any schedule of that placement can reach holding at most x (`bounds.lower_bound` on its
    longest span). Sampled on a grid, each value taken at the grid's next x, so the line stays
    at or under the true floor; none where overlapped pairs save time (the bounds do not
    count it)."""
    placements = dict.fromkeys(_placement(p.label) for p in points if p.limit)
    if costs.overlap > 0 or not placements:
        return {}
    ideal = m * (costs.F + costs.I + costs.W)
    low, high = min(p.memory for p in points), max(p.memory for p in points)
    xs = sorted({low + (high - low) * i / 200 for i in range(201)} | {p.memory for p in points})
    out = {}
    for placement in placements:
        where = stage_to_rank(placement, pp)
        per = per_stage(costs, where)
        # the walked bound (`bounds.chains`, milliseconds each) at the points' peaks only:
        # at x, the one at the next peak up (a larger limit's bound is still a bound at x)
        peaks = sorted({p.memory for p in points})
        walked = [bounds.lower_bound(where, m, per, y, placement) for y in peaks]
        spans = []
        for x in xs:
            up = next((b for y, b in zip(peaks, walked, strict=True) if y >= x - 1e-12), 0.0)
            spans.append(max(up, bounds.lower_bound(where, m, per, x, placement, walk=False)))
        out[placement] = [
            (x, max(0.0, 1 - ideal / span)) for x, span in zip(xs, spans, strict=True)
        ]
    return out


def _placement(label: str) -> str:
    """The placement of a search's curve label: "zb-auto (v)" -> "v"."""
    return label.rsplit("(", 1)[1].removesuffix(")")


def _draw_floors(ax: Any, floors: dict[str, list]) -> list[Line2D]:
    """Each placement's floor, dashed in its first curve's colour; their legend handles."""
    styles, handles = _styles(), []
    for placement, floor in floors.items():
        colour = next(c for label, (c, _) in styles.items() if label.endswith(f"({placement})"))
        line: dict[str, Any] = dict(color=colour, lw=1.1, ls="--", alpha=0.8)
        xs, ys = [x for x, _ in floor], [y for _, y in floor]
        ax.step(xs, ys, where="pre", zorder=1, gid=f"floor:{placement}", **line)
        label = f"certified floor ({placement}):\nno {placement} schedule below"
        handles.append(Line2D([], [], label=label, **line))
    return handles


def _draw_frontier(ax: Any, points: list[FrontierPoint]) -> list[Line2D]:
    """The frontier: its points ringed, joined by a staircase (below it, nothing is
    reachable); its legend handle (none without points)."""
    best = sorted({(p.memory, p.bubble) for p in points if p.on_frontier})
    if not best:
        return []
    xs, ys = [x for x, _ in best], [y for _, y in best]
    ring: dict[str, Any] = dict(marker="o", mfc="none", mec="black", mew=0.9)
    ax.plot(xs, ys, ls="", ms=10, zorder=4, gid="frontier", **ring)
    right = max(p.memory for p in points) * 1.04
    line: dict[str, Any] = dict(color="black", lw=1.6, alpha=0.35)
    ax.step([*xs, right], [*ys, ys[-1]], where="post", zorder=1, **line)
    label = "Pareto frontier (ringed;\n* = a point on it)"
    return [Line2D([], [], ms=10, label=label, **ring, **line)]


def _label_axes(ax: Any, pp: int, microbatches: int, costs: Costs) -> None:
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylim(bottom=min(-0.02, ax.get_ylim()[0]))
    ax.set_ylabel("bubble rate (simulated)", fontsize=9)
    ax.set_xlabel(
        f"peak memory of the busiest rank, in {MEMORY_UNIT} "
        f"(x mem_activation = {costs.mem_activation:g})",
        fontsize=8,
    )
    ax.tick_params(labelsize=8)
    ax.grid(True, color="#e6e6e6", lw=0.6)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    c = costs
    ax.set_title(
        f"bubble vs memory: pp={pp}, m={microbatches}, F={c.F:g} I={c.I:g} W={c.W:g} "
        f"comm={c.comm:g} mem_weight={c.mem_weight:g}",
        fontsize=9,
        loc="left",
    )


def _summary(points: list[FrontierPoint], skipped: dict[str, str], pp: int, m: int, floors) -> str:
    """The figure's text form: what is drawn, what is on the frontier, what is not drawn,
    how far each search's curve is from its placement's floor."""
    labels = list(dict.fromkeys(p.label for p in points))
    on = list(dict.fromkeys(p.label for p in points if p.on_frontier))
    fixed = [p for p in points if p.limit is None]
    missing = [name + (" at some limits" if name in labels else "") for name in skipped]
    return (
        f"bubble vs peak memory of {len(fixed)} schedules and {len(labels) - len(fixed)} "
        f"search curves, pp={pp}, m={m}; "
        f"frontier: {', '.join(on) or 'none'}"
        + (f"; not drawn (fig.skipped): {', '.join(missing)}" if skipped else "")
        + _floor_line(points, floors)
    )


def _floor_line(points: list[FrontierPoint], floors: dict[str, list]) -> str:
    """How far each search's curve is above its placement's floor, at most (in bubble)."""
    if not floors:
        return "; no certified floor (overlapped pairs save time the bounds do not count)"
    parts = []
    for label in dict.fromkeys(p.label for p in points if p.limit):
        at = dict(floors[_placement(label)])
        gap = max(p.bubble - at[p.memory] for p in points if p.label == label)
        parts.append(f"{label} at most {gap:.1%} above")
    return f"; certified floors (fig.floors), dashed: {', '.join(parts)}"
