"""``LocalPipeline``: every stage of a schedule in this one process.

The teaching and debugging twin of ``ScheduleRunner``: the same stages, the same per-action
code, the same trace, but no processes and no wire. The ranks' programs are interleaved the
way the real ranks would meet: round robin, each rank running its next actions while their
inputs exist, so a rank waits exactly where it would block on a receive. A program that
could never finish (a deadlock, a W before its I) stops with the blocked actions named.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from zbkit.pipeline._batch import split_batch
from zbkit.pipeline._execute import (
    UNSET,
    LossFn,
    StepState,
    check_loss_fn,
    fill_losses,
    step_arguments,
    timer,
)
from zbkit.pipeline.stage import PipelineStage, StageError
from zbkit.pipeline.trace import Trace
from zbkit.schedules import Schedule, ScheduleError, validate
from zbkit.schedules.core.schedule import expect_schedule


class LocalPipeline:
    """Runs ``schedule`` over ``modules`` (one per stage, in stage order) in one process.

    The oracle twin of ``ScheduleRunner``: the same ``PipelineStage`` per stage and the same
    per-action code (F, I, W, B and the loss), with the ranks' programs interleaved as the
    ranks would meet, so a schedule's losses and gradients can be checked here against plain
    autograd before it runs on processes. ``step`` runs one training step (``.grad`` then as
    after the loss on the whole batch) and returns each microbatch's loss; ``trace`` holds
    what ran, the events ``zbkit.viz.plot_schedule`` draws.

    Args:
        modules: one ``nn.Module`` (or ``PipelineStage``) per stage, in stage order; each
            takes the previous one's outputs: ``module(**inputs) -> dict[str, Tensor]``, or
            torch's form ``module(*tensors) -> Tensor | tuple``.
        schedule: a ``Schedule`` (``build_schedule(...)``), validated first.
        loss_fn: ``loss_fn(outputs, targets) -> scalar`` for one microbatch, after the last
            stage (torch's ``loss_fn(output, target)`` works unchanged).
        scale_grads: divide each microbatch's loss by the number of microbatches, so the
            gradients are those of the mean loss over the whole batch.
        check_split: compare each stage's split backward (I then W) with one whole backward
            of the same microbatch, the first microbatch of each input shape, and raise a
            ``StageError`` naming the parameters that differ (one extra backward each).

    Example::

        import torch
        from torch import nn
        from zbkit.pipeline import LocalPipeline
        from zbkit.schedules import build_schedule

        torch.manual_seed(0)
        stages = [nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(4)]
        pipe = LocalPipeline(stages, build_schedule("zb-h1", pp=4, microbatches=8), nn.MSELoss())
        x, y = torch.randn(16, 8), torch.randn(16, 8)
        losses = pipe.step(x, target=y)  # 8 losses: one per microbatch of 2 rows
        grads = [p.grad.clone() for p in pipe.parameters()]

        # the oracle: plain autograd on the whole batch gives the same gradients
        for p in pipe.parameters():
            p.grad = None
        nn.MSELoss()(nn.Sequential(*stages)(x), y).backward()
        assert all(torch.allclose(g, p.grad, atol=1e-6) for g, p in zip(grads, pipe.parameters()))
    """

    def __init__(
        self,
        modules: Sequence[nn.Module | PipelineStage],
        schedule: Schedule,
        loss_fn: LossFn,
        scale_grads: bool = True,
        *,
        check_split: bool = False,
    ) -> None:
        schedule = expect_schedule(schedule, "LocalPipeline")
        check_loss_fn(loss_fn, "LocalPipeline")
        if isinstance(modules, nn.Module | PipelineStage):
            raise TypeError(
                "LocalPipeline takes a list of modules, one per stage in stage order, got one "
                f"{type(modules).__name__}: split the model first ([m0, m1, ...])"
            )
        if len(modules) != schedule.num_stages:
            raise ValueError(
                f"the schedule has {schedule.num_stages} stages but {len(modules)} modules were "
                "given; pass one module per stage, in stage order"
            )
        validate(schedule)
        self.schedule = schedule
        self.loss_fn = loss_fn
        self.scale_grads = scale_grads
        self.stages = [
            m if isinstance(m, PipelineStage) else PipelineStage(m, s, schedule.num_stages)
            for s, m in enumerate(modules)
        ]
        for s, st in enumerate(self.stages):
            if st.stage_index != s or st.num_stages != schedule.num_stages:
                raise ValueError(
                    f"modules[{s}] is PipelineStage {st.stage_index}/{st.num_stages}; expected "
                    f"stage {s} of {schedule.num_stages}"
                )
            st.check_split = st.check_split or check_split
        self.trace = Trace()

    def __repr__(self) -> str:
        return f"LocalPipeline({self.schedule!r})"

    def parameters(self) -> list[nn.Parameter]:
        return [p for st in self.stages for p in st.module.parameters()]

    def step(
        self,
        *args: Any,
        targets: Any = UNSET,
        target: Any = UNSET,
        losses: list | None = None,
    ) -> list[torch.Tensor]:
        """One training step's forward and backward; returns the per-microbatch losses.

        ``step(inputs, targets)``, or as torch's ``schedule.step``: ``step(x, target=y)``,
        ``step(x1, x2, target=y)`` for a first stage taking several inputs (a tuple
        ``step((x1, x2), y)`` is the same), and a ``losses`` list filled with the losses.
        Gradients are accumulated into ``.grad``; with ``scale_grads`` they equal those of
        the mean microbatch loss (one full-batch step).
        """
        inputs, targets = step_arguments(args, targets, target)
        if inputs is None:
            raise ValueError("step(inputs, ...) needs the inputs of stage 0, got None")
        m = self.schedule.microbatches
        inputs, targets = split_batch(m, inputs, targets)
        state = StepState(
            dict(enumerate(self.stages)),
            list(self.schedule.stage_to_rank),
            m,
            self.loss_fn,
            self.scale_grads,
            inputs,
            targets,
            timer(),
        )
        try:
            self._interleave(state)
            got = state.finish()
        except BaseException:
            for st in self.stages:
                st.reset()  # a failed step leaves no graph behind
            raise
        self.trace = state.trace
        assert got is not None  # the last stage is here
        fill_losses(losses, got)
        return got

    def _interleave(self, state: StepState) -> None:
        program = self.schedule.program
        pos = dict.fromkeys(program, 0)
        while any(pos[r] < len(program[r]) for r in program):
            progressed = False
            for r in sorted(program):
                while pos[r] < len(program[r]) and state.ready(program[r][pos[r]]):
                    try:
                        state.run(program[r][pos[r]])
                    except StageError as exc:
                        exc.add_note(self.schedule.to_grid([(r, pos[r])]))
                        raise
                    pos[r] += 1
                    progressed = True
            if not progressed:
                stuck = [r for r in sorted(program) if pos[r] < len(program[r])]
                blocked = ", ".join(f"rank {r} at {program[r][pos[r]]}" for r in stuck)
                grid = self.schedule.to_grid([(r, pos[r]) for r in stuck])
                raise ScheduleError(
                    f"the schedule deadlocks: every rank waits for a tensor no one will "
                    f"produce: {blocked}\n{grid}"
                )
