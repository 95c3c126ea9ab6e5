"""A torchrun job whose torch pipeline hangs on purpose, for tests/test_debug.py (and to try
by hand)::

    torchrun --nproc-per-node 2 tests/debug_torch_job.py      # ZBKIT_SKIP_STEP=2: see below

torch's own ``PipelineStage`` and ``Schedule1F1B`` (torch.distributed.pipelining), pp=2, m=4,
on gloo. The bug: rank 1 does not call ``schedule.step`` (it sleeps instead), from the first
step on, or with ``ZBKIT_SKIP_STEP=2`` from the second. ``zbkit.debug.install(timeout=...,
schedule=schedule)`` makes rank 0 print its stacks and torch's schedule grid with the action it
waits on marked ``<-- WAITING HERE``, and exit with code 3 (after ``ZBKIT_DEBUG_TIMEOUT``
seconds, 5 by default, in the step rank 1 skips; the steps before it get minutes); torchrun then
stops rank 1 (SIGTERM), which prints its own stacks before it exits.

Where rank 0 waits (torch 2.13): at the first step, before 0F0, in torch's stage set-up (a
P2P vote with rank 1 that every first step holds); at the second, before 0B0, after its two
warm-up forwards (its send of microbatch 0's activations, or the gradient, never arrives).
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

import zbkit.debug

MICROBATCHES = 4


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    stage = PipelineStage(nn.Linear(4, 4), rank, 2, torch.device("cpu"))
    schedule = Schedule1F1B(stage, MICROBATCHES, loss_fn=nn.functional.mse_loss)
    # minutes for the steps that run: on a busy machine one rank may wait seconds for the other
    dog = zbkit.debug.install(timeout=300, schedule=schedule)
    x, y = torch.randn(8, 4), torch.randn(8, 4)  # 4 microbatches of 2 rows
    skipped = int(os.environ.get("ZBKIT_SKIP_STEP", "1"))  # the step rank 1 does not run
    for step in range(1, skipped + 1):
        if step == skipped:  # the step that hangs: its wait is reported soon
            dog.timeout = float(os.environ.get("ZBKIT_DEBUG_TIMEOUT", "5"))
        if rank == 0:
            schedule.step(x)
        elif step < skipped:
            schedule.step(target=y)
        else:  # the bug: rank 1 does not run its part of this step
            time.sleep(600)
        print(f"rank {rank}: step {step} finished", flush=True)


if __name__ == "__main__":
    main()
