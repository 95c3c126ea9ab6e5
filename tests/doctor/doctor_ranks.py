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
