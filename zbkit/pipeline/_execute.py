"""What one compute action does, shared by ``ScheduleRunner`` and ``LocalPipeline``.

Both executors keep a ``StepState``: the stages they hold, the microbatches of this step,
and two mailboxes keyed by (what, stage, microbatch):

- ``inbox``: tensors an action will consume (received from a peer, or handed over by a
  neighbouring stage on this rank);
- ``outbox``: tensors an action produced for a stage on another rank, until the ``Comm``
  that follows it in the plan sends them.

``StepState.run`` asks the ``KINDS`` table what an action takes from the inbox (its needs
from other stages), calls the method that ``RUNS`` (below, keyed by the same letters) names
for its kind (the only per-kind code: what the stage computes), and hands what it makes to
the consuming stage. A new kind is a ``KINDS`` entry plus a ``RUNS`` entry here (a new
``run_*`` method only if no existing one computes it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import Any

import torch
from torch.profiler import record_function

from zbkit.pipeline.stage import Message, PipelineStage, StageError
from zbkit.pipeline.trace import Event, MemorySample, Trace
from zbkit.schedules import KINDS, Action, Overlap, Product

# whether a torch profiler is recording (a cheap C call; without it, assume one is)
_profiling = getattr(torch.autograd, "_profiler_enabled", lambda: True)

Key = tuple[Product, int, int]  # (ACT | GRAD, consuming stage, microbatch), as Comm.key
# loss_fn(outputs, target): outputs in the last module's form (dict, Tensor or tuple)
LossFn = Callable[[Any, Any], torch.Tensor]


UNSET: Any = object()  # a keyword not given, told apart from an explicit None


def step_arguments(args: tuple, targets: Any, target: Any) -> tuple[Any, Any]:
    """``step``'s arguments as (inputs, targets), in zbkit's form and in torch's::

        step(x, y)                  zbkit: the inputs, then the targets
        step(x, targets=y)          both (torch names it ``target=``)
        step(x1, x2, target=y)      torch: several positional inputs, stage 0 gets
                                    module(x1, x2); so does step((x1, x2), y)

    Once the targets are named, every positional argument is an input (on a rank without
    the last stage, ``step(x1, x2, target=None)``).
    """
    if targets is not UNSET and target is not UNSET:
        raise TypeError(
            "step() got both targets= and target= (torch's name for the same thing); pass one"
        )
    named = targets if target is UNSET else target
    if named is not UNSET:  # torch's form: everything positional is an input
        return (args[0] if len(args) == 1 else tuple(args) or None), named
    if len(args) > 2:
        raise TypeError(
            f"step() got {len(args)} positional arguments; with several inputs name the "
            "targets as torch does, step(x1, x2, target=y), or pass the inputs as one tuple, "
            "step((x1, x2), y)"
        )
    return (args[0] if args else None), (args[1] if len(args) == 2 else None)


def check_loss_fn(loss_fn: Any, who: str) -> None:
    if not callable(loss_fn):
        raise TypeError(
            f"{who}: loss_fn must be a callable loss_fn(output, target) -> scalar tensor "
            f"(e.g. torch.nn.functional.cross_entropy), got {type(loss_fn).__name__}"
        )


def fill_losses(losses: list | None, got: list[torch.Tensor] | None) -> None:
    """torch's ``step(..., losses=[])``: the list is cleared and filled with the microbatch
    losses on the last stage's rank (left as it is elsewhere)."""
    if losses is not None and got is not None:
        losses.clear()
        losses.extend(got)


def handover(tensors: Mapping[str, torch.Tensor | None]) -> Message:
    """What a stage on the same rank receives: the same values, cut from the sender's graph.

    Each stage runs its own backward, so the receiving stage must see fresh leaves (that
    collect the gradient it sends back), exactly as if the tensors had crossed the wire.
    A ``None`` output stays ``None`` (it keeps its place in a tuple).
    """
    return {k: None if v is None else _leaf(v) for k, v in tensors.items()}


def _leaf(v: torch.Tensor) -> torch.Tensor:
    return v.detach().requires_grad_(v.requires_grad) if v.is_floating_point() else v.detach()


class StepState:
    """One step's microbatches, mailboxes, losses and trace, for the stages of one executor."""

    def __init__(
        self,
        stages: Mapping[int, PipelineStage],
        stage_to_rank: list[int],
        microbatches: int,
        loss_fn: LossFn,
        scale_grads: bool,
        inputs: list[Any] | None,
        targets: list[Any] | None,
        clock: Callable[[], float],
        cuda: bool = False,
    ) -> None:
        self.stages = stages
        self.stage_to_rank = stage_to_rank
        self.microbatches = microbatches
        self.loss_fn = loss_fn
        self.scale = 1.0 / microbatches if scale_grads else 1.0
        self.inputs = inputs
        self.targets = targets
        self.clock = clock
        self.inbox: dict[Key, Message] = {}
        self.outbox: dict[Key, Message] = {}
        self.losses: dict[int, torch.Tensor] = {}
        self.trace = Trace()
        self.last = len(stage_to_rank) - 1
        self.cuda = CudaTimer(clock) if cuda else None  # GPU times of the actions

    # ------------------------------------------------------------------ one action
    def run(self, item: Action | Overlap) -> None:
        """Runs one program item (an action, or both halves of an overlapped pair, one after
        the other here) and records its events and the memory held after each.

        An action runs inside ``torch.profiler.record_function("0F3")``, so a torch profiler
        (Kineto) trace of a zbkit run shows the schedule; on CUDA its time comes from CUDA
        events (the host clock around asynchronous kernels would measure their launch).
        """
        paired = type(item) is Overlap
        for action in item.halves:
            self._run(action, paired)

    def _run(self, action: Action, paired: bool) -> None:
        kind, s, j = action.info, action.stage, action.microbatch
        n = len(self.stage_to_rank)
        stage = self.stages[s]
        start = self.clock()
        cuda = self.cuda
        gpu = cuda.start() if cuda is not None else None
        # named for a torch profiler when one runs (record_function costs ~10 us otherwise)
        named = record_function(str(action)) if _profiling() else nullcontext()
        with named:
            # what it needs from other stages (received, or handed over on this rank)
            received = {
                p: self._take((p, s, j), action) for p, src in kind.needs_of(s, n) if src != s
            }
            made = _compute(action)(self, stage, action, received)
            consumer = kind.consumer(s, n)
            if consumer is not None:
                assert kind.makes is not None, f"{action}: a kind with a consumer makes something"
                self._give((kind.makes, consumer, j), made)
        end = self.clock()
        rank = self.stage_to_rank[s]
        if cuda is not None:  # gpu is its start event
            cuda.stop(gpu, len(self.trace.events))
        self.trace.events.append(Event(rank, s, action.kind, j, start, end, paired))
        self.trace.memory_samples.append(
            MemorySample(
                rank,
                s,
                end,
                stage.held_activations,
                stage.held_weight_state,
                stage.held_activation_bytes,
            )
        )

    def ready(self, item: Action | Overlap) -> bool:
        """Whether everything ``item`` needs from other stages is here (it would not block);
        for an overlapped pair, what both halves need."""
        n = len(self.stage_to_rank)
        return all(
            (p, a.stage, a.microbatch) in self.inbox
            for a in item.halves
            for p, src in a.info.needs_of(a.stage, n)
            if src != a.stage
        )

    # ---------------------------------------------- per kind: the compute (RUNS, below, names them)
    def run_forward(self, stage: PipelineStage, a: Action, received: dict) -> Any:
        j = a.microbatch
        if stage.is_first:
            if self.inputs is None:
                raise StageError(f"{a}: stage 0 needs inputs; pass step(inputs, ...) on its rank")
            inputs = self.inputs[j]
        else:
            inputs = received[Product.ACT]
        outputs = stage.forward(j, inputs)
        if stage.is_last:
            target = None if self.targets is None else self.targets[j]
            # the module's own form: a torch-style loss_fn(output, target) gets its Tensor
            output = stage.module_output(outputs)
            try:
                loss = self.loss_fn(output, target)
            except Exception as exc:  # re-raised naming what loss_fn got; the cause keeps its trace
                missing = (
                    " and target=None: the step was given no targets; pass "
                    "step(inputs, targets=...)"
                    if target is None
                    else ""
                )
                raise StageError(
                    f"{a}: stage {stage.stage_index} microbatch {j}: loss_fn raised "
                    f"{type(exc).__name__}: {exc}. It was given {_form(output)}: the last stage "
                    "module's output as the module returns it (dict[str, Tensor], a Tensor or "
                    f"a tuple of Tensors){missing}"
                ) from exc
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise StageError(f"{a}: loss_fn must return a scalar tensor, got {loss!r}")
            self.losses[j] = loss.detach()
            stage.set_loss(j, loss * self.scale if self.scale != 1.0 else loss)
        return outputs

    def run_backward_input(self, stage: PipelineStage, a: Action, received: dict) -> Any:
        return stage.backward_input(a.microbatch, received.get(Product.GRAD))

    def run_backward_full(self, stage: PipelineStage, a: Action, received: dict) -> Any:
        return stage.backward_full(a.microbatch, received.get(Product.GRAD))

    def run_backward_weight(self, stage: PipelineStage, a: Action, received: dict) -> None:
        stage.backward_weight(a.microbatch)

    # ------------------------------------------------------------------ mailboxes
    def _take(self, key: Key, a: Any) -> Message:
        try:
            return self.inbox.pop(key)
        except KeyError:
            what = key[0].words
            raise StageError(
                f"{a} needs the {what} of stage {key[1]} microbatch {key[2]}, which have not "
                "arrived: the program runs it before the action that produces them"
            ) from None

    def _give(self, key: Key, tensors: Message) -> None:
        if key[1] in self.stages:  # the consuming stage lives here: hand over locally
            self.inbox[key] = handover(tensors)
        else:
            self.outbox[key] = dict(tensors)  # the send records requires_grad, then detaches

    def finish(self) -> list[torch.Tensor] | None:
        """End of step: every stage clean, nothing left in the mailboxes; the losses."""
        if self.cuda is not None:  # the events' GPU times replace the host's launch times
            self.trace.events = self.cuda.times(self.trace.events)
        for stage in self.stages.values():
            stage.assert_clean()
        left = sorted(self.inbox) + sorted(self.outbox)
        if left:
            raise StageError(f"tensors never consumed after the step: {left}")
        if self.last not in self.stages:
            return None
        return [self.losses[j] for j in range(self.microbatches)]


# what one kind computes: StepState's method, given the stage, the action and what it received
Compute = Callable[[StepState, PipelineStage, Action, dict], Any]

RUNS: dict[str, Compute] = {  # keyed by the letters of KINDS
    "F": StepState.run_forward,
    "I": StepState.run_backward_input,
    "W": StepState.run_backward_weight,
    "B": StepState.run_backward_full,
}


def _compute(action: Action) -> Compute:
    """The method that computes `action`'s kind; a kind in KINDS but not here is named."""
    try:
        return RUNS[action.kind]
    except KeyError:
        raise StageError(
            f"{action}: kind {action.kind!r} ({KINDS[action.kind].name}) is in KINDS but has "
            f"no entry in RUNS (zbkit/pipeline/_execute.py), which runs only "
            f"{', '.join(RUNS)}: add the StepState method that computes it"
        ) from None


def _form(output: Any) -> str:
    if isinstance(output, Mapping):
        return f"a dict with keys {sorted(output)}"
    if isinstance(output, tuple):
        return f"a tuple of {len(output)}"
    return f"a {type(output).__name__}"


def timer() -> Callable[[], float]:
    """A clock that reads 0 now (``perf_counter`` based)."""
    t0 = time.perf_counter()
    return lambda: time.perf_counter() - t0


class CudaTimer:
    """Times actions on the GPU with CUDA events, on the host clock's scale.

    A reference event is recorded (and waited for) when the step starts, together with the
    host clock; each action records a start and an end event on the current stream; at the
    end of the step one synchronize turns every event into host-clock seconds.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self.ref = torch.cuda.Event(enable_timing=True)
        self.ref.record()
        self.ref.synchronize()
        self.t_ref = clock()
        self.marks: list[tuple[int, Any, Any]] = []  # (event index, start, end)

    def start(self) -> Any:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def stop(self, start: Any, index: int) -> None:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self.marks.append((index, start, end))

    def times(self, events: list[Event]) -> list[Event]:
        torch.cuda.synchronize()
        out = list(events)
        for index, start, end in self.marks:
            t0 = self.t_ref + self.ref.elapsed_time(start) / 1e3  # ms -> s
            t1 = self.t_ref + self.ref.elapsed_time(end) / 1e3
            out[index] = out[index]._replace(start=t0, end=t1)
        return out
