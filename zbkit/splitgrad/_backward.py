"""Full, input-only (I) and weight-only (W) backward of a pipeline stage.

    I: one engine call from the outputs to the stage inputs. Prehooks on the
       intermediates (see _groups) record the gradients arriving there.
    W: per parameter group, one engine call from those intermediates (with the
       recorded gradients) and from outputs outside the input closure, to the
       group's parameters. AccumulateGrad adds into `.grad` as usual.

One exception: a normalisation node (LayerNorm, GroupNorm) whose parameters
only it uses gets its weight gradients in I, from the same kernel call as its
input gradient (see _EAGER_NODES); W then only adds them into `.grad`.

After I then W every `.grad` equals what one `torch.autograd.backward` gives.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

from zbkit.splitgrad._directions import GradDirection, grad_directions
from zbkit.splitgrad._graph import build_reverse_graph, grad_node
from zbkit.splitgrad._groups import ParamGroup, group_params

_BOTH = (GradDirection.INPUT, GradDirection.WEIGHT)


@dataclass(eq=False)
class BackwardInputResult:
    input_grads: list[torch.Tensor | None]  # one per stage input (None: does not require grad)
    param_groups: list[ParamGroup]  # hand these to stage_backward_weight


def _check_tensors(name: str, values: Sequence) -> list[torch.Tensor]:
    values = list(values)
    for i, v in enumerate(values):
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"{name}[{i}] must be a Tensor, got {type(v).__name__}")
    return values


def _roots(
    outputs: Sequence[torch.Tensor], output_grads: Sequence[torch.Tensor | None] | None
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The (output, gradient) pairs a backward starts from; skips what carries no gradient."""
    outputs = _check_tensors("outputs", outputs)
    if output_grads is None:
        for i, out in enumerate(outputs):
            if out.requires_grad and out.numel() != 1:
                raise ValueError(
                    f"output_grads=None means scalar losses, but outputs[{i}] has shape "
                    f"{tuple(out.shape)}; pass its gradient in output_grads"
                )
        output_grads = [torch.ones_like(o) if o.requires_grad else None for o in outputs]
    elif len(output_grads) != len(outputs):
        raise ValueError(
            f"got {len(outputs)} outputs but {len(output_grads)} output_grads; "
            "pass one gradient (or None) per output"
        )
    tensors, grads = [], []
    for i, (out, g) in enumerate(zip(outputs, output_grads, strict=True)):
        if g is None or not out.requires_grad:
            continue  # None: this output receives no gradient
        if g.shape != out.shape:
            raise ValueError(
                f"output_grads[{i}] has shape {tuple(g.shape)} but outputs[{i}] has "
                f"shape {tuple(out.shape)}"
            )
        tensors.append(out)
        grads.append(g)
    return tensors, grads


def stage_backward_full(
    outputs: Sequence[torch.Tensor],
    output_grads: Sequence[torch.Tensor | None] | None,
    inputs: Sequence[torch.Tensor],
) -> list[torch.Tensor | None]:
    """Plain backward: returns the inputs' gradients, accumulates parameters' `.grad`.

    `inputs[i].grad` is left as it was (the gradient is returned instead).
    """
    inputs = _check_tensors("inputs", inputs)
    tensors, grads = _roots(outputs, output_grads)
    result: list[torch.Tensor | None] = [None] * len(inputs)
    saved = [x.grad if x.is_leaf else None for x in inputs]
    handles = []

    def store(i: int, g: torch.Tensor) -> None:
        result[i] = g if result[i] is None else result[i] + g

    for i, x in enumerate(inputs):
        if x.requires_grad and x.is_leaf:
            x.grad = None  # AccumulateGrad then writes exactly this backward's gradient
        elif x.requires_grad:  # a non-leaf input: catch its gradient on the way through
            handles.append(x.register_hook(functools.partial(store, i)))
    try:
        if tensors:
            with grad_directions(*_BOTH):
                torch.autograd.backward(tensors, grads)
    finally:
        for h in handles:
            h.remove()
        for i, x in enumerate(inputs):
            if x.requires_grad and x.is_leaf:
                result[i] = x.grad
                x.grad = saved[i]
    return result


# Nodes whose weight half is cheap next to what splitting it off costs. A
# LayerNorm's weight gradients are two row reductions (O(N*d), like its input
# half), but computed alone in W they first recompute the normalised input, and
# W needs the node's incoming gradient (N*d floats) kept alive from I. So I asks
# for them too: one fused kernel call, exactly as plain backward makes it, and
# only two d-sized gradients wait for W. Matmul-like nodes stay split: their
# weight half is the expensive part that W exists to defer.
_EAGER_NODES = frozenset({"NativeLayerNormBackward0", "NativeGroupNormBackward0"})


def _eager_edges(
    group: ParamGroup, reverse: dict[Node, list[Node]], weight_of: dict[Node, torch.Tensor]
) -> list[GradientEdge]:
    """The parameter edges of a group whose weight half I may compute ([] if not eligible).

    Eligible: one intermediate of a type in _EAGER_NODES, no outputs outside the
    input closure, and every parameter of the group a leaf fed by that node
    alone (so capturing its edge in I sees exactly what plain backward would
    deliver) and without tensor hooks (capturing runs them; W would run them again).
    """
    if len(group.intermediates) != 1 or group.roots or group.needs_both_directions:
        return []
    node = group.intermediates[0]
    if type(node).__name__ not in _EAGER_NODES:
        return []
    edges = []
    for k in group.exits[0]:
        param, nr = node.next_functions[k]
        leaf = getattr(param, "variable", None)  # only AccumulateGrad nodes have it
        if leaf is None or reverse.get(param) != [node] or leaf._backward_hooks:
            return []
        edges.append(GradientEdge(param, nr))
    return edges if len(edges) == len(group.params) else []


def _capture(slots: list, i: int, grad_outputs: tuple) -> None:
    slots[i] = grad_outputs  # the whole tuple: one gradient per output edge of the node


def stage_backward_input(
    outputs: Sequence[torch.Tensor],
    output_grads: Sequence[torch.Tensor | None] | None,
    inputs: Sequence[torch.Tensor],
    weights: Iterable[torch.Tensor],
) -> BackwardInputResult:
    """I: the inputs' gradients now; everything W needs is kept in the returned groups.

    No parameter's `.grad` changes. Call `stage_backward_weight` with the same
    weights and `result.param_groups` later (after any number of other I passes).
    """
    inputs = _check_tensors("inputs", inputs)
    weights = _check_tensors("weights", list(weights))
    tensors, grads = _roots(outputs, output_grads)

    out_edges = [get_gradient_edge(t) for t in tensors]
    input_nodes = [grad_node(x) for x in inputs if x.requires_grad]
    reverse = build_reverse_graph([e.node for e in out_edges])

    # node of each weight; tied weights share one AccumulateGrad node. Reading
    # the leaves off the graph's AccumulateGrad nodes is much cheaper than asking
    # every parameter for its node (that builds a throwaway view per parameter).
    leaf_node = {}
    for node in reverse:
        leaf = getattr(node, "variable", None)  # only AccumulateGrad nodes have it
        if leaf is not None:
            leaf_node[id(leaf)] = node
    weight_of: dict[Node, torch.Tensor] = {}
    for w in weights:
        node = leaf_node.get(id(w))
        if node is None and w.requires_grad and not w.is_leaf:
            node = w.grad_fn
        if node is not None:  # None: frozen, or the outputs do not depend on it
            weight_of.setdefault(node, w)
    groups = group_params(
        input_nodes, list(weight_of), reverse, output_nodes=[e.node for e in out_edges]
    )

    edges_at: dict[Node, list[int]] = {}
    for k, e in enumerate(out_edges):
        edges_at.setdefault(e.node, []).append(k)
    wanted = [x for x in inputs if x.requires_grad]
    run_i = bool(wanted and tensors)  # first stage: nothing to do here, W does it all
    eager: list[ParamGroup] = []  # groups whose weight half I computes (see _EAGER_NODES)
    handles = []
    try:
        for group in groups:
            group.tensors = [weight_of[p] for p in group.param_order]
            for root in group.roots:  # outputs outside the input closure start W directly
                for k in edges_at.get(root, ()):
                    group.root_edges.append(out_edges[k])
                    group.root_grads.append(grads[k])
            group.grads = [None] * len(group.intermediates)
            group.ready_edges = _eager_edges(group, reverse, weight_of) if run_i else []
            if group.ready_edges:
                eager.append(group)
                continue  # nothing to capture: I hands W the parameter gradients
            for i, node in enumerate(group.intermediates):
                handles.append(node.register_prehook(functools.partial(_capture, group.grads, i)))

        found: tuple = ()
        if run_i:
            ready = [e for group in eager for e in group.ready_edges]
            with grad_directions(GradDirection.INPUT):
                found = torch.autograd.grad(
                    tensors, [*wanted, *ready], grads, retain_graph=True, allow_unused=True
                )
            ready_grads = iter(found[len(wanted) :])
            for group in eager:
                group.ready_grads = [next(ready_grads) for _ in group.ready_edges]
    finally:
        for h in handles:
            h.remove()  # hooks hold the groups; removing them breaks the cycle
    found_iter = iter(found[: len(wanted)])
    input_grads = [next(found_iter, None) if x.requires_grad else None for x in inputs]
    return BackwardInputResult(input_grads=input_grads, param_groups=groups)
