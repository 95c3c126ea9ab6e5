"""zbkit.debug's reader of a torch.distributed.pipelining schedule: which action a rank is in.

`zbkit.debug.install(schedule=torch_schedule)` makes one `TorchProgress`; the watchdog asks
it for the line and the marked grid when the rank sits in a wait.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from types import FrameType
from typing import Any

from zbkit.schedules import Schedule
from zbkit.schedules.core.grid import WAITING, render_grid


class TorchProgress:
    """Where this rank is in a step of a torch.distributed.pipelining schedule.

    torch's single-stage loops (``Schedule1F1B``, ``ScheduleGPipe``) keep no current action,
    but every torch schedule runs each compute action through one of three methods of its
    stage (see ``zbkit/pipeline/torch_trace.py``). Those and the schedule's ``step`` are
    wrapped on the objects themselves (instance attributes, put back by ``unwrap``) to count
    the actions this step has started and finished. The n-th action to run is the n-th of
    this rank's program, so the mark goes by position, not by name: torch 2.13's
    ``Schedule1F1B`` numbers the last rank's forwards from 1 in its ``pipeline_order``.
    """

    def __init__(self, torch_schedule: Any) -> None:
        # lazily: zbkit.debug loads without zbkit.pipeline and torch (a torch schedule needs them)
        from zbkit.pipeline.torch_trace import MethodPatches, torch_stages

        stages = torch_stages(
            torch_schedule,
            "install(schedule=...) takes a zbkit Schedule or a torch.distributed.pipelining "
            "schedule object with its stages",
        )
        self.torch_schedule, self.stages = torch_schedule, list(stages)
        self.name = f"torch's {type(torch_schedule).__name__}"
        self.rank = int(stages[0].group_rank)  # the rank in the pipeline's group
        self.schedule: Schedule | None = None
        with contextlib.suppress(ValueError):  # torch draws no pipeline_order for it
            self.schedule = Schedule.from_torch(torch_schedule)
        self.steps = 0  # steps finished
        self.stepping = False  # inside `step`
        self.finished = 0  # compute actions this step has finished
        self.running: str | None = None  # the one started and not finished ("0F1")
        self.last: str | None = None  # the last one finished
        self._patches = MethodPatches()

    def wrap(self) -> None:
        # lazily, as in __init__: zbkit.debug loads without zbkit.pipeline and torch
        from zbkit.pipeline.torch_trace import STAGE_METHODS

        self._patches.set(self.torch_schedule, "step", self._step(self.torch_schedule.step))
        for stage in self.stages:
            for name in STAGE_METHODS:
                self._patches.set(stage, name, self._action(stage, name))

    def unwrap(self) -> None:
        self._patches.restore()

    def _step(self, step: Callable) -> Callable:
        def counted_step(*args: Any, **kwargs: Any) -> Any:
            self.stepping, self.finished, self.running, self.last = True, 0, None, None
            out = step(*args, **kwargs)
            # on an error the counts stay as they were: the report says where it failed
            self.stepping, self.steps = False, self.steps + 1
            return out

        return counted_step

    def _action(self, stage: Any, name: str) -> Callable:
        # lazily, as in __init__: zbkit.debug loads without zbkit.pipeline and torch
        from zbkit.pipeline.torch_trace import torch_action

        method = getattr(stage, name)  # torch's, or an outer wrapper (a trace_torch recorder)
        signature = inspect.signature(method)

        def counted(*args: Any, **kwargs: Any) -> Any:
            kind, microbatch = torch_action(name, signature.bind(*args, **kwargs))
            self.running = f"{stage.stage_index}{kind}{microbatch}"
            out = method(*args, **kwargs)  # an error leaves it running: where it failed
            self.finished, self.last, self.running = self.finished + 1, self.running, None
            return out

        return counted

    def position(self) -> int | None:
        """The program item holding this step's action number `finished` (the one running,
        or the next); None when all have finished. An overlapped pair is two actions."""
        row = self.schedule.program.get(self.rank, []) if self.schedule is not None else []
        count = 0
        for position, item in enumerate(row):
            count += len(item.halves)
            if count > self.finished:
                return position
        return None

    def report(self, frames: list[FrameType]) -> str:
        """The line naming the action this rank waits on, and the grid with it marked."""
        calls = [f.f_code.co_name for f in frames if "/torch/distributed/pipelining/" in
                 f.f_code.co_filename.replace("\\", "/")][::-1]  # fmt: skip
        inside = f"in torch: {' > '.join(calls)}\n" if calls else ""
        grid = self.schedule.to_grid() if self.schedule is not None else ""
        if not self.stepping:
            line = f"rank {self.rank} is not in a step of {self.name} ({self.steps} finished)"
            return f"{line}\n{inside}{grid}\n"
        position, done = self.position(), f"{self.finished} of this step's actions finished"
        if position is None:  # all of this rank's program ran, or torch draws none
            where = f"in {self.running}" if self.running else f"after {self.last or 'its start'}"
            return f"rank {self.rank} waits {where} ({self.name}: {done})\n{inside}{grid}\n"
        assert self.schedule is not None  # a position is counted in its program
        cell = str(self.schedule.program[self.rank][position])
        if self.running is not None:
            line = f"waits in {cell} ({self.name}, position {position}: started, not finished)"
            if self.running not in cell.split("+"):  # torch's order names it otherwise
                line += f"; torch runs it as {self.running}"
        elif self.finished == 0:
            line = f"waits before {cell} ({self.name}, position {position}: the step's first "
            line += "action; none started yet)"
        else:
            line = f"waits before {cell} ({self.name}, position {position}: the next action; "
            line += f"{done}, the last {self.last})"
        grid = waiting_grid(self.schedule, self.rank, position)
        return f"rank {self.rank} {line}\n{inside}{grid}\n"


def waiting_grid(schedule: Schedule, rank: int, position: int) -> str:
    """The schedule's grid around the action `rank` waits in, marked `<-- WAITING HERE`."""
    return render_grid(schedule.program, [(rank, position)], window=True, marker=WAITING)
