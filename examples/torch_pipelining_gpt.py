"""Train the same small GPT under torch.distributed.pipelining, with zbkit's exact split
backward and zbkit's tracing around torch's own runtime.

    # CPU, 2 ranks (gloo)
    torchrun --standalone --nproc-per-node 2 examples/torch_pipelining_gpt.py --backend gloo
    # GPUs (nccl, rank k on cuda:LOCAL_RANK), e.g. 4
    torchrun --standalone --nproc-per-node 4 examples/torch_pipelining_gpt.py --backend nccl

Options: ``--schedule`` (a torch schedule class: ScheduleZBVZeroBubble, the default;
ScheduleInterleavedZeroBubble, ScheduleDualPipeV, Schedule1F1B, ScheduleGPipe,
ScheduleInterleaved1F1B, ScheduleLoopedBFS), ``--steps``, ``--microbatches``, ``--batch``.
``--backend`` defaults to nccl when CUDA is available, else gloo.

Everything that trains is torch's: its ``PipelineStage`` and schedule classes, its
``schedule.step``. zbkit adds three things:

- where torch puts each stage: ``Schedule.from_torch(cls, ...)`` reads torch's program and
  placement (for ZBV, stages r and 2p-1-r on rank r), so ``stages_on(rank)`` says which to build;
- ``zbkit.torchpp.exact_split_backward()``: torch's zero-bubble schedules split each backward
  into I and W with zbkit's split, which equals ``loss.backward()`` on every graph;
- ``zbkit.pipeline.trace_torch``: every compute action of the last step recorded, the bubble
  measured, and the program that ran simulated with the times measured in it.

The rank holding the last stage prints the loss of every step and, at the end, the bubbles.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.distributed.pipelining.schedules as torch_schedules
from _gpt import (
    TensorOut,
    add_backend_argument,
    build_model,
    counting_batch,
    cross_entropy,
    start_rank,
)
from torch.distributed.pipelining import PipelineStage

import zbkit.torchpp
from zbkit.models import split_stages
from zbkit.pipeline import schedule_of_trace, trace_torch
from zbkit.schedules import Schedule, simulate
from zbkit.schedules.measure import hop_latency, measured_costs

TORCH_SCHEDULES = (
    "ScheduleZBVZeroBubble",
    "ScheduleInterleavedZeroBubble",
    "ScheduleDualPipeV",
    "Schedule1F1B",
    "ScheduleGPipe",
    "ScheduleInterleaved1F1B",
    "ScheduleLoopedBFS",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", choices=TORCH_SCHEDULES, default="ScheduleZBVZeroBubble")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32, help="rows per step")
    parser.add_argument("--lr", type=float, default=0.5)
    add_backend_argument(parser)
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1: the bubble is read from the last step")

    device = start_rank(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    cls = getattr(torch_schedules, args.schedule)
    placed = Schedule.from_torch(cls, pp=world, microbatches=args.microbatches)
    n, mine = placed.num_stages, placed.stages_on(rank)  # ZBV on 2 ranks: 4 stages, [0, 3] [1, 2]
    parts = split_stages(build_model(), n)  # every rank builds all stages, keeps its own
    # torch's PipelineStage leaves the module where it is: move it to this rank's device first
    stages = [PipelineStage(TensorOut(parts[s]).to(device), s, n, device) for s in mine]
    schedule = cls(
        stages if len(stages) > 1 else stages[0],  # single-stage classes take one stage
        args.microbatches,
        loss_fn=cross_entropy,  # torch's form: loss_fn(last stage's output, target)
    )
    params = [p for st in stages for p in st.submod.parameters()]
    # plain SGD: a step proportional to the gradient, so a gradient averaged wrongly (over
    # microbatches, replicas or a window) shows in the loss
    optimizer = torch.optim.SGD(params, lr=args.lr)
    first, last = 0 in mine, n - 1 in mine
    if last:
        print(
            f"torch's {args.schedule}: {world} {args.backend} ranks, {n} stages, "
            f"{args.microbatches} microbatches",
            flush=True,
        )

    with zbkit.torchpp.exact_split_backward():  # torch's I and W are zbkit's while inside
        for step in range(args.steps):
            x, y = counting_batch(args.batch, step)  # (batch, TOKENS) each
            losses: list[torch.Tensor] = []
            with trace_torch(schedule) as rec:  # the user's torch call, unchanged
                schedule.step(
                    *([x.to(device)] if first else []),
                    target=y.to(device) if last else None,
                    losses=losses if last else None,
                )
            optimizer.step()
            optimizer.zero_grad()
            if last:
                loss = torch.stack(losses).mean()  # equal microbatches: the batch's mean loss
                print(f"step {step} loss {loss.item():.6f}", flush=True)

    trace = rec.gather_trace()  # the last step, every rank's actions (collective)
    if last:
        ran = schedule_of_trace(trace, placed.stage_to_rank, name=args.schedule)
        costs = measured_costs(trace.events, n, comm=hop_latency(trace.events))
        sim = simulate(ran, costs)
        print(
            f"bubble: traced {trace.bubble_rate:.3f}, simulated {sim.bubble_rate:.3f} "
            "(the last step's program, with F, I, W and hop times measured in it)",
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
