"""The weight pass (W): replay the backward from where I stopped, to the parameters.

The reference path, which is the whole idea: per parameter group, one
`torch.autograd.backward` that starts

- at the group's intermediates (the split points inside the input closure),
  with the gradients I captured arriving there, one per output edge, and
- at the outputs outside the input closure that feed the group (a first stage),
  with the caller's gradients,

and ends at the group's parameters (`inputs=`), so AccumulateGrad adds into
`.grad` and parameter hooks run as in a plain backward. The node between the
split point and the parameters (a matmul's weight half, a bias reduction) runs
now, for the first time: I skipped it.

Where the fast paths may be used (see _fast: same gradients, fewer engine
calls), groups with one built-in intermediate go through `_fast.run_batched`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch

from zbkit.splitgrad import _fast
from zbkit.splitgrad._backward import check_tensors
from zbkit.splitgrad._directions import GradDirection, grad_directions
from zbkit.splitgrad._pending import Captured, PendingGroup, PendingWeight
from zbkit.splitgrad._whole import explain_refusals

_BOTH = (GradDirection.INPUT, GradDirection.WEIGHT)


def _clamp(captured: Captured | None, grad_outputs: tuple) -> tuple:
    # W may reach this intermediate from a later one of the same group; what
    # arrives then is already part of `captured`, so replace it, never add
    return captured if captured is not None else tuple(None for _ in grad_outputs)


def run_group(work: PendingGroup, retain_graph: bool) -> None:
    """One group's W: one engine call from its start edges to its parameters.

    A parameter frozen since the forward (``requires_grad_(False)`` between I and W, say
    by a callback) gets no gradient, as in a plain backward, where its AccumulateGrad
    skips a tensor that no longer requires grad: W asks the engine for the others only.
    """
    edges, grads = work.start_edges()
    group = work.group
    wanted = [t for t in work.tensors if t.requires_grad]
    handles = []
    try:
        # always clamp: besides the double count of reused parameters, this also
        # undoes a second application of tensor hooks on the intermediates' inputs
        # (the engine runs them again in W; I already captured their result)
        if not work.ready:  # ready: W starts at the parameters, below every intermediate
            for node, captured in zip(group.intermediates, work.captured, strict=True):
                handles.append(node.register_prehook(functools.partial(_clamp, captured)))
        if edges and wanted:
            dirs = _BOTH if group.needs_both_directions else (GradDirection.WEIGHT,)
            with grad_directions(*dirs), explain_refusals():
                torch.autograd.backward(edges, grads, inputs=wanted, retain_graph=retain_graph)
    finally:
        for h in handles:
            h.remove()  # the hooks hold the captured gradients
        work.captured, work.roots, work.ready = [], [], []  # consumed: free the gradients


def stage_backward_weight(
    weights: Iterable[torch.Tensor],
    param_groups: PendingWeight,
    retain_graph: bool = False,
) -> tuple[torch.Tensor | None, ...]:
    """W: accumulate (add) the weight gradients of one I pass into `.grad`.

    `param_groups` is what one `stage_backward_input` returned for W
    (`result.pending_weight`, also reachable as `result.param_groups`); it is
    consumed: a second W on it raises. Returns the weights' `.grad` after the call.
    """
    weights = check_tensors("weights", list(weights))
    if not isinstance(param_groups, PendingWeight):
        raise TypeError(
            "stage_backward_weight takes the PendingWeight of one stage_backward_input "
            f"(result.pending_weight or result.param_groups), got {type(param_groups).__name__}; "
            "a list of ParamGroups is only the analysis, without the gradients I captured"
        )
    check = param_groups.check
    works = param_groups.take()  # raises if this microbatch's W already ran
    if check is not None:
        check.before_weight()
    # A group with several intermediates replays the C path between them, which
    # may cross other groups' intermediates: run those first and keep the graph.
    # A group with one intermediate only touches its own nodes, so it may free them.
    fast = _fast.use_fast_paths()
    shared, single, batched = [], [], []
    for work in works:
        if len(work.group.intermediates) > 1:
            shared.append(work)
        elif fast and _fast.batchable(work) and all(t.requires_grad for t in work.tensors):
            batched.append(work)
        else:
            single.append(work)
    del works  # each group now sits in one list alone, so W can let it go when done
    for work in shared:
        run_group(work, retain_graph=True)
    for work in single:
        run_group(work, retain_graph=retain_graph)
    if batched:
        _fast.run_batched(batched, retain_graph)  # empties `batched`
    if check is not None:
        check.after_weight()  # raises SplitMismatch, naming the weights that differ
    return tuple(w.grad for w in weights)
