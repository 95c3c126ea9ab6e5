"""What the ranks of test_pipeline_real_code_dist.py run (shipped to them by value)."""

from __future__ import annotations

import copy
import time

import real_code_models as cases
import torch
import torch.distributed as dist
from torch.nn.functional import mse_loss

from zbkit import build_schedule
from zbkit.pipeline import PipelineStage, ScheduleRunner

WAIT = 120.0  # every wait here must succeed: minutes on a busy machine


def _max_err(mods, expected) -> float:
    got = [p.grad for m in mods for p in m.parameters()]
    return max((g - e).abs().max().item() for g, e in zip(got, expected, strict=True))


def _pair_case(make, group, args, targets) -> dict:
    """Two steps of zb-h1 on (stage 0, stage 1) of ``make()``; gradients against autograd."""
    rank = dist.get_rank(group)
    torch.manual_seed(3)
    mods = list(make())
    twin = copy.deepcopy(mods)
    out = twin[0](*args)
    mse_loss(twin[1](*(out if isinstance(out, tuple) else (out,))), targets).backward()
    expected = [2 * p.grad for m in twin for p in m.parameters()]  # two steps: twice
    sch = build_schedule("zb-h1", pp=2, microbatches=2)
    runner = ScheduleRunner(sch, PipelineStage(mods[rank], rank, 2), mse_loss, group=group,
                            timeout=WAIT)  # fmt: skip
    for _ in range(2):  # the second step takes the cached route of the edge
        runner.step(*args, target=targets if rank == 1 else None)
    mine = expected[:2] if rank == 0 else expected[2:]  # each stage here has weight and bias
    seen = getattr(mods[rank], "seen", None)
    return {
        "err": _max_err([mods[rank]], mine),
        "seen": None if seen is None else [s is None for s in seen],
    }


def check_real_code() -> list[dict]:
    report = []
    x, y = cases.data()
    bias = torch.randn(4, cases.D, generator=torch.Generator().manual_seed(5))
    mask = (bias > 0).float()
    runs = {
        "None in the middle": (lambda: (cases.WithPast(), cases.TakesPast()), (x,), y),
        "trailing None": (lambda: (cases.EndsWithNone(), cases.TakesTwo()), (x,), y),
        "several inputs": (lambda: (cases.TwoInputs(), torch.nn.Linear(cases.D, 1)),
                           (x, bias, mask), y),
    }  # fmt: skip
    for name, (make, args, targets) in runs.items():
        group = dist.new_group([0, 1])
        row = {"case": name, "rank": dist.get_rank()}
        try:
            row |= _pair_case(make, group, args, targets)
        except Exception as exc:  # reported, so the test shows it with the rank
            row["error"] = f"{type(exc).__name__}: {exc}"
        report.append(row)
    # ranks built with different schedules: every rank fails at once, naming both sides
    group = dist.new_group([0, 1])
    rank = dist.get_rank()
    sch = build_schedule("zb-h1", pp=2, microbatches=4 if rank == 0 else 2)
    mods = cases.two_stages()
    runner = ScheduleRunner(sch, PipelineStage(mods[rank], rank, 2), mse_loss, group=group,
                            timeout=WAIT)  # fmt: skip
    began = time.monotonic()
    try:
        runner.step(x, targets=y)
        outcome = "ok"
    except Exception as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    report.append({"case": "different schedules", "rank": rank, "outcome": outcome,
                   "seconds": time.monotonic() - began})  # fmt: skip
    return report
