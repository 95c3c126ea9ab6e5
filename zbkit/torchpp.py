"""zbkit's exact split backward inside torch.distributed.pipelining's own runtime.

torch's zero-bubble schedules (ScheduleZBVZeroBubble, ScheduleInterleavedZeroBubble,
ScheduleDualPipeV: every schedule with separate I and W actions) split a stage's backward
through two functions that torch's `stage.py` looks up in its own module at call time::

    stage.backward_one_chunk(j, full_backward=False)                      # I
        grads, param_groups = stage_backward_input(outputs, output_grads, inputs, params)
        stage.backward_state[j] = (inputs, param_groups, outputs, output_grads)
    stage.backward_weight_one_chunk(j)                                    # W
        stage_backward_weight(params, param_groups)

(The first stage skips I and runs a full `stage_backward` at W; a full backward `B` is
`stage_backward` too. Neither is touched here.) On torch 2.13 that split gets two graphs
wrong: a stage whose output is a view fails in I ("Can't detach views in-place", torch
detaches every output in place), and a parameter used twice with a layer between (tied
weights) fails in W ("Trying to backward through the graph a second time": its group
walks the graph once per split point, freeing it after the first).

While enabled, those two names in torch's stage module are zbkit.splitgrad's I and W,
with torch's signatures and result shapes; everything else in torch runs unchanged::

    import zbkit.torchpp

    with zbkit.torchpp.exact_split_backward():   # or enable() ... disable()
        schedule.step(x, target=y, losses=losses)

See docs/architecture.md, section torchpp.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch.distributed.pipelining import _backward as torch_backward
from torch.distributed.pipelining import stage as torch_stage

from zbkit import splitgrad

__all__ = [
    "ExactParamGroups",
    "disable",
    "enable",
    "exact_split_backward",
    "is_enabled",
    "stage_backward_input",
    "stage_backward_weight",
]


class ExactParamGroups:
    """What torch's stage keeps in `backward_state` between one microbatch's I and W.

    torch only stores it and hands it back to `stage_backward_weight`; it holds zbkit's
    `PendingWeight` (consumed once by W). torch's own W iterates its param groups, so
    iterating this raises: that W ran after `disable()` on an I made while enabled.
    """

    __slots__ = ("pending",)

    def __init__(self, pending: splitgrad.PendingWeight) -> None:
        self.pending = pending

    def __iter__(self) -> Iterator[Any]:
        raise RuntimeError(
            "this microbatch's I ran under zbkit.torchpp's exact split backward, but its W "
            "is running under torch's own stage_backward_weight: keep the whole "
            "schedule.step(...) inside `with zbkit.torchpp.exact_split_backward():`"
        )

    def __repr__(self) -> str:
        return f"ExactParamGroups({self.pending!r})"


def stage_backward_input(
    stage_outputs_or_loss: Sequence[Any],
    output_grads: Sequence[torch.Tensor | None] | None,
    input_values: Sequence[Any],
    weights: Iterable[torch.Tensor],
) -> tuple[tuple[torch.Tensor | None, ...], ExactParamGroups]:
    """I, as torch's `stage_backward_input`: (one gradient per input value, param groups).

    `output_grads=None` means the outputs are the loss (torch gives them ones). Non-tensor
    inputs get None, as in torch. Unlike torch, the inputs' `.grad` is left alone: the
    gradients go upstream through the returned tuple (torch's full `stage_backward` also
    leaves `.grad` None, so a buffer does not hold them until the step ends).
    """
    outputs = list(stage_outputs_or_loss)
    if output_grads is None:  # the outputs are the loss: torch gives them ones
        output_grads = [
            torch.ones_like(o) if isinstance(o, torch.Tensor) and o.requires_grad else None
            for o in outputs
        ]
        if outputs and all(g is None for g in output_grads):  # torch's backward refuses it
            raise RuntimeError(
                "the loss does not require grad, so this step would train nothing; "
                + splitgrad.NO_GRAPH
            )
    # like torch: an output that carries no graph (or no gradient) takes no part
    roots, grads = splitgrad.output_roots(outputs, output_grads)
    tensor_at = [k for k, v in enumerate(input_values) if isinstance(v, torch.Tensor)]
    params = [w for w in weights if w.requires_grad]  # a frozen parameter gets no gradient
    tensors = [input_values[k] for k in tensor_at]
    result = splitgrad.stage_backward_input(
        roots, grads, tensors, params, check=_PATCH.wants_check(params, tensors)
    )
    dinputs: list[torch.Tensor | None] = [None] * len(input_values)
    for k, g in zip(tensor_at, result.input_grads, strict=True):
        dinputs[k] = g
    # torch detaches the outputs here so they stop holding the graph until W (W starts
    # from nodes the PendingWeight holds, not from these tensors); a view cannot be
    # detached in place, so it keeps its graph until torch drops it after W, as
    # torch's own stage.py does for the last stage's outputs
    for t in outputs:
        if isinstance(t, torch.Tensor) and t.grad_fn is not None and not t._is_view():
            t.detach_()
    return tuple(dinputs), ExactParamGroups(result.pending_weight)


def stage_backward_weight(
    weights: Iterable[torch.Tensor], param_groups: Any, retain_graph: bool = False
) -> tuple[torch.Tensor | None, ...]:
    """W, as torch's `stage_backward_weight`: adds one microbatch's weight gradients to `.grad`.

    Returns the weights' `.grad`. `param_groups` is what `stage_backward_input` above
    returned; a list of torch's own param groups (an I that ran before `enable()`) is
    finished by torch's function, since zbkit cannot redo an I it did not run.
    """
    if not isinstance(param_groups, ExactParamGroups):
        # torch annotates Iterator[Parameter]; its loop takes any iterable of tensors
        return torch_backward.stage_backward_weight(
            weights,  # type: ignore[arg-type]
            param_groups,
            retain_graph,
        )
    return splitgrad.stage_backward_weight(weights, param_groups.pending, retain_graph=retain_graph)


# torch's names, the drop-ins, and the parameters torch's stage.py passes (checked on
# enable(), so a torch whose call changed is refused instead of patched)
_DROP_INS: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "stage_backward_input": (
        stage_backward_input,
        ("stage_outputs_or_loss", "output_grads", "input_values", "weights"),
    ),
    "stage_backward_weight": (stage_backward_weight, ("weights", "param_groups")),
}


class _Patch:
    """The functions enable() replaced in torch's stage module; None while disabled."""

    def __init__(self) -> None:
        self.saved: dict[str, Callable[..., Any]] | None = None
        self.check = False  # check_split: the first I of each stage and input shape
        self.checked: set[tuple] = set()

    def wants_check(self, params: list[torch.Tensor], inputs: list[torch.Tensor]) -> bool:
        """Whether this I is checked: check_split is on and this stage (its parameters) has
        not been checked on inputs of these shapes yet."""
        if not self.check:
            return False
        key = (tuple(map(id, params)), tuple((tuple(x.shape), x.dtype) for x in inputs))
        if key in self.checked:
            return False
        self.checked.add(key)
        return True


_PATCH = _Patch()


def is_enabled() -> bool:
    """Whether torch's stage module runs zbkit's split backward now."""
    return _PATCH.saved is not None


def _check_torch() -> dict[str, Callable[..., Any]]:
    found = {}
    for name, (_, expected) in _DROP_INS.items():
        fn = getattr(torch_stage, name, None)
        if fn is None:
            raise RuntimeError(
                f"torch {torch.__version__}'s torch.distributed.pipelining.stage has no "
                f"{name}; zbkit.torchpp replaces it there and cannot run on this torch"
            )
        params = tuple(inspect.signature(fn).parameters)
        if params[: len(expected)] != expected:
            raise RuntimeError(
                f"torch {torch.__version__}'s stage.{name} takes {params}, zbkit.torchpp's "
                f"drop-in takes {expected}: not patched, torch's split backward is unchanged"
            )
        found[name] = fn
    return found


def enable(check_split: bool = False) -> None:
    """Make torch's pipeline stages run zbkit's I and W; undo with `disable()`.

    ``check_split=True``: the first I of each stage and input shape also runs one whole
    backward of the same graph, and I then W must give its gradients, else they raise
    ``zbkit.splitgrad.SplitMismatch`` naming the weights (by position and shape) that
    differ. Refuses a second enable(): the inner disable() would end the outer one's span.
    """
    if _PATCH.saved is not None:
        raise RuntimeError(
            "zbkit.torchpp's exact split backward is already enabled; enabling it again "
            "inside would undo it at the inner exit. Keep one `with exact_split_backward():` "
            "(or one enable()/disable() pair) around the steps"
        )
    saved = _check_torch()
    _PATCH.saved = saved
    _PATCH.check, _PATCH.checked = check_split, set()
    for name, (drop_in, _) in _DROP_INS.items():
        setattr(torch_stage, name, drop_in)


def disable() -> None:
    """Put back the functions `enable()` found in torch's stage module."""
    saved = _PATCH.saved
    if saved is None:
        raise RuntimeError("zbkit.torchpp.disable() without enable(): nothing to undo")
    _PATCH.saved = None
    _PATCH.check, _PATCH.checked = False, set()
    replaced = []
    for name, (drop_in, _) in _DROP_INS.items():
        now = getattr(torch_stage, name)
        if now is drop_in:
            setattr(torch_stage, name, saved[name])
        else:  # someone patched over ours: theirs stays, and they are named
            replaced.append(f"stage.{name} is now {now!r}")
    if replaced:
        raise RuntimeError(
            "zbkit.torchpp.disable(): torch's functions were replaced again while enabled "
            f"({'; '.join(replaced)}); left those in place"
        )


@contextlib.contextmanager
def exact_split_backward(check_split: bool = False) -> Iterator[None]:
    """`with exact_split_backward(): schedule.step(...)`: enable(), and disable() on exit,
    also when the body raises. ``check_split``: see `enable`."""
    enable(check_split)
    try:
        yield
    finally:
        disable()
