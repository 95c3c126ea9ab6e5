"""`zbkit demo`: split backward on one block, then real pipelines against their simulations.

Part 1 splits a transformer block's backward into I and W and checks both against autograd.
Part 2 cuts a small transformer into pipeline stages on `--ranks` processes:

1. each block's F, I and W measured once, in one process: the one cost set every schedule's
   simulation uses (its stages' blocks summed);
2. every schedule run on the real transformer: gradients against one plain process, step
   time, activations held (counts and bytes);
3. the timed comparison: speed-up over 1f1b measured and simulated with those same costs.
   Where ranks outnumber cores (or `--timing synthetic`), real ~1 ms stages would measure the
   wait for a core, not the schedule, so the timed runs use `SyntheticStage`s that sleep the
   measured times (scaled up: a hop becomes small next to a stage, as on GPUs).

It prints the tables and writes an HTML report with every run drawn over its simulation.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from zbkit import _report
from zbkit.models import TinyTransformer, TransformerBlock, split_stages, stage_spans
from zbkit.pipeline import LocalPipeline, PipelineStage, ScheduleRunner, SyntheticStage
from zbkit.schedules import SCHEDULES, Costs, Schedule, build_schedule
from zbkit.schedules.measure import measured_costs
from zbkit.splitgrad import analyze, stage_backward_input, stage_backward_weight

DEFAULT_SCHEDULES = "1f1b,zb-h1,zb-h2,zb-v"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", type=int, default=4, help="pipeline ranks (default 4)")
    parser.add_argument(
        "--schedules", default=DEFAULT_SCHEDULES, help=f"comma list (default {DEFAULT_SCHEDULES})"
    )
    parser.add_argument("--microbatches", type=int, default=8, help="per step (default 8)")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    parser.add_argument("--out", default="zbkit-report", help="report folder (zbkit-report)")
    parser.add_argument("--layers", type=int, default=None, help="blocks (default 2 x ranks)")
    parser.add_argument("--rounds", type=int, default=3, help="timed steps per schedule (3)")
    parser.add_argument("--split-only", action="store_true", help="only part 1 (no processes)")
    parser.add_argument("--dim", type=int, default=64, help="model width (default 64)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    parser.add_argument("--tokens", type=int, default=32, help="sequence length (default 32)")
    parser.add_argument("--batch", type=int, default=2, help="rows per microbatch (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tol", type=float, default=1e-5, help="largest allowed gradient difference (1e-5)"
    )
    parser.add_argument(
        "--timing",
        choices=["auto", "synthetic", "real"],
        default="auto",
        help="what the speed-ups are measured on: synthetic stages that sleep the measured "
        "times, the real transformer, or auto: synthetic when ranks outnumber cores",
    )
    parser.add_argument(
        "--stage-ms",
        type=float,
        default=100.0,
        help="synthetic timing: the measured times scaled so that the slowest of --ranks "
        "stages takes this F + I + W per microbatch (default 100)",
    )


def main(args: argparse.Namespace) -> int:
    try:  # every option checked before anything runs
        if args.dim % args.heads:
            raise ValueError(f"--dim {args.dim} must be divisible by --heads {args.heads}")
        cfg, schedules = (None, {}) if args.split_only else _check(args)
    except ValueError as exc:
        print(f"zbkit demo: {exc}", file=sys.stderr)
        return 2
    ok = split_backward_demo(args)
    if not ok or cfg is None:
        return 0 if ok else 1
    print()
    return pipeline_demo(args, cfg, schedules)


# ---------------------------------------------------------------------- part 1
def split_backward_demo(args: argparse.Namespace) -> bool:
    """One block as a middle stage: its groups, then I and W against plain autograd."""
    torch.manual_seed(args.seed)
    block = TransformerBlock(args.dim, args.heads)
    reference = copy.deepcopy(block)
    # a middle pipeline stage: the input is an activation that requires grad
    x = torch.randn(args.batch, args.tokens, args.dim, requires_grad=True)
    grad_out = torch.randn(args.batch, args.tokens, args.dim)  # from the next stage

    out = block(x)
    analysis = analyze(out, x, block)
    print(f"Part 1: one transformer block's backward split into I and W\n{analysis}\n")

    params = [p for p in block.parameters() if p.requires_grad]
    result = stage_backward_input([out], [grad_out], [x], params)  # I: input gradient only
    untouched = all(p.grad is None for p in params)
    print(f"after I: input grad ready, parameter .grad still empty: {untouched}")
    stage_backward_weight(params, result.param_groups)  # W: the weight gradients
    print("after W: parameter .grad filled\n")

    x_ref = x.detach().requires_grad_()
    reference(x_ref).backward(grad_out)  # the oracle: plain autograd

    rows = [("input x", result.input_grads[0], x_ref.grad)]
    rows += [
        (name, p.grad, q.grad)
        for (name, p), q in zip(block.named_parameters(), reference.parameters(), strict=True)
    ]
    width = max(len(name) for name, _, _ in rows)
    worst = 0.0
    print(f"{'gradient':<{width}}  max |split - autograd|")
    for name, got, want in rows:
        if got is None or want is None:
            diff = 0.0 if got is None and want is None else float("inf")
        else:
            diff = (got - want).abs().max().item()
        worst = max(worst, diff)
        print(f"{name:<{width}}  {diff:.3e}")
    ok = untouched and worst <= args.tol
    print(f"\nworst difference {worst:.3e} (tolerance {args.tol:g}): {'OK' if ok else 'FAILED'}")
    return ok


# ---------------------------------------------------------------------- part 2: the ranks
@dataclass(frozen=True)
class Config:
    """Everything a rank needs to rebuild the same model and data (travels by pickle)."""

    layers: int
    dim: int
    heads: int
    tokens: int
    rows: int  # whole batch: microbatches x rows per microbatch
    microbatches: int
    rounds: int
    seed: int
    backend: str
    vocab: int = 64

    def model(self) -> TinyTransformer:
        torch.manual_seed(self.seed)  # every process builds identical weights
        return TinyTransformer(self.vocab, self.dim, self.heads, self.layers, self.tokens)

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed + 1)
        ids = torch.randint(0, self.vocab, (self.rows, self.tokens), generator=g)  # (b, t)
        return ids, ids.roll(-1, dims=1)  # next-token targets

    def synthetic_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets shaped like the real hidden states (b, t, dim): the synthetic
        stages send messages as large as the real model's."""
        g = torch.Generator().manual_seed(self.seed + 2)
        x = torch.randn(self.rows, self.tokens, self.dim, generator=g)  # (b, t, dim)
        return x, torch.randn(x.shape, generator=g)


def lm_loss(outputs: dict[str, torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
    logits = outputs["logits"]  # (b, t, vocab); targets (b, t)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def mse(outputs: dict[str, torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
    return (outputs["x"] - targets).pow(2).mean()  # the synthetic stages' loss


def make_schedule(name: str, pp: int, microbatches: int) -> Schedule:
    extra = {"costs": Costs()} if name == "zb-auto" else {}  # zb-auto plans with costs
    return build_schedule(name, pp=pp, microbatches=microbatches, **extra)


def _device(cfg: Config) -> torch.device:
    if cfg.backend == "nccl":  # launch gave rank k GPU k
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def measure_blocks(cfg: Config) -> list[Costs] | None:
    """On rank 0 only, the other ranks idle: each block's F, I and W, every block a stage of
    its own in one process (``LocalPipeline``), medians over ``cfg.rounds`` steps. The one cost
    set of the comparison: a schedule's stage costs the sum of its blocks."""
    if dist.get_rank() != 0:
        return None
    torch.set_num_threads(1)  # as each rank computes
    model = cfg.model().to(_device(cfg))
    # zb-h1 runs every F, I and W as an action of its own (no fused B)
    schedule = build_schedule("zb-h1", pp=cfg.layers, microbatches=cfg.microbatches)
    pipe = LocalPipeline(split_stages(model, cfg.layers), schedule, lm_loss)
    ids, targets = (t.to(_device(cfg)) for t in cfg.batch())
    events = []
    for r in range(1 + cfg.rounds):  # round 0 warms up
        model.zero_grad(set_to_none=True)
        pipe.step(ids, targets=targets)
        if r:
            events += pipe.trace.events
    return measured_costs(events, cfg.layers)


def run_schedule(cfg: Config, name: str, synthetic: list[Costs] | None = None) -> dict:
    """On every rank: warm up, then `cfg.rounds` timed steps of the real transformer, or of
    `SyntheticStage`s sleeping the times in ``synthetic`` (one Costs per stage, seconds)."""
    torch.set_num_threads(1)  # the ranks share a few cores
    rank, world = dist.get_rank(), dist.get_world_size()
    device = _device(cfg)
    schedule = make_schedule(name, world, cfg.microbatches)
    if synthetic is None:
        mods = split_stages(cfg.model().to(device), schedule.num_stages)
        loss_fn, batch = lm_loss, cfg.batch()
    else:  # sleep: no CPU work while "computing", so ranks sharing cores keep to the times
        mods = [SyntheticStage.from_costs(c, width=cfg.dim, mode="sleep") for c in synthetic]
        mods = [m.to(device) for m in mods]
        loss_fn, batch = mse, cfg.synthetic_batch()
    mine = schedule.stages_on(rank)
    # split_first_stage: stage 0's I and W take their own times, as the simulation assumes
    stages = [
        PipelineStage(mods[s], s, schedule.num_stages, split_first_stage=synthetic is not None)
        for s in mine
    ]
    runner = ScheduleRunner(schedule, stages, loss_fn, timeout=120)
    inputs, targets = (t.to(device) for t in batch)
    first, last = 0 in mine, schedule.num_stages - 1 in mine
    times, traces = [], []
    for r in range(1 + cfg.rounds):  # round 0 warms up (first messages, allocator)
        for st in stages:
            st.module.zero_grad(set_to_none=True)
        dist.barrier()  # every rank starts the step together: its time is the step's
        t0 = time.perf_counter()
        runner.step(inputs if first else None, targets=targets if last else None)
        if device.type == "cuda":
            torch.cuda.synchronize()  # kernels run asynchronously: wait before reading the clock
        times.append(time.perf_counter() - t0)
        trace = runner.gather_trace()  # collective: every rank's events, one clock
        if r and rank == 0:
            traces.append(trace)
    grads = {  # a stage's parameter names are the whole model's (see TransformerStage)
        n: None if p.grad is None else p.grad.cpu()
        for st in stages
        for n, p in st.module.named_parameters()
    }
    return {"times": times[1:], "grads": grads if synthetic is None else {}, "traces": traces}


def oracle(cfg: Config) -> tuple[dict[str, torch.Tensor], float]:
    """Plain single-process training on the whole batch: the gradients, and the step's time
    on one thread (as each rank has)."""
    model = cfg.model()
    ids, targets = cfg.batch()
    spent, threads = [], torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            lm_loss({"logits": model(ids)}, targets).backward()
            spent.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)  # the caller's setting back
    return {n: p.grad for n, p in model.named_parameters()}, statistics.median(spent)


# ---------------------------------------------------------------------- part 2: the driver
def _check(args: argparse.Namespace) -> tuple[Config, dict[str, Schedule]]:
    """Every option checked before a process starts; schedules built once here to fail fast."""
    if args.ranks < 2:
        raise ValueError(f"--ranks {args.ranks}: a pipeline needs at least 2 ranks")
    if args.microbatches < 1 or args.rounds < 1 or args.batch < 1:
        raise ValueError("--microbatches, --rounds and --batch must be >= 1")
    if not args.stage_ms > 0:
        raise ValueError(f"--stage-ms {args.stage_ms}: must be > 0")
    names = [n.strip() for n in args.schedules.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCHEDULES]
    if not names or unknown:
        raise ValueError(
            f"--schedules {args.schedules!r}: unknown {unknown}; pick from {SCHEDULES}"
        )
    if args.backend == "nccl" and torch.cuda.device_count() < args.ranks:
        raise ValueError(
            f"--backend nccl needs one GPU per rank: {args.ranks} ranks, "
            f"{torch.cuda.device_count()} GPUs here; use --backend gloo or fewer --ranks"
        )
    schedules = {n: make_schedule(n, args.ranks, args.microbatches) for n in names}
    layers = args.layers or 2 * args.ranks
    most = max(s.num_stages for s in schedules.values())
    if layers < most:
        raise ValueError(f"--layers {layers}: the schedules need {most} stages of >= 1 block each")
    rows = args.batch * args.microbatches
    cfg = Config(layers, args.dim, args.heads, args.tokens, rows, args.microbatches,
                 args.rounds, args.seed, args.backend)  # fmt: skip
    return cfg, schedules


def cores() -> int:
    """CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def use_synthetic(timing: str, ranks: int, backend: str) -> bool:
    """``--timing auto``: synthetic stages when gloo ranks outnumber the cores (each would
    then time its wait for a core, not the schedule)."""
    if timing != "auto":
        return timing == "synthetic"
    return backend == "gloo" and cores() < ranks


def _work(costs: Costs) -> float:
    return costs.F + costs.I + costs.W


def pipeline_demo(args: argparse.Namespace, cfg: Config, schedules: dict[str, Schedule]) -> int:
    """Part 2: one cost set, every schedule on real ranks, the timed comparison, the report;
    0 when gradients agree."""
    from zbkit import viz
    from zbkit.launch import Cluster, LaunchError

    synthetic = use_synthetic(args.timing, args.ranks, args.backend)
    baseline = "1f1b" if "1f1b" in schedules else next(iter(schedules))
    spans = {n: stage_spans(cfg.layers, s.num_stages) for n, s in schedules.items()}
    print(f"Part 2: a transformer of {cfg.layers} blocks (dim {cfg.dim}) on {args.ranks} "
          f"{args.backend} ranks, {cfg.microbatches} microbatches of {args.batch} x "
          f"{cfg.tokens} tokens, {cfg.rounds} measured steps per schedule")  # fmt: skip
    progress = _report.Progress(2 + len(schedules) * (1 + synthetic) + 1)
    real_runs, timed_runs, scale = {}, {}, 1.0
    try:
        with Cluster(args.ranks, backend=args.backend, timeout=600) as cluster:
            progress.step(f"started {args.ranks} ranks")
            blocks: list[Costs] = cluster.run(measure_blocks, cfg)[0]
            progress.step(f"measured the {cfg.layers} blocks in one process")
            for name in schedules:
                real_runs[name] = cluster.run(run_schedule, cfg, name)
                progress.step(f"ran {name} on the real transformer")
            if synthetic:  # the slowest of `ranks` stages takes --stage-ms per microbatch
                widest = max(
                    map(_work, _report.stage_costs(blocks, stage_spans(cfg.layers, args.ranks)))
                )
                scale = args.stage_ms / 1e3 / widest
                for name in schedules:
                    costs = _report.stage_costs(blocks, spans[name], scale)
                    timed_runs[name] = cluster.run(run_schedule, cfg, name, costs)
                    progress.step(f"timed {name} on synthetic stages")
    except LaunchError as exc:
        print(f"\nzbkit demo: a rank failed:\n{exc}", file=sys.stderr)
        return 1
    expected, plain = oracle(cfg)  # once the ranks are gone: timed on idle cores
    real_costs = {n: _report.stage_costs(blocks, spans[n]) for n in schedules}
    real, real_hop = _report.compare(schedules, real_runs, real_costs, expected)
    timed, hop = real, real_hop
    if synthetic:
        scaled = {n: _report.stage_costs(blocks, spans[n], scale) for n in schedules}
        timed, hop = _report.compare(schedules, timed_runs, scaled)
    pp_costs = _report.stage_costs(blocks, stage_spans(cfg.layers, args.ranks))
    stage_ms = statistics.median(map(_work, pp_costs)) * 1e3  # one of `ranks` stages, unscaled

    where = f"{args.ranks} ranks share {cores()} CPU cores"
    lines = [
        f"One cost set for every schedule: each block's F, I, W measured once, in one process "
        f"(a stage of {args.ranks}: F + I + W = {stage_ms:.2f} ms per microbatch); each "
        "simulation sums its stages' blocks and adds the hop latency measured between ranks.",
    ]
    if synthetic:
        lines.append(
            f"Timing on synthetic stages: {where}, so real ~{stage_ms / 3:.0f} ms actions would "
            f"time the wait for a core, not the schedule. The timed runs use SyntheticStages that "
            f"sleep (no CPU work) the measured times x{scale:.0f}, a stage's F + I + W "
            f"{args.stage_ms:g} ms, so that a hop is small beside it, as on GPUs."
        )
    elif args.backend == "gloo" and cores() < args.ranks:
        lines.append(
            f"Timing on the real transformer, as asked: {where}, so measured times include "
            "waiting for a core, while the simulation gives every rank its own."
        )
    hop_work = hop * 1e3 / (args.stage_ms if synthetic else stage_ms)
    over = [r.step / r.sim.makespan for r in real]
    reading = (
        f"Real timings differ from the synthetic ones: the real steps took {min(over):.1f}-"
        f"{max(over):.1f}x their simulation while their actions took "
        f"{_report.slowdown(real, real_costs):.1f}x their one-process time: the time goes "
        f"between ~{stage_ms / 3:.1f} ms actions, to per-action overhead and hops of "
        f"{real_hop * 1e3:.2f} ms, which dominate such small stages on CPU"
        + (f" ({where})" if args.backend == "gloo" and cores() < args.ranks else "")
        + "."
    )

    # the graph of stage 1 in the finest split, one box per layer (blocks.1.attn.qkv)
    stage = split_stages(cfg.model(), max(s.num_stages for s in schedules.values()))[1]
    x = torch.randn(args.batch, cfg.tokens, cfg.dim, requires_grad=True)  # (b, t, dim)
    (out,) = stage(x).values()  # hidden (b, t, dim), or logits on a last stage
    first, last = stage.span
    analysis = analyze(out, x, stage)
    blocks_text = f"block {first}" if last == first + 1 else f"blocks {first}..{last - 1}"
    graph = viz.draw_graph(analysis, depth=4, title=f"stage 1 ({blocks_text}), one box per layer")
    path = _report.write_report(
        Path(args.out),
        title="zbkit demo: pipeline schedules run for real and simulated",
        intro=[*lines, reading],
        real=real,
        timed=timed if synthetic else None,
        baseline=baseline,
        analysis_text=str(analysis),
        graph=graph,
    )
    progress.step("wrote the report")

    print("\n" + "\n".join(lines))
    what = "synthetic stages" if synthetic else "the real transformer"
    print(f"\nSpeed-up over {baseline}, measured on {what} and simulated with the same costs "
          f"(hop {hop * 1e3:.2f} ms, {hop_work:.1%} of a stage's F + I + W):")  # fmt: skip
    print(_report.format_table(_report.SPEEDUP_HEADER, _report.speedup_rows(timed, baseline)))
    print("\nThe real transformer on the same ranks, gradients against one process:")
    print(_report.format_table(_report.REAL_HEADER, _report.real_rows(real)))
    print(f"{reading}\nOne plain single-process step of the whole batch, one thread: "
          f"{plain * 1e3:.1f} ms.")  # fmt: skip
    worst = max(r.grad_diff for r in real)
    ok = worst <= args.tol
    print(f"gradients vs one process: worst {worst:.2e} (tolerance {args.tol:g}): "
          f"{'OK' if ok else 'FAILED'}\nreport: {path}")  # fmt: skip
    return 0 if ok else 1
