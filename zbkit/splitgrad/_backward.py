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

import contextlib
import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.graph import Node, get_gradient_edge

from zbkit.splitgrad import _fast, _plan
from zbkit.splitgrad._directions import GradDirection, grad_directions
from zbkit.splitgrad._free import release_named, release_when_run
from zbkit.splitgrad._groups import analyse_stage
from zbkit.splitgrad._pending import Captured, PendingGroup, PendingWeight

_BOTH = (GradDirection.INPUT, GradDirection.WEIGHT)


@dataclass(eq=False)
class BackwardInputResult:
    input_grads: list[torch.Tensor | None]  # one per stage input (None: does not require grad)
    pending_weight: PendingWeight  # hand it to stage_backward_weight, once

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


@contextlib.contextmanager
def reentrant_hint() -> Iterator[None]:
    """Names the cause when a reentrant activation checkpoint meets a split backward.

    ``checkpoint(..., use_reentrant=True)`` reruns its forward inside the backward and
    calls ``backward`` on it alone, which torch refuses inside ``.grad()`` or a backward
    with ``inputs=``: exactly the engine calls that split I from W.
    """
    try:
        yield
    except RuntimeError as exc:
        if "use_reentrant" not in str(exc):
            raise
        raise RuntimeError(
            "a reentrant activation checkpoint (torch.utils.checkpoint.checkpoint with "
            "use_reentrant=True) cannot be split into I and W: its backward reruns the "
            "forward and runs a whole backward of its own, which stops at no split point. "
            "Use checkpoint(..., use_reentrant=False) (torch's recommended form; HF models: "
            "gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': "
            "False})); gradients are the same"
        ) from exc


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
            with grad_directions(*_BOTH), reentrant_hint():
                torch.autograd.backward(tensors, grads)
    finally:
        for h in handles:
            h.remove()
        for i, x in enumerate(inputs):
            if x.requires_grad and x.is_leaf:
                result[i] = x.grad
                x.grad = saved[i]
    return result


def _capture(slots: list[Captured | None], i: int, grad_outputs: Captured) -> None:
    slots[i] = grad_outputs  # the whole tuple: one gradient per output edge of the node


def stage_backward_input(
    outputs: Sequence[torch.Tensor],
    output_grads: Sequence[torch.Tensor | None] | None,
    inputs: Sequence[torch.Tensor],
    weights: Iterable[torch.Tensor],
    retain_graph: bool = False,
) -> BackwardInputResult:
    """I: the inputs' gradients now; everything W needs is kept in `result.pending_weight`.

    No parameter's `.grad` changes. Call `stage_backward_weight` with the same
    weights and `result.pending_weight` (or `result.param_groups`, the same object)
    later, after any number of other I passes. Where the fast paths may be used,
    the tensors only I needs are freed when it returns (as a plain backward frees
    what it ran); `retain_graph=True` keeps the whole graph for another backward.
    """
    inputs = check_tensors("inputs", inputs)
    weights = check_tensors("weights", list(weights))
    tensors, grads = _roots(outputs, output_grads)

    out_edges = [get_gradient_edge(t) for t in tensors]
    out_nodes = [e.node for e in out_edges]
    input_nodes = [get_gradient_edge(x).node for x in inputs if x.requires_grad]
    fast = _fast.use_fast_paths()
    # the same analysis either way; the fast path keeps it per graph structure
    plan = _plan.analyse_cached(out_nodes, input_nodes, weights) if fast else None
    stage = plan if plan is not None else analyse_stage(out_nodes, input_nodes, weights)

    edges_at: dict[Node, list[int]] = {}
    for k, node in enumerate(out_nodes):
        edges_at.setdefault(node, []).append(k)
    wanted = [x for x in inputs if x.requires_grad]
    run_i = bool(wanted and tensors)  # first stage: nothing to do here, W does it all
    eager = plan if run_i else None  # may I compute LayerNorm weight halves? (the fast plan)
    works: list[PendingGroup] = []
    ready_edges = []  # the parameter edges of LayerNorm-like groups, asked for in I
    handles = []
    try:
        for i, group in enumerate(stage.groups):
            work = PendingGroup(group, tensors=stage.tensors[i])
            if plan is not None and len(group.intermediates) == 1:
                work.free = plan.slot_names(group.intermediates[0])
            works.append(work)
            for root in group.roots:  # outputs outside the input closure start W directly
                work.roots += [(out_edges[k], grads[k]) for k in edges_at.get(root, ())]
            edges = _fast.eager_edges(eager.eager[i]) if eager is not None else []
            if edges:  # nothing to capture: I hands W the parameter gradients
                work.ready = [(e, None) for e in edges]
                ready_edges += edges
                continue
            work.captured = [None] * len(group.intermediates)
            for j, node in enumerate(group.intermediates):
                handles.append(node.register_prehook(functools.partial(_capture, work.captured, j)))

        # what W never runs, to free when I returns: (node, its saved-tensor attributes)
        late: list[tuple[Node, tuple[str, ...]]] = []
        if eager is not None and not retain_graph:
            early, rest = eager.input_only(works, tuple(t.shape for t in tensors))
            handles += [release_when_run(node, eager.slot_names(node)) for node in early]
            late = [(node, eager.slot_names(node)) for node in rest]
        found: tuple = ()
        if run_i:
            with grad_directions(GradDirection.INPUT), reentrant_hint():
                # torch takes tensors and GradientEdges in one list; its stub wants one kind
                found = torch.autograd.grad(
                    tensors,
                    [*wanted, *ready_edges],  # type: ignore[arg-type]
                    grads,
                    retain_graph=True,
                    allow_unused=True,
                )
            ready_grads = iter(found[len(wanted) :])
            for work in works:
                work.ready = [(e, next(ready_grads)) for e, _ in work.ready]
            for node, names in late:
                release_named(node, names)
    finally:
        for h in handles:
            h.remove()  # hooks hold the captured lists; removing them breaks the cycle
    found_iter = iter(found[: len(wanted)])
    input_grads = [next(found_iter, None) if x.requires_grad else None for x in inputs]
    return BackwardInputResult(input_grads=input_grads, pending_weight=PendingWeight(works))
