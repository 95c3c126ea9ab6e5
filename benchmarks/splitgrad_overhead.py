"""Time of split backward (I + W) over plain backward and over torch's own split.

    python benchmarks/splitgrad_overhead.py [--reps 30] [--only a|b]

(a) overhead-bound: 48 residual blocks, d=64, input 4x8x64.
(b) compute-bound: 6 residual blocks, d=256, input 16x64x256.
Block: x + Linear(4d->d)(GELU(Linear(d->4d)(LayerNorm(x)))).

    python benchmarks/splitgrad_overhead.py --cpu-time   # on a busy machine

Each repetition runs a fresh forward, then one backward per variant, in a
rotating order (paired runs); printed ratios are medians of per-repetition
ratios. One thread. Baselines, measured side by side in this process:
plain `torch.autograd.backward`, and torch.distributed.pipelining's
`stage_backward_input` + `stage_backward_weight`.

`--ablate` also times zbkit with the W pass forced through one engine call
per parameter group (the way torch and the seed do it).

What each idea bought (2-core machine shared with other jobs, load 3-6, so
+-10% noise; medians of 20-30 paired repetitions):

- Batched W (zbkit/splitgrad/_weight.py). The big one. Every engine call first
  walks the whole graph below its roots, so one call per group costs
  O(groups x nodes): on (a) 144 groups x ~600 nodes. Calling each group's
  intermediate node directly, inside one tiny engine call whose bookkeeping
  marks only the parameter-side edges as needed (so each node computes only its
  weight half), then delivering all weight gradients in one more engine call:
  (a) 3.9-4.0x -> 1.4-1.8x plain (`ablation zbkit-engine-W` vs `zbkit`);
  (b) no measurable change (1.07x vs 1.10x, inside the noise).
- Weight nodes read off the graph's AccumulateGrad nodes instead of one
  throwaway view per parameter (torch's `_get_grad_fn_or_grad_acc`): about
  1.4 ms of CPU time per microbatch on (a) (290 parameters), ~10% of plain.
- Freeing each captured gradient as soon as its node ran in W: memory, not time.
- Caching the analysis per graph structure: measured, not built. The whole
  analysis (reverse graph + groups) is ~2 ms of CPU time on (a), while a sound
  structural signature needs a walk over every node (~0.8 ms), so a cache could
  buy at most ~7% of I+W here; not worth the risk of a stale plan.
- Batching groups into one engine call whose roots cannot reach each other's
  params: not possible on these stages; in a residual stack every later
  group's roots reach every earlier group's params through the input path.
- What is left on (a): the analysis (~2 ms), 144 capture hooks in I and 144
  direct node calls in W (~7 us each). On (b) both split implementations sit
  around 1.03-1.10x: the LayerNorm backward runs twice (each half recomputes
  the normalised input) and captured gradients stay alive between I and W.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn
from torch.distributed.pipelining import _backward as torch_split

from zbkit.models import ResidualMLPBlock
from zbkit.splitgrad import _weight as split_weight
from zbkit.splitgrad import stage_backward_input, stage_backward_weight

# wall time by default; --cpu-time uses this process's CPU time, which other
# jobs on a shared machine disturb much less (we run on one thread)
CLOCK = time.perf_counter

CONFIGS = {
    "a": dict(blocks=48, dim=64, shape=(4, 8, 64), label="overhead-bound, 48 blocks d=64"),
    "b": dict(blocks=6, dim=256, shape=(16, 64, 256), label="compute-bound, 6 blocks d=256"),
}


def _plain(model, x, g):
    out = model(x)
    t0 = CLOCK()
    torch.autograd.backward([out], [g])
    return CLOCK() - t0


def _ours(model, x, g):
    out = model(x)
    params = [p for p in model.parameters() if p.requires_grad]
    t0 = CLOCK()
    res = stage_backward_input([out], [g], [x], params)
    stage_backward_weight(params, res.param_groups)
    return CLOCK() - t0


def _torch(model, x, g):
    out = model(x)
    t0 = CLOCK()
    _, groups = torch_split.stage_backward_input([out], [g], [x], model.parameters())
    torch_split.stage_backward_weight(model.parameters(), groups)
    return CLOCK() - t0


def _ours_engine_only(model, x, g):
    # ablation: every group through its own engine call (no batched W)
    batchable, split_weight._batchable = split_weight._batchable, lambda group: False
    try:
        return _ours(model, x, g)
    finally:
        split_weight._batchable = batchable


VARIANTS = {"plain": _plain, "zbkit": _ours, "torch": _torch}
ABLATIONS = {"zbkit-engine-W": _ours_engine_only}


def measure(cfg: dict, reps: int, variants: dict) -> dict[str, list[float]]:
    torch.manual_seed(0)
    model = nn.Sequential(*(ResidualMLPBlock(cfg["dim"]) for _ in range(cfg["blocks"])))
    g = torch.randn(cfg["shape"])
    times: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for rep in range(reps + 3):  # 3 warm-up repetitions, dropped
        r = rep % len(names)
        for k in names[r:] + names[:r]:  # rotate who goes first
            x = torch.randn(cfg["shape"], requires_grad=True)
            model.zero_grad(set_to_none=True)
            dt = variants[k](model, x, g)
            if rep >= 3:
                times[k].append(dt)
    return times


def ratio(t: dict[str, list[float]], a: str, b: str) -> float:
    """Median over repetitions of time(a) / time(b), each pair from the same repetition."""
    return statistics.median(x / y for x, y in zip(t[a], t[b], strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--only", choices=sorted(CONFIGS))
    parser.add_argument(
        "--cpu-time", action="store_true", help="time with process CPU time instead of wall time"
    )
    parser.add_argument(
        "--ablate", action="store_true", help="also time W with one engine call per group"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    global CLOCK
    CLOCK = time.process_time if args.cpu_time else time.perf_counter
    print(f"clock: {'process CPU time' if args.cpu_time else 'wall time'}, {args.reps} reps")
    for key, cfg in CONFIGS.items():
        if args.only and key != args.only:
            continue
        variants = VARIANTS | (ABLATIONS if args.ablate else {})
        t = measure(cfg, args.reps, variants)
        print(
            f"({key}) {cfg['label']}: plain {statistics.median(t['plain']) * 1e3:.2f} ms | "
            f"zbkit I+W / plain = {ratio(t, 'zbkit', 'plain'):.2f}x | "
            f"torch I+W / plain = {ratio(t, 'torch', 'plain'):.2f}x | "
            f"zbkit / torch = {ratio(t, 'zbkit', 'torch'):.2f}x"
        )
        for k in ABLATIONS if args.ablate else ():
            print(f"    ablation {k} / plain = {ratio(t, k, 'plain'):.2f}x")


if __name__ == "__main__":
    main()
