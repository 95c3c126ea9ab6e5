"""What tests/doctor/test_doctor_schedule.py runs on 2 gloo ranks: torch's ZBV with the stages
placed looped (rank r: r and r + 2) instead of on the V (rank r: r and 3 - r)."""

from __future__ import annotations

import datetime
import logging

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleZBVZeroBubble


def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (out - target).pow(2).mean()


def off_the_v(fail_timeout_s: float) -> dict:
    import zbkit.doctor

    rank = dist.get_rank()
    group = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=fail_timeout_s))
    torch.manual_seed(0)
    mods = [nn.Linear(4, 4) for _ in range(4)]
    here = [rank, rank + 2]  # looped: not the V's [rank, 3 - rank]
    stages = [PipelineStage(mods[s], s, 4, torch.device("cpu"), group=group) for s in here]
    schedule = ScheduleZBVZeroBubble(stages, 4, loss_fn=mse)
    x, y = torch.randn(8, 4), torch.randn(8, 4)
    report = zbkit.doctor.check(stages, schedule, inputs=x if rank == 0 else None)
    out: dict = {"traps": report.traps(), "where": [f.where for f in report]}
    logging.getLogger("torch.distributed.pipelining.schedules").setLevel(logging.CRITICAL)
    try:
        schedule.step(*([x] if rank == 0 else []), target=y if 3 in here else None)
        out["step"] = "ran"
    except Exception as exc:  # the test decides what it must be
        out["step"] = f"{type(exc).__name__}: {exc}"[:300]
    return out


def tied_model() -> list[nn.Module]:
    """A tied input/output embedding cut into two stages (the same table in both)."""

    class Embed(nn.Module):
        def __init__(self, table: nn.Embedding) -> None:
            super().__init__()
            self.table = table

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.table(ids)

    class Head(nn.Module):
        def __init__(self, table: nn.Embedding) -> None:
            super().__init__()
            self.table = table

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return torch.tanh(h) @ self.table.weight.t()

    torch.manual_seed(0)
    table = nn.Embedding(10, 4)
    return [Embed(table), Head(table)]


def ce(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())


def tied_ids() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return torch.randint(10, (8, 3), generator=g), torch.randint(10, (8, 3), generator=g)


def tied_across_ranks(summed: bool) -> torch.Tensor:
    """zbkit's ScheduleRunner, zb-h1 on 2 ranks: each rank builds the tied model and keeps
    its stage; `summed`: the doctor's fix, the table's gradient all-reduced over both."""
    from zbkit.pipeline import PipelineStage as ZbkitStage
    from zbkit.pipeline import ScheduleRunner
    from zbkit.schedules import build_schedule

    rank = dist.get_rank()
    schedule = build_schedule("zb-h1", pp=2, microbatches=4)
    mods = tied_model()
    stage = ZbkitStage(mods[rank], rank, 2)
    x, y = tied_ids()
    ScheduleRunner(schedule, [stage], ce, timeout=120.0).step(x, targets=y)
    grad = mods[rank].table.weight.grad
    if summed:
        dist.all_reduce(grad)  # the group of the ranks holding it: here, the world
    return grad
