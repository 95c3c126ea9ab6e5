"""What tests/test_torchpp.py runs on 2 gloo ranks: torch's own schedules, torch's own stages.

A 4-stage model on 2 ranks, two stages each (ZBV, DualPipeV: a V; interleaved: looped):

    stage 0: tanh(Linear(x))                                  (first: torch runs full B at W)
    stage 1: Linear(x).view(b, 2, D // 2)                     (output is a view)
    stage 2: tied.Linear(tanh(mid(tied.Linear(x.view(b, D))))) (one Linear used twice)
    stage 3: Linear(x)                                        (last: I starts at the loss)
"""

from __future__ import annotations

import copy
import datetime
import logging

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    ScheduleDualPipeV,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.distributed.pipelining import _backward as torch_backward
from torch.distributed.pipelining import stage as torch_stage

D, BATCH, MICROBATCHES = 8, 8, 4
SCHEDULES = {
    "zbv": ScheduleZBVZeroBubble,
    "dualpipev": ScheduleDualPipeV,
    "interleaved-zb": ScheduleInterleavedZeroBubble,
}
V_PLACED = ("zbv", "dualpipev")


class First(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))


class ViewOut(nn.Module):
    def __init__(self, view: bool) -> None:
        super().__init__()
        self.lin, self.view = nn.Linear(D, D), view

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)  # (b, D)
        return h.view(h.shape[0], 2, D // 2) if self.view else h.reshape(-1, 2, D // 2) * 1


class Tied(nn.Module):
    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.lin, self.mid = nn.Linear(D, D), nn.Linear(D, D)
        self.out = self.lin if tied else nn.Linear(D, D)  # tied: the same Linear twice

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], D)  # (b, D), a copy-free view of stage 1's (b, 2, D/2)
        return self.out(torch.tanh(self.mid(self.lin(x))))


def make_model(view: bool = True, tied: bool = True) -> list[nn.Module]:
    torch.manual_seed(0)
    return [First(), ViewOut(view), Tied(tied), nn.Linear(D, D)]


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (out - target).pow(2).mean()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, D, generator=g), torch.randn(BATCH, D, generator=g)


def oracle(mods: list[nn.Module]) -> dict[str, torch.Tensor]:
    """One process, plain loss.backward(): the mean of the microbatches' losses, as torch's
    schedule (scale_grads=True) averages the gradients over microbatches."""
    mods = copy.deepcopy(mods)
    x, y = batch()
    total = 0
    for xs, ys in zip(x.tensor_split(MICROBATCHES), y.tensor_split(MICROBATCHES), strict=True):
        h = xs
        for m in mods:
            h = m(h)
        total = total + loss_fn(h, ys)
    (total / MICROBATCHES).backward()
    return {f"{i}.{n}": p.grad for i, m in enumerate(mods) for n, p in m.named_parameters()}


def step(schedule_name: str, view: bool, tied: bool, exact: bool, timeout_s: float) -> dict:
    """One torch schedule step on this rank's two stages, in a fresh process group.

    Returns this rank's gradients by name, or the error it raised. The fresh group (and its
    short timeout) keeps a failure on one rank from leaving stray messages for the next
    case or hanging the other rank.
    """
    import zbkit.torchpp

    rank = dist.get_rank()
    dist.barrier()  # a rank that failed early waits here for its peer's timeout to end
    group = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=timeout_s))
    mods = make_model(view, tied)
    # the V: rank 0 holds stages 0 and 3, rank 1 stages 1 and 2; interleaved: 0, 2 | 1, 3
    here = [rank, 3 - rank] if schedule_name in V_PLACED else [rank, rank + 2]
    stages = [PipelineStage(mods[s], s, 4, torch.device("cpu"), group=group) for s in here]
    schedule = SCHEDULES[schedule_name](stages, MICROBATCHES, loss_fn=loss_fn)
    x, y = batch()
    args = (x,) if 0 in here else ()  # the input where stage 0 is, the target where 3 is
    kwargs = {"target": y} if 3 in here else {}
    # torch logs the whole schedule grid on a failure; the failures here are expected
    logging.getLogger("torch.distributed.pipelining.schedules").setLevel(logging.CRITICAL)
    try:
        if exact:
            with zbkit.torchpp.exact_split_backward():
                schedule.step(*args, **kwargs)
        else:
            schedule.step(*args, **kwargs)
    except Exception as exc:  # the report names it; the test decides what it must be
        causes, e = [], exc
        while e is not None:
            causes.append(f"{type(e).__name__}: {e}")
            e = e.__cause__ or e.__context__
        return {"error": "\n".join(causes)}
    dist.destroy_process_group(group)
    grads = {f"{s}.{n}": p.grad for s in here for n, p in mods[s].named_parameters()}
    return {"grads": grads}


def check_all(fail_timeout_s: float, timeout_s: float) -> dict:
    """Every distributed case of tests/test_torchpp.py, in one launch.

    Where torch fails on one rank (rank 1, which holds the stages it cannot run), the other
    waits for a message that never comes, for `fail_timeout_s`; every other wait (the cases
    that must run, rank 1 on its way to the failure) must succeed: up to `timeout_s` each.
    """
    import zbkit.torchpp

    torch_fns = (torch_backward.stage_backward_input, torch_backward.stage_backward_weight)
    report: dict = {}
    for name in SCHEDULES:
        report[f"exact {name}"] = step(name, view=True, tied=True, exact=True, timeout_s=timeout_s)
    back = (torch_stage.stage_backward_input, torch_stage.stage_backward_weight)
    report["restored"] = [a is b for a, b in zip(back, torch_fns, strict=True)]
    report["enabled after"] = zbkit.torchpp.is_enabled()
    # last: a failed step leaves messages in flight that a later step could trip over
    waits = fail_timeout_s if dist.get_rank() == 0 else timeout_s  # rank 0 waits in vain
    report["torch view"] = step("zbv", True, False, exact=False, timeout_s=waits)
    report["torch tied"] = step("zbv", False, True, exact=False, timeout_s=waits)
    return report
