"""Time and memory of split backward (I + W) against plain backward and torch's own split.

    python benchmarks/splitgrad_overhead.py --cpu-time --reps 30   # the table of issue 12
    python benchmarks/splitgrad_overhead.py --only mlp --ablate
    python benchmarks/splitgrad_overhead.py --device cuda           # on a GPU

Models (`--only`): compute-bound `mlp` (8 Linear 512->512, tanh, batch 256),
`transformer` (4 pre-norm blocks d=256, 8 heads, 8x128 tokens), `conv` (4 conv
3x3 + BatchNorm + ReLU, 32 channels, 16x32x32), `residual` (6 residual MLP blocks
d=256, 16x64 tokens) and overhead-bound `small` (48 residual MLP blocks d=64,
4x8 tokens). Every stage input requires grad (a middle pipeline stage).

Time: each repetition runs a fresh forward, then one backward per variant, in
a rotating order (paired runs); printed ratios are medians of per-repetition
ratios. One thread. `--cpu-time` times with process CPU time, which other jobs
on a shared machine disturb much less; a second line gives user CPU time alone
and median minor page faults per backward. Baselines, side by side in this
process: plain `torch.autograd.backward`, and torch.distributed.pipelining's
`stage_backward_input` + `stage_backward_weight`.

Every variant runs each repetition on the same input and random state; the
first repetition's gradients are compared with plain backward's (printed as the
largest difference over the largest gradient: 0 means identical).

`--device cuda`: the same on a GPU, timed as wall time with the device
synchronized before and after each backward, memory from the caching
allocator's counters (benchmarks/gpu_check.sh runs it).

Memory (not timed, one run per variant under torch.profiler's allocator
events): bytes allocated since just before the forward. `held` is what lives
between I and W (the caller drops the outputs and inputs after I, as
zbkit.pipeline's stage does); `W peak` the most alive at once during W; for
plain backward the peak during B.

`--ablate` also times zbkit on the reference path alone (what a torch that
fails `fast_paths_available()` gets), with W forced through one engine call per
parameter group, and with LayerNorm/BatchNorm weight halves left to W.
`--keep-heap` (diagnostic) tells glibc never to give freed memory back to the
kernel (process-wide), which removes first-touch page faults.

What earlier ideas bought (2-core shared machine, +-10% noise):

- Batched W (_fast.run_batched): every engine call first walks the whole graph
  below its roots, so one call per group costs O(groups x nodes); W calls each
  group's intermediate itself inside one tiny engine call instead. `small`:
  3.9x -> 1.4-1.8x plain; no change on compute-bound models.
- Weight nodes read off the graph's AccumulateGrad nodes instead of one
  throwaway view per parameter: ~1.4 ms per microbatch on `small`.
- LayerNorm weight halves in I (_fast.EAGER_NODES): one fused kernel call, as
  plain backward makes it; W no longer keeps the node's incoming gradient.
- A Linear's bias gradient reduced right after its node runs in W, so the
  captured (N x 4d) gradient it aliases is freed then, not after the last group.
- Caching the analysis per graph structure (_plan): see the last entry.
- Where the compute-bound models' extra time went: not the ops (each matmul
  runs once, as in plain), but first-touch page faults of the gradients held
  from I to W while plain backward reuses memory as it goes (`--keep-heap`
  makes them vanish).
- BatchNorm weight halves in I (issue 12): `conv` 1.13x -> 1.06x plain (torch 1.14x).
- Freeing saved tensors (issue 12, _fast.release_saved): I drops what only it
  needs when it returns, W each replayed node's as its group is done. Held
  I->W and W peak, MiB, before -> after (torch): mlp W peak 12.0 -> 9.0 (12.5),
  transformer 100 -> 65 (109), conv 36 -> 20 (38), residual 90 -> 61 (97),
  small 9.9 -> 6.2 (7.6): at or below plain backward's own peak on every model.
  Its price is Python work per saved tensor (~2.5 us: one hook registration),
  ~1.4 ms per microbatch on `small` (~600 saved tensors): 1.7x -> 1.9x plain.
- Where `small`'s time goes (plain B ~8.3 ms, CPU time): I's engine pass alone
  ~4.7 ms (input halves, what torch's split pays too), the analysis ~2.4 ms
  (reverse graph 0.6, groups 1.8), W's 96 weight-half matmuls ~4.1 ms against
  ~2.9 ms for the same shapes inside plain backward (their inputs are cache-cold
  by W: same flops, 44 us vs 31 us each), the engine delivery ~1.5 ms, the
  freeing ~1.4 ms.
- The analysis cached per graph structure (_plan), parameter slots left alone
  when freeing (_free), a leaner replay loop. One walk gives the exact key
  (~0.6 ms on a fresh `small` graph, most of it Python objects for the graph's
  nodes, which any walk pays); binding the plan to the new graph ~0.3 ms,
  against ~2.2 ms for the analysis it replaces. `small` I+W / plain, three
  interleaved runs each of the previous commit and this one (each importing its
  own checkout): 1.68 / 1.89 / 1.85x -> 1.75 / 1.73 / 1.74x; zbkit / torch
  0.49-0.51x -> 0.46x (the steadier figure: both share the machine's load).
  Paired in one process against the previous commit: I+W 0.93-0.96x. The
  compute-bound models did not move (their overhead is not Python). Not reached:
  `small` <= 1.5x. What is left (plain ~8.5 ms): I's engine pass ~5 ms, W's
  weight halves ~2.4-4 ms (cold inputs), the delivery into `.grad` ~1-1.6 ms
  (288 edges through one engine call, ~3.5 us each; assigning `.grad` directly
  is 30x cheaper but would skip hooks registered on AccumulateGrad nodes, DDP's
  among them, which Python cannot list, so it is not exact and not taken),
  freeing ~1.2 ms (a stated target: what only I needs goes when I ends, each
  group's saved tensors during W; ~2 us per slot, most of it the free itself),
  walk and binding ~0.9 ms, prehooks and per-group objects ~0.7 ms.
- Big tensors only I needs freed as soon as their node ran in I (issue 12,
  _free.EARLY_BYTES: a GELU's input, attention probabilities, a LayerNorm's
  input), not when I ends: the gradients I keeps for W reuse that memory.
  Page faults per backward: transformer ~11,000 -> ~6,000, residual ~8,900 ->
  ~6,100; I+W / plain: transformer 1.11 -> 1.07x, residual 1.08 -> 1.07x; mlp
  (its tanh output is also the next Linear's input: nothing to free) and
  small (nothing that big) unchanged. What faults are left come from I's peak:
  it holds W's inputs and the captured gradients while plain backward has
  already freed them, so it reaches above the forward's high-water mark.
- What to free at each node learned once per node position of a structure
  (_plan.BoundPlan.slot_names), later graphs freeing by attribute name without
  reading each tensor back: on `small`, freeing per microbatch ~1.4 -> ~1.0 ms
  (component timing); I+W / plain within this machine's noise (1.69-1.79x).
- Peaks against page faults (torch.profiler memory events, one microbatch):
  transformer forward 66 MiB, I 73 (plain B 69); residual forward 62, I 54
  (plain B 65), yet residual's I still takes ~7,000 faults to plain's ~3,000:
  where glibc places and trims the heap decides it, not how much is live.
- Compute-bound models: user CPU time alone is 1.00-1.06x plain; the rest of
  process time is first-touch page faults (thousands per backward on
  transformer and residual, ~0 for plain) from gradients held between I and W
  while glibc hands freed memory back to the kernel; torch's split pays the
  same. `--keep-heap` removes them; a library should not change malloc for
  the whole process, so zbkit does not.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.pipelining import _backward as torch_split
from torch.profiler import ProfilerActivity, profile, record_function

from zbkit.models import MLP, ResidualMLPBlock, TransformerBlock
from zbkit.splitgrad import _fast as split_fast
from zbkit.splitgrad import reference_weight_pass, stage_backward_input, stage_backward_weight

# wall time by default; --cpu-time uses this process's CPU time, which other
# jobs on a shared machine disturb much less (we run on one thread)
CLOCK = time.perf_counter
DEVICE = torch.device("cpu")  # --device


def _conv_net(channels: int = 32, layers: int = 4) -> nn.Module:
    blocks = [
        (nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU())
        for _ in range(layers)
    ]
    return nn.Sequential(*(m for block in blocks for m in block))


def _blocks(n: int, make: Callable[[], nn.Module]) -> nn.Module:
    return nn.Sequential(*(make() for _ in range(n)))


CONFIGS: dict[str, tuple[str, Callable[[], nn.Module], tuple[int, ...]]] = {
    "mlp": ("compute-bound, MLP 8 x 512", lambda: MLP((512,) * 9), (256, 512)),
    "transformer": (
        "compute-bound, 4 transformer blocks d=256",
        lambda: _blocks(4, lambda: TransformerBlock(256, heads=8)),
        (8, 128, 256),
    ),
    "conv": ("compute-bound, conv net 4 x (conv3x3 32ch + BN)", _conv_net, (16, 32, 32, 32)),
    "residual": (
        "compute-bound, 6 residual blocks d=256",
        lambda: _blocks(6, lambda: ResidualMLPBlock(256)),
        (16, 64, 256),
    ),
    "small": (
        "overhead-bound, 48 residual blocks d=64",
        lambda: _blocks(48, lambda: ResidualMLPBlock(64)),
        (4, 8, 64),
    ),
}


# ------------------------------------------------------------------ the variants
# Each is (I, W): I(outputs, grads, inputs, params) -> what W needs; W(params, it).
# Plain backward is all I, no W.
def _plain_i(out, g, x, params):
    torch.autograd.backward([out], [g])


def _zbkit_i(out, g, x, params):
    return stage_backward_input([out], [g], [x], params).pending_weight


def _torch_i(out, g, x, params):
    return torch_split.stage_backward_input([out], [g], [x], params)[1]


def _reference_i(out, g, x, params):
    with reference_weight_pass():  # no fast path at all: what a torch failing the probe gets
        return _zbkit_i(out, g, x, params)


def _reference_w(params, pending):
    with reference_weight_pass():
        stage_backward_weight(params, pending)


def _engine_w(params, pending):
    # every group through its own engine call (no batched W)
    batchable, split_fast.batchable = split_fast.batchable, lambda work: bool(work.ready)
    try:
        stage_backward_weight(params, pending)
    finally:
        split_fast.batchable = batchable


def _no_eager_i(out, g, x, params):
    # normalisation weight halves split off to W like every other node
    eager, split_fast.eager_edges = split_fast.eager_edges, lambda *a: []
    try:
        return _zbkit_i(out, g, x, params)
    finally:
        split_fast.eager_edges = eager


VARIANTS = {
    "plain": (_plain_i, None),
    "zbkit": (_zbkit_i, stage_backward_weight),
    "torch": (_torch_i, torch_split.stage_backward_weight),
}
ABLATIONS = {
    "zbkit-reference": (_reference_i, _reference_w),
    "zbkit-engine-W": (_zbkit_i, _engine_w),
    "zbkit-no-eager-norm": (_no_eager_i, stage_backward_weight),
}


def _setup(key: str) -> tuple[nn.Module, list[nn.Parameter], torch.Tensor, tuple[int, ...]]:
    _, make, shape = CONFIGS[key]
    torch.manual_seed(0)
    model = make().to(DEVICE)
    params = [p for p in model.parameters() if p.requires_grad]
    return model, params, torch.randn(shape, device=DEVICE), shape


def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def _timed(run) -> tuple[float, int, float]:
    """(CLOCK seconds, minor page faults, user CPU seconds) of `run()`; on a GPU the clock
    reads after the device finished (synchronized before and after)."""
    _sync()
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), CLOCK()
    run()
    _sync()
    t1, r1 = CLOCK(), resource.getrusage(resource.RUSAGE_SELF)
    return t1 - t0, r1.ru_minflt - r0.ru_minflt, r1.ru_utime - r0.ru_utime


def measure(
    key: str, reps: int, variants: dict
) -> tuple[dict[str, list[tuple[float, int, float]]], dict[str, float]]:
    """Per variant, per repetition: (time of I + W, minor page faults, user CPU time); and
    per variant, its largest gradient difference from plain backward's, relative to the
    largest plain gradient (every variant runs each repetition on the same input and
    random state, so they must agree)."""
    model, params, g, shape = _setup(key)
    times: dict[str, list[tuple[float, int, float]]] = {k: [] for k in variants}
    grads: dict[str, list[torch.Tensor]] = {}
    names = list(variants)
    for rep in range(reps + 3):  # 3 warm-up repetitions, dropped
        r = rep % len(names)
        for k in names[r:] + names[:r]:  # rotate who goes first
            run_i, run_w = variants[k]
            torch.manual_seed(rep)  # the same input and dropout masks for every variant
            x = torch.randn(shape, device=DEVICE, requires_grad=True)
            model.zero_grad(set_to_none=True)
            out = model(x)

            def run(run_i=run_i, run_w=run_w, out=out, x=x):
                pending = run_i(out, g, x, params)
                if run_w is not None:
                    run_w(params, pending)

            sample = _timed(run)
            del run, out  # the graph dies before the next variant's forward
            if rep >= 3:
                times[k].append(sample)
            if rep == 0:
                grads[k] = [
                    torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params
                ]
    scale = max(float(w.abs().max()) for w in grads["plain"]) or 1.0
    diff = {
        k: max(float((a - b).abs().max()) for a, b in zip(grads[k], grads["plain"], strict=True))
        / scale
        for k in grads
    }
    return times, diff


@contextlib.contextmanager
def _quiet_stderr():
    """torch 2.13's profiler writes two lines (USDT ... profiler_start/stop) to the C-level
    stderr per run; they would bury the table. Python-level errors still show (raised
    after the descriptor is back)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def memory(key: str, variant: tuple) -> tuple[float, float]:
    """(MiB held between I and W, MiB peak during W), counted from just before the forward."""
    if DEVICE.type == "cuda":
        return _memory_cuda(key, variant)
    with _quiet_stderr():
        return _memory(key, variant)


def _memory_cuda(key: str, variant: tuple) -> tuple[float, float]:
    """`memory` from the CUDA caching allocator's own counters."""
    model, params, g, shape = _setup(key)
    run_i, run_w = variant
    _sync()
    base = torch.cuda.memory_allocated(DEVICE)
    x = torch.randn(shape, device=DEVICE, requires_grad=True)
    out = model(x)
    if run_w is None:
        torch.cuda.reset_peak_memory_stats(DEVICE)
    pending = run_i(out, g, x, params)
    del out, x  # as a pipeline stage does: only what W needs stays
    held = torch.cuda.memory_allocated(DEVICE) - base
    if run_w is not None:
        torch.cuda.reset_peak_memory_stats(DEVICE)
        run_w(params, pending)
    peak = torch.cuda.max_memory_allocated(DEVICE) - base
    return held / 2**20, max(peak, held) / 2**20


def _memory(key: str, variant: tuple) -> tuple[float, float]:
    model, params, g, shape = _setup(key)
    run_i, run_w = variant
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        x = torch.randn(shape, requires_grad=True)
        out = model(x)
        with record_function("zb:I"):
            pending = run_i(out, g, x, params)
        del out, x  # as a pipeline stage does: only what W needs stays
        with record_function("zb:W"):
            if run_w is not None:
                run_w(params, pending)
    events = sorted(prof.profiler.kineto_results.events(), key=lambda e: e.start_ns())
    span = {e.name(): (e.start_ns(), e.end_ns()) for e in events if e.name().startswith("zb:")}
    window = span["zb:W"] if run_w is not None else span["zb:I"]
    live = held = peak = 0
    for e in events:
        if e.name() != "[memory]":
            continue
        live += e.nbytes()
        if e.start_ns() <= span["zb:I"][1]:
            held = live
        if window[0] <= e.start_ns() <= window[1]:
            peak = max(peak, live)
    return held / 2**20, max(peak, held) / 2**20


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
    parser.add_argument("--only", choices=list(CONFIGS), action="append")
    parser.add_argument(
        "--cpu-time", action="store_true", help="time with process CPU time instead of wall time"
    )
    parser.add_argument(
        "--ablate",
        action="store_true",
        help="also time the reference path, one engine call per group in W, no norm halves in I",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the memory runs")
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu (default) or cuda[:N]: on a GPU the times are wall time with the device "
        "synchronized before and after, memory the caching allocator's counters",
    )
    parser.add_argument(
        "--keep-heap",
        action="store_true",
        help="diagnostic: glibc keeps freed memory (no page faults on reuse), see docstring",
    )
    args = parser.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: this torch sees no CUDA device")
    if DEVICE.type == "cuda" and (args.cpu_time or args.keep_heap):
        parser.error("--cpu-time and --keep-heap are about the CPU; on a GPU leave them out")
    torch.set_num_threads(1)
    if args.keep_heap:
        _keep_freed_heap()
    global CLOCK
    CLOCK = time.process_time if args.cpu_time else time.perf_counter
    clock = "process CPU time" if args.cpu_time else "wall time"
    print(f"clock: {clock}, {args.reps} reps, device {DEVICE}")
    for key in args.only or CONFIGS:
        variants = VARIANTS | (ABLATIONS if args.ablate else {})
        t, diff = measure(key, args.reps, variants)
        plain_ms = statistics.median(x[0] for x in t["plain"]) * 1e3
        print(
            f"({key}) {CONFIGS[key][0]}: plain {plain_ms:.2f} ms | "
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
        print(
            "    gradients vs plain backward (largest difference / largest gradient): "
            + ", ".join(f"{k} {d:.1e}" for k, d in diff.items() if k != "plain")
        )
        if not args.no_memory:
            mem = {k: memory(key, VARIANTS[k]) for k in VARIANTS}
            print(
                f"    memory MiB: plain B peak {mem['plain'][1]:.1f} | held I->W: zbkit "
                f"{mem['zbkit'][0]:.1f}, torch {mem['torch'][0]:.1f} | W peak: zbkit "
                f"{mem['zbkit'][1]:.1f}, torch {mem['torch'][1]:.1f} "
                f"(zbkit / torch = {mem['zbkit'][1] / mem['torch'][1]:.2f}x)"
            )
        for k in ABLATIONS if args.ablate else ():
            print(
                f"    ablation {k} / plain = {ratio(t, k, 'plain'):.2f}x "
                f"(user CPU only {ratio(t, k, 'plain', 2):.2f}x, {faults(t, k)} faults)"
            )


if __name__ == "__main__":
    main()
