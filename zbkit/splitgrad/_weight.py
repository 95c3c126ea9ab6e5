"""The weight pass (W): replay the backward from where I stopped, to the parameters.

Two ways, both exact:

- engine path (any group): one `torch.autograd.backward` per group, from the
  group's intermediates (with the gradients I captured there) and outputs outside
  the input closure, to the group's parameters. Simple, but each engine call
  walks the whole graph below its roots first (C++ bookkeeping of which nodes
  are needed), so on a deep stage W costs O(groups x nodes).
- batched path (a group with one built-in intermediate and no outputs outside
  the input closure: the common case): call every intermediate's backward
  ourselves, inside a tiny engine call whose bookkeeping says only the
  parameter-side edges are needed, so each node computes only its weight half;
  then one engine call delivers those gradients through the small
  parameter-side subgraphs into `.grad` (AccumulateGrad, hooks, layouts as usual).
  Two engine calls in all, whatever the number of groups.

  This leans on one engine detail: a built-in node called from Python while a
  backward runs computes only the outputs that backward's bookkeeping needs.
  Were that to change, W would still be exact, only slower (each node would
  also compute its input half); tests/splitgrad counts the matmuls to notice.
  Node hooks on the intermediate itself do not run in W (they ran in I).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch
from torch.autograd.function import BackwardCFunction
from torch.autograd.graph import GradientEdge, _engine_run_backward

from zbkit.splitgrad._backward import _check_tensors
from zbkit.splitgrad._directions import GradDirection, grad_directions
from zbkit.splitgrad._groups import ParamGroup

_BOTH = (GradDirection.INPUT, GradDirection.WEIGHT)


def _clamp(captured: tuple | None, grad_outputs: tuple) -> tuple:
    # W may reach this intermediate from a later one of the same group; what
    # arrives then is already part of `captured`, so replace it, never add
    return captured if captured is not None else tuple(None for _ in grad_outputs)


def _release(group: ParamGroup) -> None:
    """Drop every reference to the graph and the captured gradients."""
    group.intermediates = None
    group.grads = None
    group.root_edges = []
    group.root_grads = []
    group.tensors = []
    group.exits = []
    group.ready_edges = []
    group.ready_grads = []


def _check_pending(group: ParamGroup) -> None:
    if group.intermediates is None:
        raise RuntimeError(
            "this ParamGroup's weight pass already ran; run stage_backward_input again "
            "(a new forward) before another stage_backward_weight"
        )


def _run_group(group: ParamGroup, retain_graph: bool) -> None:
    """Engine path: one backward call for this group."""
    edges, grads = list(group.root_edges), list(group.root_grads)
    for node, captured in zip(group.intermediates, group.grads or (), strict=False):
        for k, g in enumerate(captured or ()):
            if g is not None:
                edges.append(GradientEdge(node, k))
                grads.append(g)
    handles = []
    try:
        # always clamp: besides the double count of reused parameters, this also
        # undoes a second application of tensor hooks on the intermediates' inputs
        # (the engine runs them again in W; I already captured their result)
        for node, captured in zip(group.intermediates, group.grads, strict=True):
            handles.append(node.register_prehook(functools.partial(_clamp, captured)))
        if edges:
            dirs = _BOTH if group.needs_both_directions else (GradDirection.WEIGHT,)
            with grad_directions(*dirs):
                torch.autograd.backward(
                    edges, grads, inputs=group.tensors, retain_graph=retain_graph
                )
    finally:
        for h in handles:
            h.remove()
        _release(group)


def _batchable(group: ParamGroup) -> bool:
    return (
        len(group.intermediates) == 1
        and not group.roots
        and group.grads[0] is not None
        and not isinstance(group.intermediates[0], BackwardCFunction)
    )


def _run_batched(groups: list[ParamGroup], ready: list[ParamGroup], retain_graph: bool) -> None:
    """Batched path: weight halves of many single-intermediate groups, two engine calls.

    `ready` groups had their weight gradients computed in I: they only join the
    delivery (no replay at all when every group is ready).
    """
    edges, grads, params = [], [], []
    if groups:
        for g, out, exits in zip(groups, *_replay(groups), strict=True):
            params += g.tensors
            for k, (n, nr) in zip(g.exits[0], exits, strict=True):
                if out[k] is not None:
                    edges.append(GradientEdge(n, nr))
                    grads.append(out[k])
            _release(g)
    for g in ready:
        params += g.tensors
        for edge, grad in zip(g.ready_edges, g.ready_grads, strict=True):
            if grad is not None:  # None: no gradient reached the node in I
                edges.append(edge)
                grads.append(grad)
        _release(g)
    if edges:
        # the engine's own entry point: it reduces broadcast gradients (a bias)
        # to the shape each node expects, like a normal backward does
        _engine_run_backward(
            tuple(edges),
            tuple(grads),
            retain_graph,
            False,  # create_graph
            tuple(params),
            allow_unreachable=True,
            accumulate_grad=True,
        )


def _replay(groups: list[ParamGroup]) -> tuple[list, list]:
    """Call each group's intermediate for its weight half: (outputs, exit edges) per group."""
    nodes = [g.intermediates[0] for g in groups]
    exit_edges = [
        [node.next_functions[k] for k in g.exits[0]] for g, node in zip(groups, nodes, strict=True)
    ]
    # the shape each exit edge's node expects: a Linear's bias gradient comes out
    # of AddmmBackward unreduced (as big as the captured gradient, often aliasing
    # it); reducing it right away, as the engine would, frees the capture now
    # instead of after the last group, so W's own allocations reuse that memory
    shapes = [[tuple(n._input_metadata[nr].shape) for n, nr in edges] for edges in exit_edges]
    results: list = [None] * len(groups)

    def replay(_grad_outputs: tuple) -> None:
        # runs inside the tiny engine call below: its bookkeeping lists exactly the
        # exit edges as needed, so each node skips its input half
        for i, (g, node) in enumerate(zip(groups, nodes, strict=True)):
            captured, g.grads = g.grads[0], None  # free each captured gradient once used
            out = list(node(*captured))
            del captured
            for k, shape in zip(g.exits[0], shapes[i], strict=True):
                if out[k] is not None and out[k].shape != shape:
                    out[k] = out[k].sum_to_size(shape)  # what the engine's check would do
            results[i] = out

    anchor = torch.zeros((), requires_grad=True)  # a one-node graph to hang `replay` on
    trigger = anchor.view_as(anchor)
    handle = trigger.grad_fn.register_prehook(replay)
    try:
        wanted = [GradientEdge(n, nr) for edges in exit_edges for n, nr in edges]
        torch.autograd.grad(trigger, [*wanted, anchor], torch.zeros(()), allow_unused=True)
    finally:
        handle.remove()
    return results, exit_edges


def stage_backward_weight(
    weights: Iterable[torch.Tensor],
    param_groups: list[ParamGroup],
    retain_graph: bool = False,
) -> tuple[torch.Tensor | None, ...]:
    """W: accumulate (add) the weight gradients of one I pass into `.grad`.

    Returns the weights' `.grad` after the call. `param_groups` are the groups
    of one `stage_backward_input`; each group's W runs once.
    """
    weights = _check_tensors("weights", list(weights))
    for group in param_groups:
        _check_pending(group)
    # A group with several intermediates replays the C path between them, which
    # may cross other groups' intermediates: run those first and keep the graph.
    # A group with one intermediate only touches its own nodes, so it may free them.
    ready = [g for g in param_groups if g.ready_edges]  # weight half already done in I
    rest = [g for g in param_groups if not g.ready_edges]
    shared = [g for g in rest if len(g.intermediates) > 1]
    batched = [g for g in rest if len(g.intermediates) <= 1 and _batchable(g)]
    single = [g for g in rest if len(g.intermediates) <= 1 and not _batchable(g)]
    for group in shared:
        _run_group(group, retain_graph=True)
    for group in single:
        _run_group(group, retain_graph=retain_graph)
    if batched or ready:
        _run_batched(batched, ready, retain_graph)
    return tuple(w.grad for w in weights)
