"""Full, input-only (I) and weight-only (W) backward of a pipeline stage.

    I: one engine call from the outputs to the stage inputs. Prehooks on the
       intermediates (see _groups) record the gradients arriving there, into a
       PendingWeight (see _pending) that W consumes.
    W: per parameter group, one engine call from those intermediates (with the
       recorded gradients) and from outputs outside the input closure, to the
       group's parameters (see _weight). AccumulateGrad adds into `.grad` as usual.

Where the fast paths may be used (see _fast), a normalisation node (LayerNorm,
GroupNorm) whose parameters only it uses gets its weight gradients in I, from
the same kernel call as its input gradient; W then only adds them into `.grad`;
and the analysis (reverse graph, closure, groups) is made once per graph
structure and reused by position for every later graph of that shape (_plan).

After I then W every `.grad` equals what one `torch.autograd.backward` gives.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.graph import Node, get_gradient_edge

from zbkit.splitgrad._check import SplitCheck
from zbkit.splitgrad._directions import GradDirection, grad_directions
from zbkit.splitgrad._groups import find_stage_groups
from zbkit.splitgrad._input_fast import FastInput
from zbkit.splitgrad._pending import Captured, PendingGroup, PendingWeight
from zbkit.splitgrad._whole import explain_refusals, warn_whole

_BOTH = (GradDirection.INPUT, GradDirection.WEIGHT)


@dataclass(eq=False)
class BackwardInputResult:
    """What ``stage_backward_input`` returns: the input gradients (to send upstream now) and
    the weight pass still to run. Unpacks as torch's tuple:
    ``grads, param_groups = stage_backward_input(...)``."""

    input_grads: list[torch.Tensor | None]  # one per stage input (None: does not require grad)
    pending_weight: PendingWeight  # hand it to stage_backward_weight, once
    # the node that made this I run the whole backward (see _whole); None: split as usual
    whole: str | None = None

    @property
    def param_groups(self) -> PendingWeight:
        """The same PendingWeight, by its first name: a sequence of the ParamGroups."""
        return self.pending_weight

    # Unpacks like torch's (grads_input, param_groups) tuple: `grads, groups = result`; the
    # second hands to stage_backward_weight(weights, groups) as torch's does.
    def __iter__(self) -> Iterator[Any]:
        return iter((self.input_grads, self.pending_weight))

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> Any:
        return (self.input_grads, self.pending_weight)[index]


def check_tensors(name: str, values: Sequence) -> list[torch.Tensor]:
    values = list(values)
    for i, v in enumerate(values):
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"{name}[{i}] must be a Tensor, got {type(v).__name__}")
    return values


NO_GRAPH = (
    "it was computed without an autograd graph: a .detach() or .item() on the way, a "
    "forward under torch.no_grad() / inference_mode(), or every parameter it depends on "
    "frozen; loss.backward() would raise 'element 0 of tensors does not require grad'"
)


def _roots(
    outputs: Sequence[torch.Tensor], output_grads: Sequence[torch.Tensor | None] | None
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The (output, gradient) pairs a backward starts from; skips what carries no gradient.

    Raises, as ``loss.backward()`` does, when no output requires grad at all: a backward
    that silently trains nothing hides a stray ``.detach()``.
    """
    outputs = check_tensors("outputs", outputs)
    if outputs and not any(out.requires_grad for out in outputs):
        what = "the output" if len(outputs) == 1 else f"none of the {len(outputs)} outputs"
        raise RuntimeError(f"{what} requires grad: {NO_GRAPH}")
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
    return output_roots(outputs, output_grads)


def output_roots(
    outputs: Sequence[Any],
    output_grads: Sequence[torch.Tensor | None],
    names: Sequence[str] | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The (output, gradient) pairs a backward starts from, as two lists: an output with
    no gradient (None) or no graph (not a tensor requiring grad) is skipped, as the next
    stage did not differentiate through it; a gradient of another shape is a ValueError
    naming the output (`names[i]`, else `outputs[i]`). zbkit's one output-gradient filter:
    splitgrad's passes, the pipeline stages and torchpp all use it."""
    tensors, grads = [], []
    for i, (out, g) in enumerate(zip(outputs, output_grads, strict=True)):
        if g is None or not isinstance(out, torch.Tensor) or not out.requires_grad:
            continue
        if g.shape != out.shape:
            name = f"output {names[i]!r}" if names is not None else f"outputs[{i}]"
            raise ValueError(
                f"the gradient for {name} has shape {tuple(g.shape)}, but {name} has shape "
                f"{tuple(out.shape)}"
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
    inputs = check_tensors("inputs", inputs)
    tensors, grads = _roots(outputs, output_grads)
    result: list[torch.Tensor | None] = [None] * len(inputs)
    saved = [x.grad if x.is_leaf else None for x in inputs]
    handles = []

    def store(i: int, g: torch.Tensor) -> None:
        before = result[i]
        result[i] = g if before is None else before + g

    for i, x in enumerate(inputs):
        if x.requires_grad and x.is_leaf:
            x.grad = None  # AccumulateGrad then writes exactly this backward's gradient
        elif x.requires_grad:  # a non-leaf input: catch its gradient on the way through
            handles.append(x.register_hook(functools.partial(store, i)))
    try:
        if tensors:
            with grad_directions(*_BOTH), explain_refusals():
                torch.autograd.backward(tensors, grads)
    finally:
        for h in handles:
            h.remove()
        for i, x in enumerate(inputs):
            if x.requires_grad and x.is_leaf:
                result[i] = x.grad
                x.grad = saved[i]
    return result


def _input_pass(
    tensors: list[torch.Tensor], grads: list[torch.Tensor], targets: list[Any]
) -> tuple[torch.Tensor | None, ...]:
    """I's one engine call: from the outputs to `targets` (tensors or GradientEdges), in the
    input direction only, keeping the graph for W."""
    with grad_directions(GradDirection.INPUT), explain_refusals():
        # torch takes tensors and GradientEdges in one list; its stub wants one kind
        return torch.autograd.grad(tensors, targets, grads, retain_graph=True, allow_unused=True)


def _positions(nodes: list[Node]) -> dict[Node, list[int]]:
    at: dict[Node, list[int]] = {}
    for k, node in enumerate(nodes):
        at.setdefault(node, []).append(k)
    return at


def _capture(slots: list[Captured | None], i: int, grad_outputs: Captured) -> None:
    slots[i] = grad_outputs  # the whole tuple: one gradient per output edge of the node


def stage_backward_input(
    outputs: Sequence[torch.Tensor],
    output_grads: Sequence[torch.Tensor | None] | None,
    inputs: Sequence[torch.Tensor],
    weights: Iterable[torch.Tensor],
    retain_graph: bool = False,
    check: bool = False,
    where: str = "a stage",
) -> BackwardInputResult:
    """I: the inputs' gradients now; everything W needs is kept in `result.pending_weight`.

    No parameter's `.grad` changes. Call `stage_backward_weight` with the same
    weights and `result.pending_weight` (or `result.param_groups`, the same object)
    later, after any number of other I passes. Where the fast paths may be used,
    the tensors only I needs are freed when it returns (as a plain backward frees
    what it ran); `retain_graph=True` keeps the whole graph for another backward.

    A graph whose input gradients pass a node that must not run twice (a torch.compile
    region, see _whole) runs whole here, once: the weight gradients are computed too,
    W only adds them into `.grad` (`result.whole` names the node; a WholeBackwardWarning
    says so once per `where`, e.g. "stage 3"). `check=True` compares I and then W with one
    whole backward of the same graph and raises `SplitMismatch` where they differ (see
    _check).
    """
    inputs = check_tensors("inputs", inputs)
    weights = check_tensors("weights", list(weights))
    tensors, grads = _roots(outputs, output_grads)
    out_edges = [get_gradient_edge(t) for t in tensors]
    out_nodes = [e.node for e in out_edges]
    wanted = [x for x in inputs if x.requires_grad]
    input_nodes = [get_gradient_edge(x).node for x in wanted]
    run_i = bool(wanted and tensors)  # first stage: nothing to do here, W does it all
    fast = FastInput.start(out_nodes, input_nodes, weights, run_i)  # None: reference path only
    # the same analysis either way; the fast path keeps it per graph structure
    stage = fast.plan if fast else find_stage_groups(out_nodes, input_nodes, weights)
    if run_i and stage.opaque:
        return _whole_input(inputs, wanted, tensors, grads, stage, retain_graph, where)
    verify = None
    if check and run_i:  # the reference first, while the graph is whole
        verify, expected = SplitCheck.start(tensors, grads, wanted, weights)
    edges_at = _positions(out_nodes)  # output node -> its positions among the outputs
    works: list[PendingGroup] = []
    handles = []
    try:
        for i, group in enumerate(stage.groups):
            work = PendingGroup(group, tensors=stage.tensors[i])
            works.append(work)
            for root in group.roots:  # outputs outside the input closure start W directly
                work.roots += [(out_edges[k], grads[k]) for k in edges_at.get(root, ())]
            if fast and fast.take_group(i, work):  # I computes its weight grads itself
                continue
            work.captured = [None] * len(group.intermediates)  # what reaches its split points
            for j, node in enumerate(group.intermediates):
                handles.append(node.register_prehook(functools.partial(_capture, work.captured, j)))
        if fast and not retain_graph:
            handles += fast.free_early(works, tensors)
        found: tuple = ()
        if run_i:
            also = fast.ready_edges if fast else []  # the fast path's weight gradients in I
            found = _input_pass(tensors, grads, [*wanted, *also])
            if fast:
                fast.finish(works, found[len(wanted) :])
    finally:
        for h in handles:
            h.remove()  # hooks hold the captured lists; removing them breaks the cycle
    if verify is not None:
        verify.inputs(found[: len(wanted)], expected)
    input_grads = _per_input(inputs, found[: len(wanted)])
    return BackwardInputResult(input_grads, PendingWeight(works, verify))


def _per_input(inputs: list[torch.Tensor], found: Sequence) -> list[torch.Tensor | None]:
    """The gradients of the inputs that require grad, placed among all the inputs."""
    found_iter = iter(found)
    return [next(found_iter, None) if x.requires_grad else None for x in inputs]


def _whole_input(
    inputs: list[torch.Tensor],
    wanted: list[torch.Tensor],
    tensors: list[torch.Tensor],
    grads: list[torch.Tensor],
    stage: Any,
    retain_graph: bool,
    where: str,
) -> BackwardInputResult:
    """I for a graph that must not be split (see _whole): one engine call to the inputs and
    to every group's parameters; each group's W then only delivers its gradients."""
    works = [PendingGroup(g, tensors=stage.tensors[i]) for i, g in enumerate(stage.groups)]
    edges = [get_gradient_edge(t) for work in works for t in work.tensors]
    targets: list[Any] = [*wanted, *edges]  # torch takes both kinds in one list
    with grad_directions(*_BOTH), explain_refusals():
        found = torch.autograd.grad(
            tensors, targets, grads, retain_graph=retain_graph, allow_unused=True
        )
    of_weight = zip(edges, found[len(wanted) :], strict=True)
    for work in works:
        work.ready = [next(of_weight) for _ in work.tensors]
    warn_whole(stage.opaque, where)
    pending = PendingWeight(works)
    return BackwardInputResult(_per_input(inputs, found[: len(wanted)]), pending, stage.opaque)
