"""Train a small GPT with a zero-bubble pipeline schedule on zbkit's runtime.

    # CPU, 2 ranks (gloo): one pipeline of 2 ranks
    torchrun --standalone --nproc-per-node 2 examples/pipeline_gpt.py --backend gloo
    # CPU, 4 ranks: 2 pipelines of 2 ranks (PP x DP), gradients averaged between them
    torchrun --standalone --nproc-per-node 4 examples/pipeline_gpt.py --backend gloo --pp 2
    # GPUs (nccl, rank k on cuda:LOCAL_RANK), e.g. 8 GPUs: 2 pipelines of 4
    torchrun --standalone --nproc-per-node 8 examples/pipeline_gpt.py --backend nccl --pp 4

Options: ``--schedule`` (any of ``zbkit.schedules.SCHEDULES``: zb-v, zb-h1, zb-h2, zb-auto,
1f1b, interleaved-zb, ...; default zb-v), ``--steps``, ``--microbatches``, ``--batch`` (rows
per pipeline per step), ``--chrome-trace FILE``. ``--backend`` defaults to nccl when CUDA is
available, else gloo.

The world is laid out as ``dp = world / pp`` pipelines of ``pp`` consecutive ranks
(``zbkit.parallel.pp_dp_groups``). Each rank builds the whole model (same seed), cuts it into
the schedule's stages (``zbkit.models.split_stages``; zb-v has two per rank, in a V) and keeps
its own. The rank holding the last stage of pipeline 0 prints the loss of every step (the
mean over all pipelines' data) and, at the end, the last step's bubble as measured next to
its simulation with the F, I, W and hop times measured in that same step. On a few shared CPU
cores the measured bubble is the larger: actions of a millisecond or so also wait for a free
core and pay gloo's per-message cost between them, which the simulation does not see.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from _gpt import add_backend_argument, build_model, counting_batch, cross_entropy, start_rank

import zbkit.debug
from zbkit.models import split_stages
from zbkit.parallel import pp_dp_groups
from zbkit.pipeline import PipelineStage, ScheduleRunner
from zbkit.schedules import SCHEDULES, build_schedule, simulate
from zbkit.schedules.measure import hop_latency, measured_costs


def loss_fn(outputs: dict[str, torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
    return cross_entropy(outputs["logits"], targets)  # the last stage returns {"logits": ...}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", choices=SCHEDULES, default="zb-v")
    parser.add_argument("--pp", type=int, default=2, help="ranks per pipeline (default 2)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32, help="rows per pipeline per step")
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--chrome-trace", metavar="FILE", help="write the last step's trace")
    add_backend_argument(parser)
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1: the bubble is read from the last step")

    device = start_rank(args.backend)
    zbkit.debug.install(timeout=120)  # a hang prints every rank's stack and the marked grid
    world = dist.get_world_size()
    if world % args.pp:
        raise SystemExit(f"--pp {args.pp} does not divide the {world} ranks into pipelines")
    dp = world // args.pp
    # pipeline d is ranks d*pp .. d*pp+pp-1; dp_group: the ranks holding my stages elsewhere
    pp_group, dp_group, pp_rank, dp_rank = pp_dp_groups(pp=args.pp, dp=dp)

    schedule = build_schedule(args.schedule, pp=args.pp, microbatches=args.microbatches)
    parts = split_stages(build_model(), schedule.num_stages)  # all stages; keep my own
    mine = schedule.stages_on(pp_rank)
    stages = [PipelineStage(parts[s], s, schedule.num_stages, device) for s in mine]
    runner = ScheduleRunner(
        schedule, stages, loss_fn, group=pp_group, dp_group=dp_group if dp > 1 else None
    )
    params = [p for st in stages for p in st.module.parameters()]
    # plain SGD: a step proportional to the gradient, so a gradient averaged wrongly (over
    # microbatches, replicas or a window) shows in the loss
    optimizer = torch.optim.SGD(params, lr=args.lr)
    holds_last = schedule.num_stages - 1 in mine
    talks = holds_last and dp_rank == 0  # one rank prints
    if talks:
        print(
            f"{schedule.name}: {world} {args.backend} ranks = pp {args.pp} x dp {dp}, "
            f"{schedule.num_stages} stages, {args.microbatches} microbatches",
            flush=True,
        )

    for step in range(args.steps):
        x, y = counting_batch(args.batch, step, replica=dp_rank)  # (batch, TOKENS) each
        losses = runner.step(x.to(device), targets=y.to(device))  # None off the last stage
        optimizer.step()  # gradients are already averaged over the dp replicas
        optimizer.zero_grad()
        if holds_last:
            assert losses is not None
            loss = torch.stack(losses).mean()  # equal microbatches: the batch's mean loss
            if dp > 1:  # the ranks holding the last stage: one per pipeline
                dist.all_reduce(loss, group=dp_group)
                loss /= dp
            if talks:
                print(f"step {step} loss {loss.item():.6f}", flush=True)

    trace = runner.gather_trace()  # collective over the pipeline: every rank's last step
    if talks:
        costs = measured_costs(trace.events, schedule.num_stages, comm=hop_latency(trace.events))
        sim = simulate(schedule, costs)
        print(
            f"bubble: measured {trace.bubble_rate:.3f}, simulated {sim.bubble_rate:.3f} "
            "(the last step; F, I, W and hop times measured in it)",
            flush=True,
        )
        if args.chrome_trace:
            trace.to_chrome(args.chrome_trace)
            print(f"trace written to {args.chrome_trace}: open it in https://ui.perfetto.dev")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
