"""Graphviz plumbing: a Digraph that degrades to its DOT source, and the legend."""

from __future__ import annotations

from typing import Any

import graphviz

from zbkit.viz import _colors as c

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


def legend(phases: bool, groups: bool, highlight: str | None = None) -> graphviz.Digraph:
    """A small boxed key; node ids are fixed names, so the source stays deterministic."""
    key = graphviz.Digraph(name="cluster_legend")
    key.attr(label="legend", style="rounded", color="#999999", fontsize="10")
    key.node("legend_param", "parameter", shape="box", style="filled", fillcolor=c.PARAM_FILL)
    key.node(
        "legend_input", "stage input", shape="invhouse", style="filled", fillcolor=c.INPUT_FILL
    )
    key.node(
        "legend_output", "stage output", shape="house", style="filled", fillcolor=c.OUTPUT_FILL
    )
    if highlight is not None:  # one pass lit: say which, and what the grey means
        what = c.KIND_NAMES[highlight]
        key.node("legend_i", f"runs in {highlight}\n({what})", fillcolor=c.KIND_COLORS[highlight])
        if highlight != "F":
            key.node("legend_w", "not in this pass", fillcolor=c.DIM_FILL, fontcolor=c.DIM_FONT)
    elif phases:
        key.node("legend_i", "runs in I\n(input grad)", fillcolor=c.KIND_COLORS["I"])
        key.node("legend_w", "runs in W\n(weight grad)", fillcolor=c.KIND_COLORS["W"])
    else:
        key.node("legend_i", "input closure\n(runs in I)", fillcolor=c.CLOSURE_FILL)
        key.node("legend_w", "param-only op\n(runs in W)", fillcolor="white")
    if groups:
        key.node(
            "legend_split",
            "split point\n(intermediate)",
            color=c.SPLIT_COLOR,
            penwidth="2.5",
            fillcolor="white",
        )
    return key
