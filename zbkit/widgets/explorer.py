"""`ParamGroupExplorer`: pick a ParamGroup, see it on the graph with what W needs to run it."""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as w
from IPython.display import display

from zbkit.viz.graph import draw_graph, node_shape, output_shapes, shape_text
from zbkit.widgets._common import Offline, table_html


def _captured_shapes(node: Any) -> str:
    """Shapes of the gradients I captures at a split point: one per output edge of the node.

    The analysis runs no backward, so these are the shapes autograd expects there (what the
    forward produced): exactly what `stage_backward_input` will capture.
    """
    shapes = output_shapes(node)
    return ", ".join(shape_text(s) for s in shapes) + " (expected)" if shapes else "?"


def _count(n: int, noun: str) -> str:
    """'1 split point', '2 split points'."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


class ParamGroupExplorer(Offline, w.VBox):
    """A dropdown of the analysis' groups; the graph highlights the chosen one.

    Lists the group's parameters (with shapes), its intermediates (where I stops and W starts)
    with the shapes of the gradients captured there, and outputs outside the input closure.
    `select(i)` does from code what the dropdown does.
    """

    def __init__(self, analysis: Any, *, max_nodes: int = 40) -> None:
        if not hasattr(analysis, "groups") or not hasattr(analysis, "reverse_graph"):
            raise TypeError(
                "ParamGroupExplorer takes a SplitGradAnalysis from "
                f"zbkit.splitgrad.analyze(outputs, inputs, module); got {type(analysis).__name__}"
            )
        self.analysis = analysis
        self.max_nodes = max_nodes
        options = [("all groups", -1)] + [
            (f"group {g.index}: {', '.join(g.param_names)}"[:70], g.index) for g in analysis.groups
        ]
        self.dropdown = w.Dropdown(options=options, value=-1, description="group")
        self.dropdown.add_class("zb-group-select")
        self.details = w.HTML()
        self.out = w.Output()  # the graph, and any error
        self.graph: Any = None
        self.dropdown.observe(lambda change: self._show(change["new"]), names="value")
        super().__init__([self.dropdown, self.details, self.out])
        self.add_class("zb-group-explorer")
        self._show(-1)

    def _offline_what(self) -> str:
        return f"{len(self.analysis.groups)} parameter groups"

    def select(self, index: int) -> None:
        """Show group `index` (-1: all groups)."""
        valid = [v for _, v in self.dropdown.options]
        if index not in valid:
            raise ValueError(f"group {index} does not exist; choose one of {valid}")
        self.dropdown.value = index  # triggers _show through the observer

    def _show(self, index: int) -> None:
        with self.out:
            self.out.clear_output(wait=True)
            group = None if index == -1 else index
            self.graph = draw_graph(self.analysis, group=group, max_nodes=self.max_nodes)
            self.details.value = self._details(group)
            display(self.graph)

    def _details(self, index: int | None) -> str:
        a = self.analysis
        if index is None:
            rows = [
                [g.index, ", ".join(g.param_names), ", ".join(g.intermediates) or "-"]
                for g in a.groups
            ]
            head = (
                f"<p>{_count(len(a.groups), 'group')}; {len(a.input_closure)} of "
                f"{len(a.reverse_graph)} "
                "autograd nodes run in the input pass (I).</p>"
            )
            return head + table_html(["group", "parameters", "W starts at"], rows)
        info = a.groups[index]
        group = info.group
        params = [
            [name, shape_text(node_shape(node))]
            for name, node in zip(info.param_names, group.param_nodes, strict=True)
        ]
        splits = [
            [label, _captured_shapes(node)]
            for label, node in zip(info.intermediates, group.intermediates, strict=True)
        ]
        outputs = ", ".join(info.outputs) or "none"
        return (
            f"<p><b>group {index}</b>: {_count(len(params), 'parameter')}, W starts at "
            f"{_count(len(splits), 'split point')}; stage outputs outside I (not computed from "
            f"the inputs) feeding it: {html.escape(outputs)}</p>"
            + table_html(["parameter", "shape"], params)
            + table_html(["split point (intermediate)", "captured gradient shapes"], splits)
        )
