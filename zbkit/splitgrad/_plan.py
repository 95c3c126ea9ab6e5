"""The input pass's analysis, cached per graph structure (a fast path, see _fast).

Every microbatch builds a new autograd graph, but the same stage gives a graph
of the same *shape* each time. The analysis (reverse graph, input closure,
parameter groups: ~2 ms on a stage of 48 small blocks, as much as the input
pass's own compute) is a function of that shape alone, so it is done once per
shape and kept in node *positions*; the next graph of the same shape gets it
back by position.

The key is exact. One walk over the graph, breadth first from the outputs,
numbers the nodes in the order it finds them and writes, per node, its type
and its edges as (producer's number, input_nr). The stage inputs', weights'
and outputs' positions complete it. The walk is determined by what it has
written so far, so two graphs with equal keys are the same graph up to that
numbering: same node types, same edges in the same order, the same nodes being
inputs, outputs and each weight. Every step of the analysis is a deterministic
function of exactly these, so it gives the same answer, position for position.
Types name the op (`AddmmBackward0`, a custom Function's own backward class);
torch's generic type for C++ nodes without one (`CppFunction`) adds the node's
name. What may change between microbatches without changing the key (tensor
values and shapes, hooks on parameters) is not read by the cached steps;
hooks are checked per call (`_fast.eager_edges`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch.autograd.graph import GradientEdge, Node

from zbkit.splitgrad._fast import eager_candidates
from zbkit.splitgrad._free import free_early, freeable, hooked, input_only_nodes
from zbkit.splitgrad._groups import ParamGroup, find_stage_groups
from zbkit.splitgrad._pending import PendingGroup

MAX_PLANS = 32  # structures kept, least recently used dropped first (keys hold no tensors)
_MAX_MASKS = 16  # input-only lists kept per plan, one per pattern of eager groups


def walk(roots: Sequence[Node]) -> tuple[list[Node], dict[Node, int], list, dict[int, int]]:
    """(nodes in walk order, node -> position, the structure key, id(leaf) -> position)."""
    pos: dict[Node, int] = {}
    nodes: list[Node] = []
    for root in roots:
        if root not in pos:
            pos[root] = len(nodes)
            nodes.append(root)
    key: list = []  # per node: type, number of edges, then (producer, input_nr) per edge
    leaf_pos: dict[int, int] = {}
    i = 0
    while i < len(nodes):  # breadth first: `nodes` is the queue
        node = nodes[i]
        kind = type(node)
        key.append(kind if kind.__name__ != "CppFunction" else (kind, node.name()))
        leaf = getattr(node, "variable", None)  # only AccumulateGrad nodes have it
        if leaf is not None:
            leaf_pos[id(leaf)] = i
        edges = node.next_functions
        key.append(len(edges))
        for producer, nr in edges:
            if producer is None:  # an input that does not require grad
                p = -1
            else:
                seen = pos.get(producer)
                if seen is None:
                    seen = pos[producer] = len(nodes)
                    nodes.append(producer)
                p = seen
            key.append(p)
            key.append(nr)
        i += 1
    return nodes, pos, key, leaf_pos


@dataclass(frozen=True, eq=False)
class _GroupAt:
    """One ParamGroup in node positions (see ParamGroup for the fields)."""

    params: tuple[int, ...]
    weights: tuple[int, ...]  # the index in `weights` of each parameter's tensor
    intermediates: tuple[int, ...]
    exits: tuple[tuple[int, ...], ...]
    roots: tuple[int, ...]
    needs_both_directions: bool
    eager: tuple[tuple[int, int], ...]  # _fast.eager_candidates: (position, output_nr)


@dataclass(eq=False)
class StagePlan:
    """One structure's analysis, in node positions."""

    groups: tuple[_GroupAt, ...]
    closure: tuple[int, ...]  # C, the nodes I executes
    opaque: str | None  # a node in C whose backward must run once (see _whole)
    # which groups' weight halves I computed -> positions of the nodes W never runs: those
    # to free as soon as each has run in I (big saved tensors), and those to free after I
    input_only: dict[tuple, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    # position -> the saved-tensor attributes freed there (`_free.freeable`), as first seen
    slots: dict[int, tuple[str, ...]] = field(default_factory=dict)


@dataclass(eq=False)
class BoundPlan:
    """A StagePlan read onto one graph's nodes: what stage_backward_input uses."""

    groups: list[ParamGroup]
    tensors: list[list[torch.Tensor]]  # per group, its parameters (param_nodes order)
    eager: list[list[GradientEdge]]  # per group, _fast.eager_candidates
    plan: StagePlan
    nodes: list[Node]
    pos: dict[Node, int]

    @property
    def opaque(self) -> str | None:
        """The type of a node in C whose backward must run once (see _whole); None: none."""
        return self.plan.opaque

    def slot_names(self, node: Node) -> tuple[str, ...]:
        """What to free at `node` (`_free.release_named`), learned once per position."""
        p = self.pos[node]
        names = self.plan.slots.get(p)
        if names is None:
            names = freeable(node)
            if not hooked(node):  # a hooked forward (a first step counting what it saves)
                self.plan.slots[p] = names
        return names

    def input_only(self, works: list[PendingGroup], sizes: tuple) -> tuple[list[Node], list[Node]]:
        """_free.input_only_nodes, as (free when it has run, free when I ends), computed
        once per plan, pattern of eager groups and `sizes` (the outputs' shapes: what the
        saved tensors' sizes, which `_free.free_early` splits by, follow)."""
        mask = (tuple(bool(work.ready) for work in works), sizes)
        found = self.plan.input_only.get(mask)
        if found is None:
            closure = [self.nodes[p] for p in self.plan.closure]
            early, late = free_early(input_only_nodes(closure, works))
            found = (tuple(self.pos[n] for n in early), tuple(self.pos[n] for n in late))
            # sizes read through hooks are unknown (`free_early` counts them 0): not learned
            if len(self.plan.input_only) < _MAX_MASKS and not any(map(hooked, early + late)):
                self.plan.input_only[mask] = found
        return [self.nodes[p] for p in found[0]], [self.nodes[p] for p in found[1]]


class PlanCache:
    """StagePlans by structure key, least recently used dropped first; counts hits."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.plans: OrderedDict[tuple, StagePlan] = OrderedDict()
        self.hits = self.misses = 0
        self._lock = threading.Lock()  # stages may run I in several threads of one process

    def get(self, key: tuple) -> StagePlan | None:
        with self._lock:
            plan = self.plans.get(key)
            if plan is None:
                self.misses += 1
            else:
                self.hits += 1
                self.plans.move_to_end(key)
            return plan

    def put(self, key: tuple, plan: StagePlan) -> None:
        with self._lock:
            self.plans[key] = plan
            while len(self.plans) > self.maxsize:
                self.plans.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self.plans.clear()
            self.hits = self.misses = 0


PLANS = PlanCache(MAX_PLANS)


def _make_plan(
    output_nodes: list[Node],
    input_nodes: list[Node],
    weights: list[torch.Tensor],
    pos: dict[Node, int],
    weight_pos: tuple[int, ...],
) -> StagePlan:
    """The analysis of this graph (find_stage_groups), written in positions."""
    found = find_stage_groups(output_nodes, input_nodes, weights)
    first: dict[int, int] = {}  # position -> index of the first weight there (tied weights)
    for i, p in enumerate(weight_pos):
        if p >= 0:
            first.setdefault(p, i)
    groups = []
    for g in found.groups:
        eager = eager_candidates(g, found.reverse)
        groups.append(
            _GroupAt(
                params=tuple(pos[n] for n in g.param_nodes),
                weights=tuple(first[pos[n]] for n in g.param_nodes),
                intermediates=tuple(pos[n] for n in g.intermediates),
                exits=g.exits,
                roots=tuple(pos[n] for n in g.roots),
                needs_both_directions=g.needs_both_directions,
                eager=tuple((pos[e.node], e.output_nr) for e in eager),
            )
        )
    # an input node the outputs do not depend on is outside the graph: nothing to run there
    closure = tuple(pos[n] for n in found.closure if n in pos)
    return StagePlan(tuple(groups), closure, found.opaque)


def analyse_cached(
    output_nodes: list[Node], input_nodes: list[Node], weights: list[torch.Tensor]
) -> BoundPlan:
    """find_stage_groups for this graph, from the plan of its structure (made on a miss)."""
    nodes, pos, key, leaf_pos = walk(output_nodes)
    weight_pos = []
    for w in weights:  # as find_stage_groups finds each weight's node
        p = leaf_pos.get(id(w))
        if p is None and w.requires_grad and w.grad_fn is not None:  # a non-leaf: its own node
            p = pos.get(w.grad_fn)
        weight_pos.append(-1 if p is None else p)
    full_key = (
        tuple(key),
        tuple(pos.get(n, -1) for n in input_nodes),
        tuple(weight_pos),
        tuple(pos[n] for n in output_nodes),
    )
    plan = PLANS.get(full_key)
    if plan is None:
        plan = _make_plan(output_nodes, input_nodes, weights, pos, tuple(weight_pos))
        PLANS.put(full_key, plan)
    at = nodes.__getitem__  # position -> this graph's node
    groups = [
        ParamGroup(
            param_nodes=tuple(map(at, g.params)),
            intermediates=tuple(map(at, g.intermediates)),
            exits=g.exits,
            roots=tuple(map(at, g.roots)),
            needs_both_directions=g.needs_both_directions,
        )
        for g in plan.groups
    ]
    tensors = [list(map(weights.__getitem__, g.weights)) for g in plan.groups]
    eager = [[GradientEdge(at(p), nr) for p, nr in g.eager] if g.eager else [] for g in plan.groups]
    return BoundPlan(groups, tensors, eager, plan, nodes, pos)
