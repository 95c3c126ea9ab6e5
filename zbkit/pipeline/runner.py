"""``ScheduleRunner``: runs this rank's part of a schedule for real.

At construction the rank's compute program is turned into a plan (``derive_plan``: each
action with the receives it waits for and the sends it feeds; ``print(runner.plan)``).
``step`` then is a dumb loop::

    for item in plan:
        comm -> send / receive;   action -> run it on its stage

Data parallelism (``dp_group``, e.g. from ``zbkit.parallel.pp_dp_groups``): each pipeline
replica runs the same plan on its own data; a stage's gradients are averaged over the
replicas (``zbkit.parallel.average_gradients``) right after that stage's last W (or B),
while the rest of the pipeline keeps running, and waited for at the end of the step.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from zbkit.parallel import PendingAverage, average_gradients
from zbkit.parallel.process_group import group_device, require_process_group
from zbkit.parallel.tied import TiedWeights
from zbkit.pipeline._agree import agree_on_schedule
from zbkit.pipeline._batch import split_batch
from zbkit.pipeline._comms import P2P, CommTimeout
from zbkit.pipeline._execute import (
    UNSET,
    LossFn,
    StepState,
    check_loss_fn,
    fill_losses,
    step_arguments,
)
from zbkit.pipeline.stage import PipelineStage, StageError
from zbkit.pipeline.trace import CommEvent, Trace
from zbkit.schedules import Comm, CommOp, Schedule, derive_plan, validate
from zbkit.schedules.core.schedule import expect_schedule

FIRST_CONTACT = 120.0  # seconds the first step's schedule handshake waits at least


class ScheduleRunner:
    """Runs ``schedule`` on this rank's ``stages`` inside a pipeline process group.

    Args:
        schedule: a validated schedule with ``schedule.pp`` equal to the group's size.
        stages: the ``PipelineStage`` objects this rank holds (``schedule.stages_on(rank)``).
        loss_fn: ``loss_fn(outputs: dict, targets) -> scalar``, per microbatch, last stage.
        scale_grads: divide each microbatch loss by the microbatch count, so gradients equal
            those of one full-batch step on the mean loss.
        group: the pipeline's process group (default: the world).
        dp_group: replicas of this rank's stages to average gradients with (PP x DP).
        timeout: seconds any single wait of a step may block before raising, naming the
            action (settable between steps); the first step's schedule handshake waits at
            least ``FIRST_CONTACT`` (120 s), as ranks start at different times.
        barrier: start every step with a barrier of the pipeline group (off by default: a
            barrier costs a round trip per step and nothing needs it; turn it on to measure
            steps from a common start, or to find a rank that never reaches the step).
        tied: ``{name: parameter}`` of weights the model ties across stages (a tied embedding
            and LM head, ``zbkit.hf.tied(model)``), the same names on every rank, each rank's
            own copy: the copies start equal and each gets the sum of every stage's gradient
            at the end of a step, as the one parameter does in one process
            (``zbkit.parallel.tied``).
        check_split: compare this rank's split backwards (I then W) with one whole backward
            of the same microbatch, the first of each input shape, and fail the step naming
            the parameters that differ (see ``PipelineStage``; one extra backward each).
    """

    def __init__(
        self,
        schedule: Schedule,
        stages: Sequence[PipelineStage] | PipelineStage,
        loss_fn: LossFn,
        scale_grads: bool = True,
        group: dist.ProcessGroup | None = None,
        *,
        dp_group: dist.ProcessGroup | None = None,
        timeout: float = 60.0,
        barrier: bool = False,
        check_split: bool = False,
        tied: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        require_process_group("ScheduleRunner", alone="LocalPipeline (every stage in it)")
        schedule = expect_schedule(schedule, "ScheduleRunner")
        check_loss_fn(loss_fn, "ScheduleRunner")
        validate(schedule)  # a broken program would only show up as timeouts
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        if schedule.pp != world:
            raise ValueError(
                f"the schedule was built for {schedule.pp} ranks but the pipeline group has "
                f"{world}: build it with pp={world}, or launch {schedule.pp} ranks"
            )
        stages = [stages] if isinstance(stages, PipelineStage) else list(stages)
        expected = schedule.stages_on(rank)
        given = sorted(st.stage_index for st in stages)
        if given != expected or any(st.num_stages != schedule.num_stages for st in stages):
            raise ValueError(
                f"rank {rank} holds stages {expected} of {schedule.num_stages} in this schedule "
                f"but was given stages {given}; build PipelineStage(module, s, "
                f"{schedule.num_stages}) for each s in schedule.stages_on({rank})"
            )
        self.schedule, self.loss_fn, self.scale_grads = schedule, loss_fn, scale_grads
        self.group, self.dp_group, self.rank = group, dp_group, rank
        self.barrier = barrier
        self.stages = {st.stage_index: st for st in stages}
        for st in stages:  # see PipelineStage: the first microbatch of each input shape
            st.check_split = st.check_split or check_split
        self.plan = derive_plan(schedule, rank)
        self.backend = dist.get_backend(group)
        device = group_device(group)
        self.p2p = P2P(
            group, schedule.num_stages, schedule.microbatches, device, timeout, f"rank {rank}"
        )
        # the plan position after which each stage's gradients are final: its last action
        # doing the W part of the work (the KINDS table's `does_weight`: W or B)
        last_backward = {
            a.stage: i
            for i, item in enumerate(self.plan)
            if not isinstance(item, Comm)
            for a in item.halves
            if a.info.does_weight
        }
        self._grads_final = {i: s for s, i in last_backward.items()}
        self._agreed = False  # the ranks agree on the schedule at the first step
        self._at = 0  # during a step, the plan position reached (a failure tells from there)
        self.trace = Trace()
        mine = [p for st in stages for p in st.module.parameters()]
        self._tied = None if tied is None else TiedWeights(tied, mine, f"rank {rank}")

    def __repr__(self) -> str:
        return (
            f"ScheduleRunner(rank {self.rank}, stages {sorted(self.stages)}, "
            f"{self.schedule!r}, backend={self.backend!r})"
        )

    def step(
        self,
        *args: Any,
        targets: Any = UNSET,
        target: Any = UNSET,
        losses: list | None = None,
    ) -> list[torch.Tensor] | None:
        """One training step; the per-microbatch losses on the last stage's rank, else None.

        ``step(inputs, targets)``: the inputs (a tensor, a tuple or a dict of tensors) matter
        on stage 0's rank and the targets on the last stage's; both are split on dim 0 into
        ``schedule.microbatches`` parts. As in torch's ``schedule.step``, ``target=`` may
        name the targets, several inputs may come positionally once the targets are named
        (``step(x1, x2, target=y)``; ``target=None`` on a rank without the last stage) and
        a ``losses`` list is filled with the losses on the last stage's rank. (torch's step
        returns the last stage's outputs; zbkit's returns the losses.)
        If a step fails, the stages are cleared, but messages of the broken step may still
        be on the wire: build a new runner on a fresh group before training on.
        """
        if not self._agreed:  # before anything that may fail on one rank only
            self._agree()
        self._at = 0
        try:
            got = self._step(step_arguments(args, targets, target))
        except BaseException as exc:
            for st in self.stages.values():
                st.reset()  # drop cached graphs: a failed step leaks nothing
            self._tell_peers(exc)
            raise
        fill_losses(losses, got)
        return got

    def _step(self, arguments: tuple[Any, Any]) -> list[torch.Tensor] | None:
        inputs, targets = self._my_batch(*arguments)
        if self.barrier:  # every rank starts the step together (asked for: it costs a trip)
            self._barrier()
        # Wall-clock seconds: one clock for every process on a host (and NTP-close across
        # hosts), so the ranks' traces line up; Trace.merge shifts the whole run to start at 0.
        state = StepState(
            self.stages,
            list(self.schedule.stage_to_rank),
            self.schedule.microbatches,
            self.loss_fn,
            self.scale_grads,
            inputs,
            targets,
            time.time,
            cuda=self.backend == "nccl",  # GPU actions timed with CUDA events
        )
        got = self._walk(state)
        self.trace = state.trace
        return got

    def _tell_peers(self, exc: BaseException) -> None:
        """A failed step: the sends this rank will not make carry its error instead, so
        the peers waiting for them fail at once with it (and tell theirs) instead of after
        their timeout. The first failure's words travel on unchanged; the rank that told
        this one, or that this one waited on in vain, is not told."""
        origin = getattr(exc, "origin", None)
        text = origin or f"{type(exc).__name__} on rank {self.rank}: {exc}"
        skip = getattr(exc, "peer", None) if isinstance(exc, CommTimeout) else None
        sends = [
            c
            for c in self.plan.steps[self._at :]
            if isinstance(c, Comm) and c.op is CommOp.SEND and c.peer != skip
        ]
        self.p2p.tell(sends, text)

    @property
    def timeout(self) -> float:
        """Seconds any single wait may block; settable between steps (``runner.timeout = 5``)."""
        return self.p2p.timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self.p2p.timeout = seconds

    def _agree(self) -> None:
        """First step: the same schedule on every rank of the pipeline (and of the replicas),
        or every rank fails now, naming who runs what (see ``_agree.py``).

        The first contact between the ranks, where they are furthest apart (one still loading
        weights, another built its model faster): it waits at least ``FIRST_CONTACT`` seconds
        whatever the runner's timeout, which is meant for the waits of a running step.
        """
        device, wait = self.p2p.device, max(self.timeout, FIRST_CONTACT)
        tied = self._tied.describe() if self._tied is not None else ""
        agree_on_schedule(self.schedule, self.group, device, wait, "pipeline", tied)
        if self._tied is not None:  # the copies start equal
            self._tied.equalize(self.group, wait)
        if self.dp_group is not None:
            agree_on_schedule(self.schedule, self.dp_group, device, wait, "data-parallel")
        self._agreed = True

    def forget_shapes(self) -> None:
        """Drops the layouts (names, shapes, dtypes) and receive buffers kept per transfer.

        Not needed for a new batch shape: a message's layout may change at any microbatch
        and step, and a new one travels once. Every rank of the pipeline must call this
        before the same step (e.g. to free the buffers of a larger batch).
        """
        self.p2p.forget_shapes()

    def gather_trace(self) -> Trace:
        """Every pipeline rank's trace of the last step, merged (collective: call on all)."""
        traces: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(traces, self.trace, group=self.group)
        return Trace.merge(traces)

    # ------------------------------------------------------------------ pieces
    def _my_batch(self, inputs: Any, targets: Any) -> tuple[Any, Any]:
        """This rank's share of ``step``'s arguments, split into microbatches: the inputs
        if it holds stage 0, the targets if it holds the last stage, else None."""
        last = self.schedule.num_stages - 1
        if 0 in self.stages and inputs is None:
            raise ValueError(f"rank {self.rank} holds stage 0: pass step(inputs, ...) here")
        if last in self.stages and targets is None:
            raise ValueError(
                f"rank {self.rank} holds the last stage ({last}), which computes the loss: pass "
                "step(..., targets=...) on this rank"
            )
        # Whatever this rank was given is checked together (inputs against targets when
        # both are here), even the part its stages do not use.
        inputs, targets = split_batch(self.schedule.microbatches, inputs, targets)
        return (inputs if 0 in self.stages else None), (targets if last in self.stages else None)

    def _walk(self, state: StepState) -> list[torch.Tensor] | None:
        """The dumb loop: each plan item moves tensors or runs an action; a stage's
        gradients are averaged over the replicas as soon as they are final. A failure is
        noted with the grid, this rank's place in it marked."""
        reductions = []  # zbkit.parallel's averages in flight, one per stage
        done = 0  # compute actions finished: the position in this rank's program
        item: Comm | object = None
        try:
            for i, item in enumerate(self.plan):
                self._at = i
                if isinstance(item, Comm):
                    start = state.clock()
                    self._move(item, state)
                    state.trace.comm.append(CommEvent(self.rank, str(item), start, state.clock()))
                    continue
                state.run(item)
                done += 1
                if i in self._grads_final and self.dp_group is not None:
                    reductions.append(self._average(self._grads_final[i]))
            self._at = len(self.plan)
            self.p2p.finish()  # nothing pending on the wire
            for pending in reductions:
                pending.wait()
            if self._tied is not None:  # each copy of a tied weight gets every stage's part
                self._tied.sum_grads(self.group, self.timeout)
            return state.finish()
        except (TimeoutError, StageError, ValueError) as exc:  # CommTimeout too
            # a send follows the action that produced it; everything else is at `done`
            sending = isinstance(item, Comm) and item.op is CommOp.SEND
            mark = (self.rank, done - 1 if sending else done)
            exc.add_note(f"where rank {self.rank} was:\n{self.schedule.to_grid([mark])}")
            raise

    def _average(self, stage: int) -> PendingAverage:
        """Start averaging ``stage``'s gradients over the replicas (they are final now)."""
        params = self.stages[stage].module.parameters()
        return average_gradients(
            params, self.dp_group, timeout=self.timeout, label=f"stage {stage}"
        )

    def _move(self, comm: Comm, state: StepState) -> None:
        if comm.op is CommOp.RECV:
            state.inbox[comm.key] = self.p2p.recv(comm)
        else:
            self.p2p.send(comm, state.outbox.pop(comm.key))

    def _barrier(self) -> None:
        began = time.monotonic()
        try:
            if self.backend == "gloo":  # names the ranks that never arrived, after the timeout
                timeout = datetime.timedelta(seconds=self.timeout)
                dist.monitored_barrier(self.group, timeout=timeout)
            else:
                dist.barrier(self.group)
        except RuntimeError as exc:
            waited = time.monotonic() - began
            if waited < 0.9 * self.timeout:  # failed early: a peer went away, no timeout
                what = f"a rank failed or exited before the step's barrier (after {waited:.1f} s)"
            else:
                what = f"not every rank of the pipeline started the step within {self.timeout:g} s"
            raise CommTimeout(
                f"rank {self.rank}: {what}; one probably failed before it (see its error). "
                f"[{str(exc).strip()[:300]}]"
            ) from exc
