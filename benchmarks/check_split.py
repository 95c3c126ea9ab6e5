"""What check_split costs: a LocalPipeline step's wall time with it and without, side by side.

    .venv/bin/python benchmarks/check_split.py                       # transformer, zb-v, 4 stages
    .venv/bin/python benchmarks/check_split.py --model mlp --schedule zb-h1 --pp 4
    .venv/bin/python benchmarks/check_split.py --reps 11 --steps 11 --cpu-time

The check runs one extra whole backward (graph kept) on the first microbatch of each stage
and input shape that runs I, and compares; every later microbatch and step runs as without
it. So the first step should cost a little more (about one microbatch's backward on each
checked stage: stage 0 has no input gradient, its backward runs whole at W and is not
checked) and later steps the same.

Each repetition builds the model from one seed and a fresh LocalPipeline for each variant
(so step 1 is each stage's first microbatch of its shape) and runs `--steps` steps on the
same batch, the two variants step by step in alternating order, so both see the same load
on a shared machine. Printed: step 1's time, the median of the later steps, and the
ratios with / without (paired per step, medians over repetitions). One warm-up repetition
first: splitgrad caches its analysis per graph structure for the whole process, so a first
run pays that whichever variant it is. Gradients after the last step are compared (the
check changes none: 0 expected). Wall time (`--cpu-time`: process CPU time, which other
jobs disturb less); no claim beyond the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from zbkit.models import ResidualMLPBlock, TransformerBlock
from zbkit.pipeline import LocalPipeline
from zbkit.schedules import build_schedule


def make_stages(model: str, stages: int, blocks: int, dim: int) -> list[nn.Module]:
    torch.manual_seed(0)
    block = {
        "transformer": lambda: TransformerBlock(dim, heads=4),
        "mlp": lambda: ResidualMLPBlock(dim),
    }
    return [nn.Sequential(*(block[model]() for _ in range(blocks))) for _ in range(stages)]


def pipeline(args: argparse.Namespace, check: bool) -> LocalPipeline:
    """A fresh pipeline (its stages have checked nothing yet) on the model from one seed."""
    sch = build_schedule(args.schedule, pp=args.pp, microbatches=args.microbatches)
    mods = make_stages(args.model, sch.num_stages, args.blocks, args.dim)
    return LocalPipeline(mods, sch, nn.MSELoss(), check_split=check)


def timed_step(pipe: LocalPipeline, x: torch.Tensor, y: torch.Tensor, clock) -> float:
    for p in pipe.parameters():
        p.grad = None  # each step from zero, as after optimizer.zero_grad()
    t0 = clock()
    pipe.step(x, target=y)
    return clock() - t0


def run(args: argparse.Namespace, x, y, flip: int) -> tuple[dict[bool, list[float]], float]:
    """Both variants, step by step in alternating order (so both see the same load): each
    step's seconds per variant, and the largest gradient difference after the last step."""
    pipes = {check: pipeline(args, check) for check in (False, True)}
    times: dict[bool, list[float]] = {False: [], True: []}
    for step in range(args.steps):
        for check in (False, True) if (step + flip) % 2 == 0 else (True, False):
            times[check].append(timed_step(pipes[check], x, y, args.clock))
    pairs = zip(pipes[True].parameters(), pipes[False].parameters(), strict=True)
    return times, max((a.grad - b.grad).abs().max().item() for a, b in pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", choices=("transformer", "mlp"), default="transformer")
    ap.add_argument("--schedule", default="zb-v", help="a schedule with I and W: zb-h1, zb-v, ...")
    ap.add_argument("--pp", type=int, default=2, help="ranks (zb-v: 2 stages each)")
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=2, help="blocks per stage")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--steps", type=int, default=6, help="step 1, then the later ones")
    ap.add_argument("--reps", type=int, default=7, help="paired repetitions")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cpu-time", action="store_true", help="time CPU, not wall (one thread)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    # wall time; --cpu-time: this process's CPU time, which other jobs disturb less
    args.clock = time.process_time if args.cpu_time else time.perf_counter
    if args.steps < 2:
        ap.error("--steps must be at least 2: step 1 and a later one")

    stages = build_schedule(args.schedule, pp=args.pp, microbatches=args.microbatches).num_stages
    print(
        f"{args.model}: {stages} stages x {args.blocks} blocks (d={args.dim}), batch "
        f"{args.batch} x {args.tokens} tokens, {args.schedule} pp={args.pp}, "
        f"{args.microbatches} microbatches, {args.threads} thread(s), {args.reps} reps x "
        f"{args.steps} steps"
    )
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.tokens, args.dim, generator=g)  # (b, t, d)
    y = torch.randn(args.batch, args.tokens, args.dim, generator=g)
    run(args, x, y, 0)  # warm-up: splitgrad's per-structure analysis, the allocator
    first: dict[bool, list[float]] = {False: [], True: []}
    later: dict[bool, list[float]] = {False: [], True: []}
    first_ratio, later_ratio, diff = [], [], 0.0
    for rep in range(args.reps):
        times, d = run(args, x, y, rep % 2)
        diff = max(diff, d)
        for check in (False, True):
            first[check].append(times[check][0])
            later[check].append(statistics.median(times[check][1:]))
        first_ratio.append(times[True][0] / times[False][0])
        paired = [a / b for a, b in zip(times[True][1:], times[False][1:], strict=True)]
        later_ratio.append(statistics.median(paired))

    ms = lambda xs: f"{1e3 * statistics.median(xs):9.1f}"  # noqa: E731
    clock = "CPU" if args.cpu_time else "wall"
    print(f"\n{clock + ' time':<24} {'without':>9} {'with':>9} {'with/without':>13}")
    print(f"{'step 1 (ms)':<24} {ms(first[False])} {ms(first[True])} "
          f"{statistics.median(first_ratio):13.3f}")  # fmt: skip
    print(f"{f'steps 2-{args.steps}, median (ms)':<24} {ms(later[False])} {ms(later[True])} "
          f"{statistics.median(later_ratio):13.3f}")  # fmt: skip
    print(f"\nper-rep ratios, step 1: {[round(r, 3) for r in first_ratio]}; "
          f"later: {[round(r, 3) for r in later_ratio]}")  # fmt: skip
    # what the check adds: one microbatch's whole backward on each stage but the first
    share = (stages - 1) / (stages * args.microbatches)
    print(
        f"expected extra on step 1: one backward of 1 of {args.microbatches} microbatches on "
        f"{stages - 1} of {stages} stages = {share:.1%} of the step's backward work; later "
        "steps: none"
    )
    print(f"largest gradient difference, with vs without: {diff:.3g}")


if __name__ == "__main__":
    main()
