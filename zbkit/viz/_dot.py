"""Graphviz plumbing: a Digraph that degrades to its DOT source, and the legend."""

from __future__ import annotations

from typing import Any

import graphviz

from zbkit.viz import _colors as c
from zbkit.viz._modbox import html_label

NO_DOT = (
    "Graphviz's `dot` program was not found, so this graph cannot be drawn here.\n"
    "Install it (apt-get install graphviz, brew install graphviz, conda install graphviz)\n"
    "or paste the DOT source below into https://dreampuf.github.io/GraphvizOnline.\n\n"
)


class ZbDigraph(graphviz.Digraph):
    """A `graphviz.Digraph` whose notebook repr is the SVG, or, without `dot`, a message and
    the DOT source instead of a traceback."""

    zb_summary = "graph"

    def _repr_mimebundle_(
        self, include: Any = None, exclude: Any = None, **kwargs: Any
    ) -> dict[str, str]:
        try:
            svg = self.pipe(format="svg", encoding="utf-8")
        except graphviz.ExecutableNotFound:
            return {"text/plain": NO_DOT + self.source}
        return {"image/svg+xml": svg, "text/plain": repr(self)}

    def __repr__(self) -> str:
        return f"<ZbDigraph: {self.zb_summary}>"


def shorten(names: list[str], limit: int = 3) -> str:
    """'a.weight, a.bias, +2 more' for a cluster label."""
    head = ", ".join(names[:limit])
    return head + (f", +{len(names) - limit} more" if len(names) > limit else "")


def legend(
    phases: bool,
    groups: bool,
    highlight: str | None = None,
    *,
    param_fill: str = c.PARAM_FILL,
    mixed: tuple[str, str] | None = None,
) -> graphviz.Digraph:
    """A boxed key, one entry under the other; ids are fixed names (deterministic source).

    `param_fill`: the colour parameters are drawn in (green when `phases` colours them by
    the pass that fills their .grad); `mixed`: the (I, W) colours of a collapsed module box
    that runs in both passes, shown as the same bar the box carries.
    """
    filled = {"style": "filled"}
    w_fill = param_fill == c.KIND_COLORS["W"]
    param = "parameter\n(.grad made in W)" if w_fill else "parameter"
    entries: list[tuple[str, str, dict[str, str]]] = [
        ("legend_param", param, {**filled, "shape": "box", "fillcolor": param_fill}),
        ("legend_input", "stage input", {**filled, "shape": "invhouse", "fillcolor": c.INPUT_FILL}),
        ("legend_output", "stage output", {**filled, "shape": "house", "fillcolor": c.OUTPUT_FILL}),
    ]
    if highlight is not None:  # one pass lit: say which, and what the grey means
        lit = f"runs in {highlight}\n({c.KIND_NAMES[highlight]})"
        entries.append(("legend_i", lit, {"fillcolor": c.KIND_COLORS[highlight]}))
        if highlight != "F":
            dim = {"fillcolor": c.DIM_FILL, "fontcolor": c.DIM_FONT}
            entries.append(("legend_w", "not in this pass", dim))
    elif phases:
        entries.append(("legend_i", "runs in I\n(input grad)", {"fillcolor": c.KIND_COLORS["I"]}))
        entries.append(("legend_w", "runs in W\n(weight grad)", {"fillcolor": c.KIND_COLORS["W"]}))
    else:
        closure = {"fillcolor": c.KIND_COLORS["I"]}  # I's colour: the closure is what I runs
        entries.append(("legend_i", "input closure\n(runs in I)", closure))
        entries.append(("legend_w", "param-only op\n(runs in W)", {"fillcolor": "white"}))
    if mixed is not None:
        bar = html_label(["module box:", "ops of I and W"], [(mixed[0], 1), (mixed[1], 1)])
        entries.append(("legend_mixed", bar, {"fillcolor": "white", "shape": "box"}))
    if groups:
        split = {"color": c.SPLIT_COLOR, "penwidth": "2.5", "fillcolor": "white"}
        entries.append(("legend_split", "split point\n(intermediate)", split))

    key = graphviz.Digraph(name="cluster_legend")
    key.attr(label="legend", style="rounded", color="#999999", fontsize="10")
    for name, text, attrs in entries:
        key.node(name, text, **attrs)
    for (a, *_), (b, *_) in zip(entries, entries[1:], strict=False):
        key.edge(a, b, style="invis")  # a column beside the graph, not a wide row above it
    return key
