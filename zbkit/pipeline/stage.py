"""One pipeline stage: a module plus the per-microbatch state its F, I, W and B actions share.

A stage never talks to other stages. It is handed the tensors an action consumes (its inputs
for F, the gradients of its outputs for I and B) and returns what that action produces (its
outputs, the gradients of its inputs); the executors move those between stages.

Per microbatch ``j`` the state walks through two caches::

    F(j)          -> _activations[j]  = inputs, outputs (graph attached), loss root
    I(j)          -> _weight_tasks[j] = what W(j) needs; the activation entry is gone
    W(j)          -> nothing left
    B(j) = I + W  -> nothing left

The sizes of those two caches are what the simulator's memory model counts (F adds an
activation, I turns it into pending weight state, W and B free it), so the runner can record
them and compare with ``Simulation.peak_memory``; ``held_activation_bytes`` says what the
activations weigh in bytes (the tensors autograd saved, see ``_saved.py``). The forms its
tensors take (zbkit's dicts, torch's Tensors and tuples) are turned into one another in
``_forms.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from zbkit import splitgrad
from zbkit.pipeline import _forms
from zbkit.pipeline._forms import Tensors
from zbkit.pipeline._saved import count_saved, signature

Message = dict[str, torch.Tensor | None]  # what travels: a None keeps its place in a tuple


@dataclass(slots=True)
class _Activation:
    inputs: Tensors  # what F consumed; floating ones require grad on stages > 0
    outputs: Tensors  # what F produced, graph attached
    loss: torch.Tensor | None = None  # last stage: the (scaled) scalar the backward starts from
    nbytes: int = 0  # bytes of the tensors autograd saved for this microbatch's backward
    key: tuple = ()  # the inputs' names, shapes and dtypes (`_saved.signature`)


@dataclass(slots=True)
class _WeightTask:
    """The W one microbatch still owes after its I: the split W, or the whole backward
    deferred to W (stage 0, or a stage with no input gradient to send)."""

    roots: list[torch.Tensor]  # deferred full backward: where it starts
    split: splitgrad.PendingWeight | None = None  # from stage_backward_input; None: a full B
    root_grads: list[torch.Tensor] | None = None  # only for the deferred full backward


class StageError(RuntimeError):
    """A stage's module or its bookkeeping failed; the message names the stage and microbatch."""


class PipelineStage:
    """Wraps ``module`` as stage ``stage_index`` of ``num_stages`` (on ``device``, if given).

    ``module(**inputs)`` returns ``dict[str, Tensor]`` (zbkit's form: outputs by name), or, as
    torch.distributed.pipelining's stages do, a ``Tensor`` or a tuple of them. Those travel as
    ``{"0": t0, "1": t1, ...}`` and a module whose inputs all have such keys is called
    positionally, ``module(t0, t1, ...)``; the loss sees the module's own form
    (``module_output``). Outputs that require grad get a gradient back from the next stage;
    the others (token ids, masks) are passed along as data.

    Stage 0 has no input gradient to send, so by default its I only records the microbatch and
    the whole backward runs at its W. ``split_first_stage=True`` instead makes stage 0's
    floating-point inputs require grad, so its I really backpropagates through the stage (and
    computes a gradient for the data that is thrown away) and its W only does the weights: the
    F / I / W times then match what the simulator assumes for every stage.

    ``check_split=True`` checks the split on real data: the first microbatch of each input
    shape that runs I also gets one whole backward of the same graph, and I then W must give
    its gradients (``splitgrad.stage_backward_input(check=True)``); a difference raises a
    ``StageError`` naming the parameters. The runners' ``check_split`` sets it.
    """

    def __init__(
        self,
        module: nn.Module,
        stage_index: int,
        num_stages: int,
        device: torch.device | str | None = None,
        *,
        split_first_stage: bool = False,
        check_split: bool = False,
        **torch_only: Any,
    ) -> None:
        if torch_only:
            _refuse_torch_only(stage_index, torch_only)
        if not isinstance(module, nn.Module):
            raise TypeError(f"stage {stage_index}: expected an nn.Module, got {type(module)!r}")
        if not 0 <= stage_index < num_stages:
            raise ValueError(f"stage_index {stage_index} is outside 0..{num_stages - 1}")
        if device is not None:  # torch's 4th argument: here the module is moved there
            module.to(device)
        self.module = module
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.split_first_stage = split_first_stage and stage_index == 0
        self.check_split = check_split
        self._checked: set[tuple] = set()  # input signatures whose split was checked
        self._activations: dict[int, _Activation] = {}
        self._weight_tasks: dict[int, _WeightTask] = {}
        self._saved_bytes: dict[tuple, int] = {}  # input signature -> bytes one F saves
        self._returns: type | int = dict  # the module's output: dict, Tensor or a tuple's length

    # ------------------------------------------------------------------ properties
    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    @property
    def held_activations(self) -> int:
        """Microbatches between F and I/B (the simulator's ``mem_activation`` units)."""
        return len(self._activations)

    @property
    def held_activation_bytes(self) -> int:
        """Bytes of saved activations of the microbatches between F and I/B."""
        return sum(a.nbytes for a in self._activations.values())

    @property
    def held_weight_state(self) -> int:
        """Microbatches between I and W (the simulator's ``mem_weight`` units)."""
        return len(self._weight_tasks)

    def __repr__(self) -> str:
        return (
            f"PipelineStage({type(self.module).__name__}, stage {self.stage_index}"
            f"/{self.num_stages}, holding {self.held_activations} activations, "
            f"{self.held_weight_state} pending W)"
        )

    def _name(self, microbatch: int) -> str:
        return f"stage {self.stage_index} microbatch {microbatch}"

    def _weights(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def _weight_names(self) -> list[str]:  # in `_weights()` order
        return [n for n, p in self.module.named_parameters() if p.requires_grad]

    # ------------------------------------------------------------------ F
    def forward(self, microbatch: int, inputs: Mapping[str, Any] | torch.Tensor | tuple) -> Message:
        """Runs the module on one microbatch and caches what its backward will need.

        ``inputs`` is a dict of keyword tensors; a bare tensor (stage 0's data) is passed
        positionally, and so is a tuple (stage 0 with several inputs, torch's
        ``step(x1, x2, ...)``). A ``None`` keeps its place: an HF-style ``(hidden, None,
        mask)`` from the previous stage arrives as ``module(hidden, None, mask)``.
        Returns the outputs by name, ``None`` ones included (they travel as ``None``).
        """
        if microbatch in self._activations or microbatch in self._weight_tasks:
            raise StageError(f"{self._name(microbatch)}: forward ran twice before its backward")
        if self.split_first_stage:  # leaves that collect a (discarded) gradient: see __init__
            inputs = _forms.as_leaves(inputs)
        if isinstance(inputs, torch.Tensor):
            args, inputs = (inputs,), {"input": inputs}
        elif isinstance(inputs, tuple | list):
            args, inputs = tuple(inputs), {str(i): v for i, v in enumerate(inputs)}
        elif isinstance(inputs, Mapping):
            args = _forms.positional(inputs)  # a Tensor / tuple the previous stage returned
        else:
            raise StageError(
                f"{self._name(microbatch)}: inputs must be a tensor, a tuple or a dict of "
                f"tensors, got {type(inputs).__name__}"
            )
        run = lambda: self.module(*args, **({} if args else inputs))  # noqa: E731
        key = signature(inputs)
        try:
            if key in self._saved_bytes:  # one shape saves the same bytes: counted once
                out, nbytes = run(), self._saved_bytes[key]
            else:
                out, nbytes = count_saved(self.module, run)
                self._saved_bytes[key] = nbytes
        except Exception as exc:  # re-raised with the stage named; the cause keeps its trace
            raise StageError(
                f"{self._name(microbatch)}: the module's forward raised "
                f"{type(exc).__name__}: {exc} (inputs: {_forms.describe(inputs)})"
            ) from exc
        form = _forms.as_dict(out)
        if form is None:
            raise StageError(f"{self._name(microbatch)}: {_forms.unknown_form(out)}")
        out, self._returns = form
        outputs = {k: v for k, v in out.items() if v is not None}  # what the backward starts at
        self._activations[microbatch] = _Activation(dict(inputs), outputs, nbytes=nbytes, key=key)
        return dict(out)

    def module_output(self, outputs: Message) -> Any:
        """``outputs`` (what ``forward`` returned) in the module's own form: the dict, the
        Tensor or the tuple, as a torch-style ``loss_fn(output, target)`` expects it."""
        if isinstance(self._returns, int):  # a tuple of that many
            return tuple(outputs.get(str(i)) for i in range(self._returns))
        if self._returns is torch.Tensor:
            return outputs["0"]
        return outputs

    def set_loss(self, microbatch: int, loss: torch.Tensor) -> None:
        """Last stage: the backward of ``microbatch`` starts from this scalar."""
        if not self.is_last:
            raise StageError(f"{self._name(microbatch)}: only the last stage takes a loss")
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise StageError(
                f"{self._name(microbatch)}: loss_fn must return a scalar tensor, got {loss!r}"
            )
        if not loss.requires_grad:  # as loss.backward() refuses, instead of training nothing
            mode = " (grad mode is off here: the step runs under torch.no_grad())"
            raise StageError(
                f"{self._name(microbatch)}: the loss does not require grad, so this step "
                f"would train nothing; {splitgrad.NO_GRAPH}"
                f"{mode if not torch.is_grad_enabled() else ''}"
            )
        self._take_activation(microbatch, "set_loss", pop=False).loss = loss

    # ------------------------------------------------------------------ I, W, B
    def backward_input(
        self, microbatch: int, output_grads: Mapping[str, torch.Tensor] | None
    ) -> Tensors:
        """I: gradients of this stage's inputs; the weight gradients wait for W.

        Stage 0 has no input gradient to send, so its I only records what to do and the
        whole backward runs at W (the simulator still counts the microbatch as pending W).
        """
        act = self._take_activation(microbatch, "I")
        roots, grads = self._roots(microbatch, act, output_grads)
        use_inputs = not self.is_first or self.split_first_stage
        names, inputs = _forms.grad_inputs(act.inputs) if use_inputs else ([], [])
        if not inputs or not roots:  # no input gradient to compute: run it all at W
            self._weight_tasks[microbatch] = _WeightTask(roots, None, grads)
            return {}
        check = self.check_split and act.key not in self._checked
        if check:
            self._checked.add(act.key)
        with self._naming(microbatch, "I", names):
            result = splitgrad.stage_backward_input(
                roots,
                grads,
                inputs,
                self._weights(),
                check=check,
                where=f"stage {self.stage_index}",
            )
        # the pending W holds the graph it walks; the outputs themselves can go
        self._weight_tasks[microbatch] = _WeightTask([], result.pending_weight)
        return {} if self.is_first else _forms.named_grads(names, result.input_grads)

    def backward_weight(self, microbatch: int) -> None:
        """W: accumulates this microbatch's weight gradients into ``.grad``."""
        pending = self._weight_tasks.pop(microbatch, None)
        if pending is None:
            state = "has not run F" if microbatch not in self._activations else "has not run I"
            raise StageError(f"{self._name(microbatch)}: W before I ({state})")
        with self._naming(microbatch, "W"):
            if pending.split is None:  # deferred full backward (stage 0, or nothing to send)
                if pending.roots:
                    splitgrad.stage_backward_full(pending.roots, pending.root_grads, [])
                return
            splitgrad.stage_backward_weight(self._weights(), pending.split)

    def backward_full(
        self, microbatch: int, output_grads: Mapping[str, torch.Tensor] | None
    ) -> Tensors:
        """B = I then W in one autograd pass."""
        act = self._take_activation(microbatch, "B")
        roots, grads = self._roots(microbatch, act, output_grads)
        if not roots:
            return {}
        names, inputs = _forms.grad_inputs(act.inputs) if not self.is_first else ([], [])
        with self._naming(microbatch, "B"):
            input_grads = splitgrad.stage_backward_full(roots, grads, inputs)
        return _forms.named_grads(names, input_grads)

    # ------------------------------------------------------------------ housekeeping
    def assert_clean(self) -> None:
        """After a step: nothing cached (every F met its I/B and every I its W)."""
        if self._activations or self._weight_tasks:
            raise StageError(
                f"stage {self.stage_index} still holds microbatches "
                f"{sorted(self._activations)} (no I/B yet) and {sorted(self._weight_tasks)} "
                "(no W yet) after the step: the schedule misses those actions"
            )

    def reset(self) -> None:
        """Drops every cached microbatch (after a failed step), freeing its graph."""
        self._activations.clear()
        self._weight_tasks.clear()

    @contextlib.contextmanager
    def _naming(
        self, microbatch: int, what: str, inputs: list[str] | None = None
    ) -> Iterator[None]:
        """A backward's failure (a user's hook, autograd's refusal) names stage and microbatch;
        a failed split check names the inputs (`inputs`) or the parameters that differ."""
        try:
            yield
        except splitgrad.SplitMismatch as exc:
            names = inputs if exc.what == "input" else self._weight_names()
            raise StageError(f"{self._name(microbatch)}: {exc.explain(names)}") from exc
        except RuntimeError as exc:  # the cause keeps its traceback
            raise StageError(
                f"{self._name(microbatch)}: its {what} raised {type(exc).__name__}: {exc}"
            ) from exc

    def _take_activation(self, microbatch: int, what: str, pop: bool = True) -> _Activation:
        act = self._activations.get(microbatch)
        if act is None:
            state = "already ran its backward" if microbatch in self._weight_tasks else "no F"
            raise StageError(f"{self._name(microbatch)}: {what} before F ({state})")
        if pop:
            del self._activations[microbatch]
        return act

    def _roots(
        self,
        microbatch: int,
        act: _Activation,
        output_grads: Mapping[str, torch.Tensor] | None,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """The tensors the backward starts from and their gradients (None: scalar loss)."""
        if self.is_last:
            if act.loss is None:
                raise StageError(f"{self._name(microbatch)}: backward before its loss was set")
            return [act.loss], None  # set_loss made sure it requires grad
        grads = dict(output_grads or {})
        unknown = sorted(set(grads) - set(act.outputs))
        if unknown:
            raise StageError(
                f"{self._name(microbatch)}: got gradients for {unknown}, which are not outputs "
                f"of this stage (outputs: {sorted(act.outputs)})"
            )
        names = list(act.outputs)  # the next stage did not differentiate through some
        try:
            return splitgrad.output_roots(
                list(act.outputs.values()), [grads.get(n) for n in names], names
            )
        except ValueError as exc:  # a gradient of the wrong shape, named
            raise StageError(f"{self._name(microbatch)}: {exc}") from None


# torch's PipelineStage keywords that zbkit does without, and why (said in the error)
_TORCH_ONLY = {
    "input_args": "zbkit agrees names, shapes and dtypes on the first step, so it needs no "
    "example inputs or outputs",
    "output_args": "zbkit agrees names, shapes and dtypes on the first step, so it needs no "
    "example inputs or outputs",
    "input_grads": "zbkit agrees gradient shapes with the tensors they belong to",
    "output_grads": "zbkit agrees gradient shapes with the tensors they belong to",
    "group": "the process group belongs to the runner: ScheduleRunner(..., group=...)",
    "dw_builder": "zbkit splits every stage's backward itself (zbkit.splitgrad)",
    "get_mesh": "zbkit's stages move plain tensors, not DTensors",
}


def _refuse_torch_only(stage_index: int, given: Mapping[str, Any]) -> None:
    for name in given:
        if name not in _TORCH_ONLY:
            raise TypeError(f"PipelineStage() got an unexpected keyword argument {name!r}")
    reasons = "; ".join(f"{n}: {_TORCH_ONLY[n]}" for n in given)
    raise TypeError(
        f"stage {stage_index}: PipelineStage({', '.join(f'{n}=...' for n in given)}) is torch's "
        f"PipelineStage; zbkit's takes (module, stage_index, num_stages, device) and differs "
        f"on purpose: {reasons}"
    )
