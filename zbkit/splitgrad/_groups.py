"""Which parameters can get their gradients in one weight pass (W), and from where.

The input pass (I) executes exactly the nodes that depend on the stage inputs:
the *input closure* C. A parameter's gradient flows along paths that start in C
(or at an output outside C) and leave C for good at some node: once a path is
outside C it never re-enters, because nodes outside C do not depend on the
inputs and neither do their producers. The C nodes where a parameter's paths
leave C are its *intermediates*: the I pass records the gradient arriving there,
and W replays the backward from them to the parameter.

Two parameters whose paths share an intermediate (or an output root) must be
replayed together: running one alone would either double count or free buffers
the other still needs. So groups are the connected components of
"param -- entry point", found with a union-find.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch.autograd.function import BackwardCFunction
from torch.autograd.graph import Node

from zbkit.splitgrad._graph import ordered_closure


@dataclass(eq=False)
class ParamGroup:
    """Parameters whose weight gradients W computes together, from the same entry points."""

    params: set[Node]  # AccumulateGrad nodes of the parameters in this group
    intermediates: list[Node] | None  # C nodes where the params' gradient paths leave C
    # per intermediate: the gradients it received in I, one per output edge
    # (None where undefined); not in the repr, tensors would flood a notebook
    grads: list[tuple[torch.Tensor | None, ...] | None] | None = field(default=None, repr=False)
    roots: list[Node] = field(default_factory=list)  # output nodes outside C feeding params
    param_order: list[Node] = field(default_factory=list, repr=False)  # params, as given
    # True when a custom Function in this group's W may need its "input" half too
    # (e.g. first stage: activations computed from parameters alone), see _directions
    needs_both_directions: bool = field(default=False, repr=False)
    # filled by stage_backward_input: output edges outside C with their gradients
    root_edges: list = field(default_factory=list, repr=False)
    root_grads: list = field(default_factory=list, repr=False)
    tensors: list = field(default_factory=list, repr=False)  # the parameter tensors
    # per intermediate: indices of its output edges (next_functions) that lead to
    # this group's params, i.e. the edges W needs from it
    exits: list[list[int]] = field(default_factory=list, repr=False)
    # filled by stage_backward_input for a group whose weight half I computed on
    # the way (a LayerNorm's, see _backward._eager_edges): the parameter edges
    # and their gradients, which W only delivers into `.grad`
    ready_edges: list = field(default_factory=list, repr=False)
    ready_grads: list = field(default_factory=list, repr=False)


def _find(parent: list[int], i: int) -> int:
    while parent[i] != i:
        parent[i] = parent[parent[i]]  # path halving
        i = parent[i]
    return i


def _has_mixed_custom_function(nodes: Sequence[Node], closure: dict) -> bool:
    """A custom Function with an argument that is neither a C node nor a leaf parameter."""
    for node in nodes:
        if isinstance(node, BackwardCFunction):
            for producer, _ in node.next_functions:
                if (
                    producer is not None
                    and producer not in closure
                    and type(producer).__name__ != "AccumulateGrad"
                ):
                    return True
    return False


def group_params(
    input_nodes: Sequence[Node],
    param_nodes: Sequence[Node],
    reverse_graph: dict[Node, list[Node]],
    *,
    output_nodes: Sequence[Node] | None = None,
) -> list[ParamGroup]:
    """Split parameters into disjoint groups that W can process independently.

    Two parameters share a group iff their gradient paths reach the inputs'
    closure at a common intermediate node, transitively. Outputs that do not
    depend on the inputs (all of them on a first stage) are entry points too,
    so every parameter the outputs depend on lands in exactly one group.
    Groups come ordered by their first parameter's position in `param_nodes`;
    parameters the outputs do not depend on are in no group.

    `output_nodes` defaults to the nodes nobody consumes (the graph's sinks).
    """
    closure, _ = ordered_closure(input_nodes, (), reverse_graph)
    if output_nodes is None:
        output_nodes = [n for n, users in reverse_graph.items() if not users]
    outside_roots = {n: None for n in output_nodes if n is not None and n not in closure}

    params = list(dict.fromkeys(p for p in param_nodes if p is not None and p in reverse_graph))
    entries_of: list[list[Node]] = []
    outside_of: list[dict[Node, None]] = []
    mixed: list[bool] = []
    owner: dict[Node, int] = {}  # entry node -> first param index that reached it
    parent = list(range(len(params)))
    for i, param in enumerate(params):
        # walk from the param towards the outputs; stop when entering C
        outside, reached = ordered_closure([param], closure, reverse_graph)
        entries = list(reached) + [n for n in outside if n in outside_roots]
        entries_of.append(entries)
        outside_of.append(outside)
        mixed.append(_has_mixed_custom_function([*outside, *reached], closure))
        for entry in entries:
            j = owner.setdefault(entry, i)
            if j != i:  # union: keep the smaller index as the representative
                a, b = _find(parent, i), _find(parent, j)
                parent[max(a, b)] = min(a, b)

    groups: dict[int, ParamGroup] = {}
    nodes_of: dict[int, set[Node]] = {}  # group -> its nodes outside C
    for i, param in enumerate(params):
        rep = _find(parent, i)
        group = groups.get(rep)
        if group is None:
            group = groups[rep] = ParamGroup(params=set(), intermediates=[])
        group.params.add(param)
        nodes_of.setdefault(rep, set()).update(outside_of[i])
        group.param_order.append(param)
        group.needs_both_directions |= mixed[i]
        for entry in entries_of[i]:
            if owner[entry] == i:  # each entry listed once, by the param that found it
                if entry in closure:
                    group.intermediates.append(entry)
                else:
                    group.roots.append(entry)
    for rep, group in groups.items():
        mine = nodes_of[rep]
        group.exits = [
            [k for k, (n, _) in enumerate(node.next_functions) if n in mine]
            for node in group.intermediates
        ]
    return list(groups.values())  # dict order = order of the first param of each group
