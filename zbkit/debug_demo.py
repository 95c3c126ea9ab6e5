"""A torchrun job that deadlocks on purpose: what ``zbkit.debug.install`` turns a hang into::

    torchrun --nproc-per-node 2 -m zbkit.debug_demo

It ships with zbkit (not only in its tests) so notebook 08 runs it from any install.
Both ranks run one valid schedule (pp=2, m=2; each rank's B of a microbatch before its next
F), except that rank 1 skips one action of its plan: the send of microbatch 0's gradient.
So rank 0 waits at 0B0 for that gradient, and rank 1 at 1F1 for the activations rank 0 only
sends after 0B0: neither moves. ``zbkit.debug.install`` makes each rank print its stacks and
the grid with ``<-- WAITING HERE`` and exit with code 3, within seconds (``ZBKIT_DEBUG_TIMEOUT``,
5 by default) instead of the runner's 120 s timeout (or torch's 30 minutes).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn

import zbkit.debug
from zbkit.parallel import init_distributed
from zbkit.pipeline import PipelineStage, ScheduleRunner
from zbkit.schedules import Schedule
from zbkit.schedules.core.plan import Plan

SCHEDULE = Schedule.from_program(
    {0: ["0F0", "0B0", "0F1", "0B1"], 1: ["1F0", "1B0", "1F1", "1B1"]}, name="b-before-f"
)
SKIPPED = "send grad 0:0 -> rank 0"  # the bug: the step of rank 1's plan it leaves out


def main() -> None:
    # minutes for the waits that must succeed: torchrun's ranks may reach the rendezvous
    # seconds apart on a busy machine
    dog = zbkit.debug.install(timeout=300)
    init_distributed("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    stage = PipelineStage(nn.Linear(4, 4), rank, 2, "cpu")  # torch's form: Tensor in and out
    runner = ScheduleRunner(SCHEDULE, stage, nn.functional.mse_loss, timeout=120)
    if rank == 1:  # the bug: rank 1 skips the send of microbatch 0's gradient
        steps = tuple(s for s in runner.plan if str(s) != SKIPPED)
        assert len(steps) == len(runner.plan) - 1, f"no step {SKIPPED!r} in\n{runner.plan}"
        runner.plan = Plan(1, steps)
    print(f"rank {rank} runs:\n{runner.plan}", flush=True)
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    dist.barrier()  # both ranks at the step: each of its waits is the deadlock or takes ms
    dog.timeout = float(os.environ.get("ZBKIT_DEBUG_TIMEOUT", "5"))  # the deadlock: soon
    runner.step(x, target=y)
    print(f"rank {rank}: the step finished, which it cannot", flush=True)


if __name__ == "__main__":
    main()
