"""`analyze`: the split-backward analysis of a stage, with names a learner can read."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.autograd.graph import Node

from zbkit._display import show
from zbkit.splitgrad._graph import build_reverse_graph, grad_node, ordered_closure
from zbkit.splitgrad._groups import ParamGroup, group_params

if TYPE_CHECKING:
    import graphviz


# what the table's last column means, as its header's tooltip (notebook 01 says it in words)
_OUTSIDE_I = (
    "stage outputs not computed from the inputs (so I never runs them) that feed the "
    "group's parameters: W also starts there, from the gradient the next stage sent"
)


@dataclass(eq=False)
class GroupInfo:
    """One ParamGroup, named (`group` holds its autograd nodes)."""

    index: int
    param_names: list[str]  # as module.named_parameters() names them
    intermediates: list[str]  # labels of the nodes where W starts (inside the input closure)
    outputs: list[str]  # labels of outputs outside the input closure that feed these params
    group: ParamGroup = field(repr=False)


@dataclass(eq=False)
class SplitGradAnalysis:
    """How a stage's backward splits: groups, closure and labels; a table in a notebook.

    Data only: `to_dot()` (or `zbkit.viz.draw_graph(analysis)`) draws it.
    """

    groups: list[GroupInfo]
    input_closure: set[Node]  # the nodes the input pass (I) executes
    reverse_graph: dict[Node, list[Node]]  # node -> nodes that consume it
    labels: dict[Node, str]  # a readable, unique label per node
    unused_params: list[str]  # trainable, but the outputs do not depend on them
    frozen_params: list[str]  # requires_grad=False

    def _groups_text(self) -> str:
        """'1 param group', '6 param groups'."""
        return f"{len(self.groups)} param group{'s' if len(self.groups) != 1 else ''}"

    def __repr__(self) -> str:
        lines = [
            f"SplitGradAnalysis: {len(self.reverse_graph)} nodes, "
            f"{len(self.input_closure)} in the input closure, {self._groups_text()}"
        ]
        for g in self.groups:
            starts = ", ".join(g.intermediates + [f"output {o}" for o in g.outputs])
            lines.append(f"  group {g.index}: {', '.join(g.param_names)}  <- W starts at {starts}")
        if self.unused_params:
            lines.append(f"  unused: {', '.join(self.unused_params)}")
        if self.frozen_params:
            lines.append(f"  frozen: {', '.join(self.frozen_params)}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        esc = html.escape
        rows = "".join(
            f"<tr><td>{g.index}</td><td>{esc(', '.join(g.param_names))}</td>"
            f"<td>{esc(', '.join(g.intermediates) or '-')}</td>"
            f"<td>{esc(', '.join(g.outputs) or '-')}</td></tr>"
            for g in self.groups
        )
        extra = ""
        if self.unused_params:
            extra += f"<p>unused: {esc(', '.join(self.unused_params))}</p>"
        if self.frozen_params:
            extra += f"<p>frozen: {esc(', '.join(self.frozen_params))}</p>"
        return (
            f"<p><b>SplitGradAnalysis</b>: {len(self.reverse_graph)} autograd nodes, "
            f"{len(self.input_closure)} run in the input pass, {self._groups_text()}</p>"
            "<table><tr><th>group</th><th>parameters</th><th>W starts at (intermediates)</th>"
            f'<th title="{_OUTSIDE_I}">outputs outside I</th></tr>{rows}</table>{extra}'
        )

    def to_dot(self) -> graphviz.Digraph:
        """The autograd graph with its groups and split points: `zbkit.viz.draw_graph(self)`."""
        # drawing lives in viz, which reads splitgrad; splitgrad stays pure torch and asks
        # the display protocol, which imports viz (and graphviz) only when a graph is drawn
        return show(self, "dot")


def _as_list(x: torch.Tensor | Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [x] if isinstance(x, torch.Tensor) else list(x)


def analyze(
    outputs: torch.Tensor | Sequence[torch.Tensor],
    inputs: torch.Tensor | Sequence[torch.Tensor],
    module: nn.Module,
) -> SplitGradAnalysis:
    """Analyse how a stage's backward splits, without running it.

    Give it one forward of the stage: the ``outputs`` it produced, the ``inputs`` it was given
    (those that require grad are what the input pass I differentiates towards) and the
    ``module``, for its parameters' names. It walks the autograd graph from the outputs and
    returns a ``SplitGradAnalysis``: the input closure (the nodes I runs), the parameter
    groups (parameters whose weight pass W starts from the same intermediate nodes, where I
    leaves their gradients), the parameters nothing depends on, and a readable label per node.
    Nothing runs and no ``.grad`` changes; ``stage_backward_input`` and
    ``stage_backward_weight`` then run I and W on such a graph.

    Example::

        import torch
        from torch import nn
        from zbkit.splitgrad import analyze

        block = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4))
        x = torch.randn(2, 4, requires_grad=True)
        analysis = analyze(block(x), x, block)
        print(analysis)  # group 0: 0.weight, 0.bias  <- W starts at AddmmBackward0#1 ...
        assert [g.param_names for g in analysis.groups] == [["0.weight", "0.bias"],
                                                             ["2.weight", "2.bias"]]
        # in a notebook: analysis shows as a table, analysis.to_dot() draws the graph
    """
    outputs, inputs = _as_list(outputs), _as_list(inputs)
    out_nodes = [grad_node(o) for o in outputs]
    input_nodes = [grad_node(x) for x in inputs if x.requires_grad]
    named = list(module.named_parameters())  # tied parameters appear once, first name wins
    param_name = {grad_node(p): n for n, p in named if p.requires_grad}

    reverse = build_reverse_graph(out_nodes)
    closure, _ = ordered_closure(input_nodes, (), reverse)
    groups = group_params(input_nodes, list(param_name), reverse, output_nodes=out_nodes)

    labels: dict[Node, str] = {}
    counts: dict[str, int] = {}
    input_label = {n: f"input[{i}]" for i, x in enumerate(inputs) if (n := grad_node(x))}
    # number repeated op names roughly in forward order (the walk started at the outputs)
    for node in reversed(list(reverse)):
        if node in param_name:
            labels[node] = param_name[node]
        elif node in input_label:
            labels[node] = input_label[node]
        else:
            name = node.name()
            counts[name] = counts.get(name, 0) + 1
            labels[node] = f"{name}#{counts[name]}"

    infos = [
        GroupInfo(
            index=i,
            param_names=[param_name[p] for p in g.param_nodes],
            intermediates=[labels[n] for n in g.intermediates],
            outputs=[labels[n] for n in g.roots],
            group=g,
        )
        for i, g in enumerate(groups)
    ]
    grouped = {p for g in groups for p in g.params}
    return SplitGradAnalysis(
        groups=infos,
        input_closure=set(closure),
        reverse_graph=reverse,
        labels=labels,
        unused_params=[n for node, n in param_name.items() if node not in grouped],
        frozen_params=[n for n, p in named if not p.requires_grad],
    )
