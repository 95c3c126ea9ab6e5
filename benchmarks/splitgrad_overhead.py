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

`--ablate` also times zbkit on the reference path alone (no fast path: what a
torch that fails `fast_paths_available()` gets), with the W pass forced through
one engine call per parameter group (the way torch and the seed do it), and
with LayerNorm weight halves left to W. A second line per stage gives the ratios on user CPU
time alone and the median minor page faults per backward (see below);
`--keep-heap` is a diagnostic that tells glibc never to give freed memory back
to the kernel (process-wide, so every variant), which removes those faults.

What each idea bought (2-core machine shared with other jobs, load 3-6, so
+-10% noise; medians of 20-30 paired repetitions):

- Batched W (zbkit/splitgrad/_fast.py, run_batched). The big one. Every engine call first
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
- Where (b)'s extra time went (measured per op with a dispatch mode timing
  thread CPU time, per node with page-fault counts, and with getrusage): not
  in the ops. Every matmul, GELU and bias reduction runs exactly once and costs
  the same in I/W as in plain (+-1%); the Python analysis is ~0.8 ms (0.5%).
  The LayerNorm backward ran twice (~0.15 ms per block). The rest, 5-10% of
  (b), was system time: first-touch page faults. A split must keep each
  block's (N x 4d) gradient at the up-projection alive from I to W (4 MB per
  block here), while plain backward reuses memory it frees as it goes; glibc
  returns freed heap to the kernel after every iteration, so each I faults
  ~24 MB of fresh pages in again (6000 faults, ~8-10 ms of CPU time).
  With `--keep-heap` the faults vanish and zbkit I+W is 1.01x plain (torch
  1.03x), so the split itself is nearly free in work.
- LayerNorm weight halves in I (zbkit/splitgrad/_fast.py, EAGER_NODES):
  I asks for a LayerNorm's weight gradients in the same fused kernel call as
  its input gradient, exactly what plain backward computes, and W only adds
  them to `.grad`. No recompute, and W no longer needs the node's incoming
  gradient (N x d), so I holds 1 MB less per block. Side by side in one
  process (40 paired repetitions, process CPU time) against the version
  before this and the next idea: (b) 1.12x -> 1.07x plain (new/old 0.96x);
  (a) 1.61x -> 1.58x. `ablation zbkit-no-eager-LN` shows this one alone.
- Reducing a Linear's bias gradient (`sum_to_size`, what the engine's own
  check does) right after each replayed node: AddmmBackward returns it
  unreduced, aliasing the captured (N x 4d) gradient, which therefore stayed
  alive until the last group. Now each capture is freed as its node runs and
  W's weight gradients reuse that memory: W's page faults on (b) ~2000 -> 0.
- What is left: on (a) the analysis (~2 ms), 144 capture hooks in I and 144
  direct node calls in W (~7 us each). On (b) the page faults of the held
  gradients (inherent to deferring W, torch's split pays them too) and the
  residual sum in I, which cannot be done in place because W still needs the
  gradient it would overwrite. Releasing what only I needed (GELU's saved
  input, 4 MB per block, the same size as what W must keep) would remove the
  faults, but `stage_backward_weight(retain_graph=True)` promises a graph
  that plain backward can still run through, and I cannot know which the
  caller will ask for; that would need an option on `stage_backward_input`.
"""

from __future__ import annotations

import argparse
import ctypes
import resource
import statistics
import time

import torch
from torch import nn
from torch.distributed.pipelining import _backward as torch_split

from zbkit.models import ResidualMLPBlock
from zbkit.splitgrad import _fast as split_fast
from zbkit.splitgrad import reference_weight_pass, stage_backward_input, stage_backward_weight

# wall time by default; --cpu-time uses this process's CPU time, which other
# jobs on a shared machine disturb much less (we run on one thread)
CLOCK = time.perf_counter

CONFIGS = {
    "a": dict(blocks=48, dim=64, shape=(4, 8, 64), label="overhead-bound, 48 blocks d=64"),
    "b": dict(blocks=6, dim=256, shape=(16, 64, 256), label="compute-bound, 6 blocks d=256"),
}


def _timed(run) -> tuple[float, int, float]:
    """(CLOCK seconds, minor page faults, user CPU seconds) of `run()`."""
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), CLOCK()
    run()
    t1, r1 = CLOCK(), resource.getrusage(resource.RUSAGE_SELF)
    return t1 - t0, r1.ru_minflt - r0.ru_minflt, r1.ru_utime - r0.ru_utime


def _plain(model, x, g):
    out = model(x)
    return _timed(lambda: torch.autograd.backward([out], [g]))


def _ours(model, x, g):
    out = model(x)
    params = [p for p in model.parameters() if p.requires_grad]

    def run():
        res = stage_backward_input([out], [g], [x], params)
        stage_backward_weight(params, res.param_groups)

    return _timed(run)


def _torch(model, x, g):
    out = model(x)

    def run():
        _, groups = torch_split.stage_backward_input([out], [g], [x], model.parameters())
        torch_split.stage_backward_weight(model.parameters(), groups)

    return _timed(run)


def _ours_reference(model, x, g):
    # ablation: no fast path at all (what a torch that fails the probe gets)
    with reference_weight_pass():
        return _ours(model, x, g)


def _ours_engine_only(model, x, g):
    # ablation: every group through its own engine call (no batched W)
    batchable, split_fast.batchable = split_fast.batchable, lambda work: bool(work.ready)
    try:
        return _ours(model, x, g)
    finally:
        split_fast.batchable = batchable


def _ours_no_eager(model, x, g):
    # ablation: LayerNorm weight halves split off to W like every other node
    eager, split_fast.eager_edges = split_fast.eager_edges, lambda *a: []
    try:
        return _ours(model, x, g)
    finally:
        split_fast.eager_edges = eager


VARIANTS = {"plain": _plain, "zbkit": _ours, "torch": _torch}
ABLATIONS = {
    "zbkit-reference": _ours_reference,
    "zbkit-engine-W": _ours_engine_only,
    "zbkit-no-eager-LN": _ours_no_eager,
}


def measure(cfg: dict, reps: int, variants: dict) -> dict[str, list[tuple[float, int, float]]]:
    """Per variant, per repetition: (time, minor page faults, user CPU time)."""
    torch.manual_seed(0)
    model = nn.Sequential(*(ResidualMLPBlock(cfg["dim"]) for _ in range(cfg["blocks"])))
    g = torch.randn(cfg["shape"])
    times: dict[str, list[tuple[float, int, float]]] = {k: [] for k in variants}
    names = list(variants)
    for rep in range(reps + 3):  # 3 warm-up repetitions, dropped
        r = rep % len(names)
        for k in names[r:] + names[:r]:  # rotate who goes first
            x = torch.randn(cfg["shape"], requires_grad=True)
            model.zero_grad(set_to_none=True)
            sample = variants[k](model, x, g)
            if rep >= 3:
                times[k].append(sample)
    return times


def _keep_freed_heap() -> None:
    """glibc: never give freed heap back to the kernel (process-wide; a diagnostic)."""
    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3  # mallopt parameter numbers, malloc.h
    if not (libc.mallopt(m_trim_threshold, 2**31 - 1) and libc.mallopt(m_mmap_threshold, 2**25)):
        raise RuntimeError("mallopt failed: --keep-heap needs glibc")


def ratio(t: dict[str, list[tuple]], a: str, b: str, field: int = 0) -> float:
    """Median over repetitions of time(a) / time(b), each pair from the same repetition."""
    return statistics.median(x[field] / y[field] for x, y in zip(t[a], t[b], strict=True))


def faults(t: dict[str, list[tuple]], a: str) -> int:
    return int(statistics.median(x[1] for x in t[a]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--only", choices=sorted(CONFIGS))
    parser.add_argument(
        "--cpu-time", action="store_true", help="time with process CPU time instead of wall time"
    )
    parser.add_argument(
        "--ablate",
        action="store_true",
        help="also time the reference path, one engine call per group in W, no LN halves in I",
    )
    parser.add_argument(
        "--keep-heap",
        action="store_true",
        help="diagnostic: glibc keeps freed memory (no page faults on reuse), see docstring",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.keep_heap:
        _keep_freed_heap()
    global CLOCK
    CLOCK = time.process_time if args.cpu_time else time.perf_counter
    print(f"clock: {'process CPU time' if args.cpu_time else 'wall time'}, {args.reps} reps")
    for key, cfg in CONFIGS.items():
        if args.only and key != args.only:
            continue
        variants = VARIANTS | (ABLATIONS if args.ablate else {})
        t = measure(cfg, args.reps, variants)
        plain_ms = statistics.median(x[0] for x in t["plain"]) * 1e3
        print(
            f"({key}) {cfg['label']}: plain {plain_ms:.2f} ms | "
            f"zbkit I+W / plain = {ratio(t, 'zbkit', 'plain'):.2f}x | "
            f"torch I+W / plain = {ratio(t, 'torch', 'plain'):.2f}x | "
            f"zbkit / torch = {ratio(t, 'zbkit', 'torch'):.2f}x"
        )
        print(
            f"    user CPU time only: zbkit / plain = {ratio(t, 'zbkit', 'plain', 2):.2f}x, "
            f"torch / plain = {ratio(t, 'torch', 'plain', 2):.2f}x | minor page faults per "
            f"backward: plain {faults(t, 'plain')}, zbkit {faults(t, 'zbkit')}, "
            f"torch {faults(t, 'torch')}"
        )
        for k in ABLATIONS if args.ablate else ():
            print(
                f"    ablation {k} / plain = {ratio(t, k, 'plain'):.2f}x "
                f"(user CPU only {ratio(t, k, 'plain', 2):.2f}x, {faults(t, k)} faults)"
            )


if __name__ == "__main__":
    main()
