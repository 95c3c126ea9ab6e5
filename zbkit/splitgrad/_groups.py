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
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch.autograd.function import BackwardCFunction
from torch.autograd.graph import Node

from zbkit.splitgrad._graph import build_reverse_graph, ordered_closure
from zbkit.splitgrad._whole import opaque_node


@dataclass(frozen=True, eq=False)
class ParamGroup:
    """Parameters whose weight gradients W computes together, from the same entry points.

    What the analysis finds, and nothing else: it never changes once built. The gradients
    one microbatch's I leaves for W live in a `PendingWeight` (see _pending).
    """

    param_nodes: tuple[Node, ...]  # AccumulateGrad nodes of the parameters, in the order given
    intermediates: tuple[Node, ...]  # C nodes where the params' gradient paths leave C
    # per intermediate: indices of its output edges (next_functions) that lead to
    # this group's params, i.e. the edges W needs from it
    exits: tuple[tuple[int, ...], ...] = ()
    roots: tuple[Node, ...] = ()  # output nodes outside C feeding params
    # True when a custom Function in this group's W may need its "input" half too
    # (e.g. first stage: activations computed from parameters alone), see _directions
    needs_both_directions: bool = False

    @property
    def params(self) -> frozenset[Node]:
        """The parameters' nodes as a set (membership tests)."""
        return frozenset(self.param_nodes)

    @property
    def grads(self) -> None:
        raise AttributeError(
            "ParamGroup.grads moved: a ParamGroup is what the analysis finds and never changes; "
            "the gradients one stage_backward_input captured live in its PendingWeight "
            "(BackwardInputResult.pending_weight), which stage_backward_weight consumes"
        )

    def __repr__(self) -> str:  # node reprs are long; counts say enough in a notebook
        return (
            f"ParamGroup({len(self.param_nodes)} params, {len(self.intermediates)} intermediates"
            f", {len(self.roots)} outputs outside the input closure)"
        )


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
                    and not hasattr(producer, "variable")  # only AccumulateGrad nodes have it
                ):
                    return True
    return False


def input_closure(input_nodes: Sequence[Node | None], reverse_graph: dict) -> dict[Node, None]:
    """C: every node that depends on the stage inputs (what I executes), in a fixed order."""
    return ordered_closure(input_nodes, (), reverse_graph)[0]


def group_params(
    input_nodes: Sequence[Node | None],
    param_nodes: Sequence[Node | None],
    reverse_graph: dict[Node, list[Node]],
    *,
    output_nodes: Sequence[Node | None] | None = None,
    closure: dict[Node, None] | None = None,
) -> list[ParamGroup]:
    """Split parameters into disjoint groups that W can process independently.

    Two parameters share a group iff their gradient paths reach the inputs'
    closure at a common intermediate node, transitively. Outputs that do not
    depend on the inputs (all of them on a first stage) are entry points too,
    so every parameter the outputs depend on lands in exactly one group.
    Groups come ordered by their first parameter's position in `param_nodes`;
    parameters the outputs do not depend on are in no group.

    `output_nodes` defaults to the nodes nobody consumes (the graph's sinks);
    `closure`, the input closure if the caller already has it (`input_closure`).
    """
    if closure is None:
        closure = input_closure(input_nodes, reverse_graph)
    if output_nodes is None:
        output_nodes = [n for n, users in reverse_graph.items() if not users]
    outside_roots = {n: None for n in output_nodes if n is not None and n not in closure}

    params = list(dict.fromkeys(p for p in param_nodes if p is not None and p in reverse_graph))
    reach: list[_Reach] = []
    owner: dict[Node, int] = {}  # entry node -> first param index that reached it
    parent = list(range(len(params)))
    for i, param in enumerate(params):
        # walk from the param towards the outputs; stop when entering C
        outside, reached = ordered_closure([param], closure, reverse_graph)
        entries = list(reached) + [n for n in outside if n in outside_roots]
        mixed = _has_mixed_custom_function([*outside, *reached], closure)
        reach.append(_Reach(entries, outside, mixed))
        for entry in entries:
            j = owner.setdefault(entry, i)
            if j != i:  # union: keep the smaller index as the representative
                a, b = _find(parent, i), _find(parent, j)
                parent[max(a, b)] = min(a, b)

    # one group per union-find representative, in the order of each group's first param
    members: dict[int, list[int]] = {}
    for i in range(len(params)):
        members.setdefault(_find(parent, i), []).append(i)
    return [_group(idx, params, reach, owner, closure) for idx in members.values()]


class _Reach(NamedTuple):
    """What the walk from one parameter towards the outputs found."""

    entries: list[Node]  # where it enters the closure C, then the outside roots it reaches
    outside: dict[Node, None]  # the nodes it passed outside C
    mixed: bool  # a custom Function with inputs both inside and outside C


def _group(
    idx: list[int],
    params: list[Node],
    reach: list[_Reach],
    owner: dict[Node, int],
    closure: dict[Node, None],
) -> ParamGroup:
    """The group of params `idx`: its params, intermediates and roots in order."""
    mine: set[Node] = set().union(*(reach[i].outside for i in idx))  # its nodes outside C
    # each entry listed once, by the param that found it
    entries = [e for i in idx for e in reach[i].entries if owner[e] == i]
    intermediates = tuple(e for e in entries if e in closure)
    return ParamGroup(
        param_nodes=tuple(params[i] for i in idx),
        intermediates=intermediates,
        exits=tuple(
            tuple(k for k, (n, _) in enumerate(node.next_functions) if n in mine)
            for node in intermediates
        ),
        roots=tuple(e for e in entries if e not in closure),
        needs_both_directions=any(reach[i].mixed for i in idx),
    )


@dataclass(eq=False)
class StageAnalysis:
    """What the input pass needs to know about one stage graph."""

    reverse: dict[Node, list[Node]]  # node -> the nodes that consume it
    closure: dict[Node, None]  # C, the nodes I executes
    groups: list[ParamGroup]
    tensors: list[list[torch.Tensor]]  # per group, its parameters (param_nodes order)
    # the type of a node in C whose backward must run once (see _whole); None: none
    opaque: str | None = None


def find_stage_groups(
    output_nodes: Sequence[Node], input_nodes: Sequence[Node], weights: Sequence[torch.Tensor]
) -> StageAnalysis:
    """The reverse graph, the input closure and the parameter groups of one stage graph."""
    reverse = build_reverse_graph(output_nodes)
    # node of each weight; tied weights share one AccumulateGrad node. Reading
    # the leaves off the graph's AccumulateGrad nodes is much cheaper than asking
    # every parameter for its node (that builds a throwaway view per parameter).
    leaf_node = {}
    for graph_node in reverse:
        leaf = getattr(graph_node, "variable", None)  # only AccumulateGrad nodes have it
        if leaf is not None:
            leaf_node[id(leaf)] = graph_node
    weight_of: dict[Node, torch.Tensor] = {}
    for w in weights:
        node: Node | None = leaf_node.get(id(w))
        if node is None and w.requires_grad and not w.is_leaf:
            node = w.grad_fn
        if node is not None:  # None: frozen, or the outputs do not depend on it
            weight_of.setdefault(node, w)
    closure = input_closure(input_nodes, reverse)
    groups = group_params(
        input_nodes, list(weight_of), reverse, output_nodes=output_nodes, closure=closure
    )
    tensors = [[weight_of[p] for p in g.param_nodes] for g in groups]
    return StageAnalysis(reverse, closure, groups, tensors, opaque_node(closure))
