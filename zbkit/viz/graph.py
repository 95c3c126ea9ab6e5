"""`draw_graph`: a stage's autograd graph, with its ParamGroups and split points.

What the picture says (see the legend it carries):
- yellow boxes are parameters (named by module path), blue / red houses the inputs / outputs;
- teal ops (I's colour in every drawing) are the inputs' closure: the nodes the
  input-gradient pass (I) runs through; white ops lie only on parameter paths and run in the
  weight pass (W);
- each ParamGroup is a coloured cluster, holding its parameters and the W-only ops above them;
- red-bordered ops are split points (the group's intermediates), where I stops and W starts.
Every node carries the name `analyze` prints for it ("TanhBackward0#1", "0.weight",
"input[0]"), so a drawing and a printed analysis can be read side by side.
Edges point the way the forward ran (producer -> consumer), so parameters sit at the top.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import graphviz
import torch

from zbkit.viz import _colors as c
from zbkit.viz._autograd import (
    GNode,
    Walk,
    assign_modules,
    depth_of,
    node_shape,
    output_shapes,
    shape_text,
)
from zbkit.viz._dot import ZbDigraph, legend, shorten
from zbkit.viz._graph_walk import unpack
from zbkit.viz._modbox import collapsed_box

# the shape helpers are public here: the widgets label the same nodes the same way
__all__ = ["draw_graph", "node_shape", "output_shapes", "shape_text"]

Phase = Literal["F", "I", "W"]


def _w_regions(w: Walk, closure: set[Any], groups: list[Any]) -> dict[str, int]:
    """node id -> group index, for parameters and the ops only the weight pass runs."""
    owner: dict[str, int] = {}
    for i, group in enumerate(groups):
        for node in group.params:
            if node in w.by_node:
                owner[w.by_node[node].id] = i
    # An op outside the closure leads only to parameters, all of one group (had it reached two
    # groups' parameters, the closure node above it would have merged those groups).
    changed = True
    while changed:
        changed = False
        for g in w.nodes:
            if g.id in owner or g.kind != "op" or g.node in closure:
                continue
            for child in g.children:
                if child.id in owner:
                    owner[g.id] = owner[child.id]
                    changed = True
                    break
    return owner


def _auto_depth(w: Walk, max_nodes: int) -> int | None:
    """The finest module depth whose collapsed graph has at most `max_nodes` boxes."""
    if len(w.nodes) <= max_nodes:
        return None
    deepest = max((depth_of(g.module) for g in w.nodes), default=0)
    for d in range(deepest, 0, -1):
        keys = {
            ".".join(g.module.split(".")[:d]) if depth_of(g.module) >= d else g.id for g in w.nodes
        }
        if len(keys) <= max_nodes:
            return d
    return 1


def _phase_fill(in_closure: bool, phases: bool, highlight: Phase | None) -> tuple[str, bool]:
    """(fill colour, dimmed?) of a node that runs in I (in the closure) or in W."""
    if highlight == "F":
        return c.KIND_COLORS["F"], False
    if highlight is not None:
        runs = "I" if in_closure else "W"
        return (c.KIND_COLORS[runs], False) if runs == highlight else (c.DIM_FILL, True)
    if phases:
        return c.KIND_COLORS["I" if in_closure else "W"], False
    # the closure is what I runs: I's colour, as with phases=True and on the schedules
    return (c.KIND_COLORS["I"] if in_closure else "white"), False


def _i_fill(phases: bool, highlight: Phase | None) -> str:
    """The fill of a node that runs in I: a mixed box's bar puts it first (left)."""
    return _phase_fill(True, phases, highlight)[0]


@dataclass(frozen=True)
class _Look:
    """What decides how a node is drawn: the options and the analysis' sets."""

    phases: bool
    highlight: Phase | None
    group: int | None  # the ParamGroup to highlight, or None
    closure: set[Any]  # what I runs
    split_nodes: set[Any]  # every group's intermediates
    chosen_splits: set[Any]  # the highlighted group's (every group's if none is)
    owner: dict[str, int]  # node id -> its group, for parameters and W-only ops


def draw_graph(
    analysis_or_outputs: Any,
    inputs: torch.Tensor | Sequence[torch.Tensor] | None = None,
    module: torch.nn.Module | None = None,
    *,
    phases: bool = False,
    highlight: Phase | None = None,
    group: int | None = None,
    depth: int | None = None,
    max_nodes: int = 40,
    show_legend: bool = True,
    title: str | None = None,
) -> graphviz.Digraph:
    """Draw a stage's autograd graph.

    Args:
        analysis_or_outputs: a `SplitGradAnalysis`, or the stage's output tensor(s) (then give
            `inputs` and `module` for names, groups and the closure).
        phases: colour ops by the pass that runs them: I (input closure) or W.
        highlight: "F", "I" or "W": colour only what that pass runs, dim the rest.
        group: index of a ParamGroup to highlight (the others are dimmed).
        depth: collapse ops into one box per module at this depth (`layers.3` is depth 2);
            by default only when the graph has more than `max_nodes` nodes.
    """
    if highlight not in (None, "F", "I", "W"):
        raise ValueError(f"highlight={highlight!r}; use 'F', 'I', 'W' or None")
    w, analysis = unpack(analysis_or_outputs, inputs, module)
    assign_modules(w)
    groups = [g.group for g in analysis.groups]  # GroupInfo -> its ParamGroup (nodes)
    names = [list(g.param_names) for g in analysis.groups]
    _check_group(group, len(groups))
    closure = set(analysis.input_closure)
    split_nodes = {n for g in groups for n in g.intermediates}
    chosen = set(groups[group].intermediates) if group is not None else split_nodes
    look = _Look(
        phases, highlight, group, closure, split_nodes, chosen, _w_regions(w, closure, groups)
    )
    depth = depth if depth is not None else _auto_depth(w, max_nodes)

    dot = _digraph()
    rep, boxes, module_of_box = _boxes(w, depth)
    clusters: dict[int, graphviz.Digraph] = {}
    mixed = False  # a collapsed box runs in both passes: the legend shows its bar
    for bid, members in boxes.items():
        if bid in module_of_box:
            mixed = _module_node(dot, bid, module_of_box[bid], members, look) or mixed
        else:
            _node(dot, clusters, members[0], look)
    _clusters(dot, clusters, names, group)
    _edges(dot, w, rep)
    if show_legend:
        dot.subgraph(_legend(look, bool(groups), mixed))
    summary = f"{len(w.nodes)} nodes, {len(groups)} param group{'s' if len(groups) != 1 else ''}"
    if depth is not None:
        summary += f", collapsed to module depth {depth}"
    dot.attr(label=title if title is not None else f"autograd graph: {summary}")
    dot.zb_summary = summary
    return dot


def _check_group(group: int | None, count: int) -> None:
    if group is not None and not 0 <= group < count:
        raise ValueError(
            f"group={group}, but the analysis has {count} groups (valid: 0..{count - 1})"
        )


def _digraph() -> ZbDigraph:
    dot = ZbDigraph(name="autograd")
    dot.attr(rankdir="TB", fontname="Helvetica", fontsize="11", labelloc="t", nodesep="0.25")
    dot.attr("node", shape="box", style="rounded,filled", fontname="Helvetica", fontsize="9")
    dot.attr("edge", arrowsize="0.6", color="#666666")
    return dot


def _boxes(
    w: Walk, depth: int | None
) -> tuple[dict[str, str], dict[str, list[GNode]], dict[str, str]]:
    """Which box each node is drawn in: its own, or its module's when collapsing to `depth`.
    Returns (node id -> box id, box id -> members in walk order, module box id -> path)."""
    rep: dict[str, str] = {}
    boxes: dict[str, list[GNode]] = {}
    module_box: dict[str, str] = {}  # module path -> "m0", "m1", ... in walk order
    for g in w.nodes:
        bid = g.id
        if depth is not None and g.kind != "input" and depth_of(g.module) >= depth:
            path = ".".join(g.module.split(".")[:depth])
            bid = module_box.setdefault(path, f"m{len(module_box)}")
        rep[g.id] = bid
        boxes.setdefault(bid, []).append(g)
    return rep, boxes, {bid: path for path, bid in module_box.items()}


def _module_node(dot: Any, bid: str, path: str, members: list[GNode], look: _Look) -> bool:
    """A collapsed module: one box, its fills in proportion; True if it runs in both passes."""
    counts: dict[str, int] = {}  # fill colour -> nodes, in first-seen order
    for g in members:
        fill = _phase_fill(g.node in look.closure or g.kind == "input", look.phases, look.highlight)
        counts[fill[0]] = counts.get(fill[0], 0) + 1
    held = (
        sum(look.owner.get(g.id) == look.group or g.node in look.chosen_splits for g in members)
        if look.group is not None
        else 0
    )
    first = _i_fill(look.phases, look.highlight)
    label, attrs = collapsed_box(
        path,
        ops=sum(g.kind == "op" for g in members),
        params=sum(g.kind == "param" for g in members),
        splits=sum(g.node in look.split_nodes for g in members),
        fills=sorted(counts.items(), key=lambda kv: kv[0] != first),
        group=look.group,
        held=held,
    )
    dot.node(bid, label, **attrs)
    return label.startswith("<")


def _node(dot: Any, clusters: dict[int, graphviz.Digraph], g: GNode, look: _Look) -> None:
    """One node, in its group's cluster (made on first use) if it has one."""
    attrs: dict[str, str] = {}  # as collapsed_box returns
    in_closure = g.node in look.closure or g.kind == "input"
    fill, dim = _phase_fill(in_closure, look.phases, look.highlight)
    if g.kind == "param":
        attrs.update(shape="box", style="filled")
        fill = c.PARAM_FILL if not (look.phases or look.highlight) else fill
    elif g.kind == "input":
        attrs.update(shape="invhouse", style="filled")
        fill = c.INPUT_FILL if not dim else fill
    if g.node in look.split_nodes:  # red when it starts the chosen group's W (or any group's)
        red = g.node in look.chosen_splits
        attrs.update(color=c.SPLIT_COLOR if red else "#e8b0b0", penwidth="2.5")
    gi = look.owner.get(g.id)
    mine = gi == look.group or g.node in look.chosen_splits or g.kind == "input"
    if look.group is not None and not mine:
        fill, dim = c.DIM_FILL, True
    if dim:
        attrs["fontcolor"] = c.DIM_FONT
    target = dot
    if gi is not None:
        if gi not in clusters:
            clusters[gi] = graphviz.Digraph(name=f"cluster_group{gi}")
        target = clusters[gi]
    target.node(g.id, g.label, fillcolor=fill, **attrs)


def _clusters(
    dot: Any, clusters: dict[int, graphviz.Digraph], names: list[list[str]], group: int | None
) -> None:
    """Each ParamGroup a coloured cluster, named by its parameters; dimmed unless chosen."""
    for gi in sorted(clusters):
        chosen = group is None or gi == group
        clusters[gi].attr(
            label=f"group {gi}: {shorten(names[gi])}",
            style="rounded,filled",
            fillcolor=c.group_color(gi) if chosen else c.DIM_FILL,
            color="black" if group == gi else "#999999",
            penwidth="2" if group == gi else "1",
            fontcolor="black" if chosen else c.DIM_FONT,
            fontsize="10",
        )
        dot.subgraph(clusters[gi])


def _edges(dot: Any, w: Walk, rep: dict[str, str]) -> None:
    """The outputs' houses, then each producer -> consumer edge once between boxes."""
    for i, shape in enumerate(w.output_shapes):
        dot.node(
            f"o{i}",
            f"output {i}\n{shape_text(shape)}",
            shape="house",
            style="filled",
            fillcolor=c.OUTPUT_FILL,
        )
        dot.edge(rep[w.roots[i].id], f"o{i}")
    drawn: set[tuple[str, str]] = set()
    for producer, consumer in w.edges():
        a, b = rep[producer.id], rep[consumer.id]
        if a != b and (a, b) not in drawn:
            drawn.add((a, b))
            dot.edge(a, b)


def _legend(look: _Look, has_groups: bool, mixed: bool) -> graphviz.Digraph:
    lit = look.phases or look.highlight is not None  # parameters take their pass's colour
    w_fill = _phase_fill(False, look.phases, look.highlight)[0]
    both = (_i_fill(look.phases, look.highlight), w_fill)
    return legend(
        look.phases,
        has_groups,
        look.highlight,
        param_fill=w_fill if lit else c.PARAM_FILL,
        mixed=both if mixed else None,
    )
