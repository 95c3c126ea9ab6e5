"""Trace a torch.distributed.pipelining run: what each rank really did, as a zbkit `Trace`.

    with trace_torch(torch_schedule) as rec:      # the user's torch code, unchanged
        torch_schedule.step(x, target=y)
    trace = rec.gather_trace()                    # every rank's events, one clock (collective)
    viz.plot_schedule(trace)

How: torch's schedules run every compute action through three methods of its stage
(`_PipelineStageBase` in torch/distributed/pipelining/stage.py), both the single-stage
loops (`Schedule1F1B._step_microbatches`, `ScheduleGPipe`'s) and the action runtime
(`_PipelineScheduleRuntime`, which also runs each half of an OVERLAP_F_B this way):

    forward_one_chunk(mb, ...)                          -> F
    backward_one_chunk(mb, ..., full_backward=True)     -> B  (False: I, the input half)
    backward_weight_one_chunk(mb, ...)                  -> W

`trace_torch` wraps these on the schedule's own stage objects (instance attributes, so
other stages and the class are untouched) and restores them on exit, also on an error.
Shape inference at the first step uses other methods, so it is not counted as an action.
Not seen: actions a user registered with `register_custom_function` (torch calls those
instead of the stage's methods), and the communication waits (the gaps between actions).

Times are wall-clock seconds (`time.time`, one clock for the processes of a host, as
`ScheduleRunner` records); on a CUDA stage, CUDA events give the actions' GPU times
(`CudaTimer`, as zbkit's own runner). The memory record counts what torch's stage holds
after each action: microbatches in its `fwd_cache` (between F and I/B) and its `dw_runner`
(between I and W), as `Trace.memory_for` expects.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from zbkit.pipeline._execute import CudaTimer
from zbkit.pipeline.trace import MemorySample, Trace
from zbkit.schedules import Event, Schedule
from zbkit.schedules.core.action import Action, Overlap, Product

__all__ = ["TorchRecorder", "schedule_of_trace", "trace_torch"]

# the stage methods torch's schedules call per compute action
STAGE_METHODS = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
_MISSING = object()  # no instance attribute of that name before the patch


def torch_stages(schedule: Any, refusal: str) -> list[Any]:
    """The stage objects of a torch pipeline schedule on this rank; TypeError
    `"{refusal}, got {type}"` for anything else."""
    stages = getattr(schedule, "_stages", None) or [getattr(schedule, "_stage", None)]
    if not stages or any(s is None or not hasattr(s, STAGE_METHODS[0]) for s in stages):
        raise TypeError(f"{refusal}, got {type(schedule).__name__}")
    return list(stages)


def torch_action(name: str, bound: inspect.BoundArguments) -> tuple[str, int]:
    """(kind, microbatch) of a call of stage method `name` with `bound` arguments: F, or
    B (a whole backward), I (its input half: full_backward=False) or W."""
    microbatch = int(next(iter(bound.arguments.values())))  # fwd/bwd_chunk_id
    if name == "forward_one_chunk":
        return "F", microbatch
    if name == "backward_one_chunk":
        return ("B" if bound.arguments.get("full_backward", True) else "I"), microbatch
    return "W", microbatch


class MethodPatches:
    """Methods set as instance attributes on objects (torch's stages, a schedule's `step`),
    each put back by `restore` as it was: the class's, or an outer wrapper's (nested
    recorders restore in reverse order)."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []  # (object, method, its instance attribute)

    def set(self, obj: Any, name: str, method: Callable) -> None:
        self._saved.append((obj, name, obj.__dict__.get(name, _MISSING)))
        setattr(obj, name, method)

    def restore(self) -> None:
        while self._saved:
            obj, name, before = self._saved.pop()
            if before is _MISSING:
                obj.__dict__.pop(name, None)
            else:
                setattr(obj, name, before)


class TorchRecorder:
    """Records the compute actions a torch schedule runs on this rank (see module doc)."""

    def __init__(self, schedule: Any, clock: Callable[[], float] = time.time) -> None:
        stages = torch_stages(
            schedule,
            "trace_torch needs a torch pipeline schedule with its stages (a "
            "torch.distributed.pipelining schedule object)",
        )
        self.schedule = schedule
        self.stages = list(stages)
        self.clock = clock
        self._events: list[Event] = []
        self._samples: list[MemorySample] = []
        self._patches = MethodPatches()
        self._paired = _overlapped(schedule)
        devices = [getattr(getattr(s, "device", None), "type", "") for s in self.stages]
        self._on_cuda = "cuda" in devices
        self._cuda: CudaTimer | None = None
        self._trace: Trace | None = None

    # ------------------------------------------------------------------ wrapping
    def start(self) -> None:
        if self._on_cuda:
            self._cuda = CudaTimer(self.clock)
        for stage in self.stages:
            for name in STAGE_METHODS:
                self._patches.set(stage, name, self._wrap(stage, name, getattr(stage, name)))

    def stop(self) -> None:
        """Puts every wrapped method back (what was there before: torch's, or a wrapper of an
        outer recorder)."""
        self._patches.restore()
        if self._cuda is not None:  # GPU times replace the host's launch times
            self._events = self._cuda.times(self._events)
            self._cuda = None

    def _wrap(self, stage: Any, name: str, method: Callable) -> Callable:
        signature = inspect.signature(method)
        rank = int(stage.group_rank)  # the rank in the pipeline's group, as placements count

        def recorded(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            kind, microbatch = torch_action(name, bound)
            start = self.clock()
            gpu = self._cuda.start() if self._cuda is not None else None
            out = method(*args, **kwargs)
            if self._cuda is not None and gpu is not None:
                self._cuda.stop(gpu, len(self._events))
            end = self.clock()
            s = int(stage.stage_index)
            paired = (s, kind, microbatch) in self._paired
            self._events.append(Event(rank, s, kind, microbatch, start, end, paired))
            self._samples.append(
                MemorySample(
                    rank,
                    s,
                    end,
                    len(getattr(stage, "fwd_cache", ())),  # activations held for I/B
                    len(getattr(stage, "dw_runner", ())),  # I done, W pending
                )
            )
            return out

        recorded.__wrapped__ = method  # type: ignore[attr-defined]
        return recorded

    # ------------------------------------------------------------------ results
    @property
    def trace(self) -> Trace:
        """This rank's events (wall-clock times), in the order they ran."""
        return Trace(events=list(self._events), memory_samples=list(self._samples))

    def gather_trace(self, group: Any = None) -> Trace:
        """Every rank's trace, merged onto one clock from 0 (collective: call on all ranks
        of the pipeline's group)."""
        import torch.distributed as dist

        traces: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(traces, self.trace, group=group)
        return Trace.merge(traces)

    def clear(self) -> None:
        """Forget what was recorded (e.g. after a warm-up step)."""
        self._events, self._samples = [], []


def _overlapped(schedule: Any) -> set[tuple[int, str, int]]:
    """(stage, kind, microbatch) of the halves of torch's OVERLAP_F_B actions on this rank."""
    order = getattr(schedule, "pipeline_order_with_comms", None) or {}
    out = set()
    for action in order.get(getattr(schedule, "rank", None), []) or []:
        for sub in getattr(action, "sub_actions", None) or ():
            kind = str(sub)[len(str(sub.stage_index))]  # "3B0" -> "B"
            out.add((sub.stage_index, kind, sub.microbatch_index))
    return out


@contextmanager
def trace_torch(schedule: Any, clock: Callable[[], float] = time.time) -> Iterator[TorchRecorder]:
    """Record every compute action `schedule` (a torch pipeline schedule) runs on this rank
    while the block runs; `rec.trace` (this rank) or `rec.gather_trace()` (all) after."""
    rec = TorchRecorder(schedule, clock)
    rec.start()
    try:
        yield rec
    finally:
        rec.stop()


def schedule_of_trace(trace: Trace, stage_to_rank: list[int], name: str = "traced") -> Schedule:
    """The program a traced run performed, per rank in the order it ran (two paired events in
    a row: one overlapped pair), as a `Schedule` to validate, simulate or compare."""
    program: dict[int, list[Action | Overlap]] = {r: [] for r in range(max(stage_to_rank) + 1)}
    events = sorted(trace.events, key=lambda e: (e.rank, e.start))
    i = 0
    while i < len(events):
        e = events[i]
        a = Action(e.stage, e.kind, e.microbatch)
        nxt = events[i + 1] if i + 1 < len(events) else None
        if e.paired and nxt is not None and nxt.paired and nxt.rank == e.rank:
            b = Action(nxt.stage, nxt.kind, nxt.microbatch)
            forward_first = a.info.makes is Product.ACT  # the half making activations
            program[e.rank].append(Overlap(a, b) if forward_first else Overlap(b, a))
            i += 2
            continue
        program[e.rank].append(a)
        i += 1
    microbatches = 1 + max((e.microbatch for e in events), default=-1)
    return Schedule(program, list(stage_to_rank), microbatches, name)
