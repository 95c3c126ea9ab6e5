"""`zbkit demo`: split backward on one block, then real pipelines against their simulations.

Part 1 splits a transformer block's backward into I and W and checks both against autograd.
Part 2 cuts a small transformer into pipeline stages on `--ranks` processes and runs each
schedule for real: step time, bubble rate measured and simulated (with the F, I, W times the
run itself measured), activations held, and the gradients against one plain process. It
prints a table and writes an HTML report with every run drawn over its simulation.
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
from zbkit.models import TinyTransformer, TransformerBlock, split_stages
from zbkit.pipeline import PipelineStage, ScheduleRunner
from zbkit.schedules import SCHEDULES, Costs, Schedule, build_schedule
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
    parser.add_argument("--rounds", type=int, default=5, help="timed steps per schedule (5)")
    parser.add_argument("--split-only", action="store_true", help="only part 1 (no processes)")
    parser.add_argument("--dim", type=int, default=64, help="model width (default 64)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    parser.add_argument("--tokens", type=int, default=32, help="sequence length (default 32)")
    parser.add_argument("--batch", type=int, default=2, help="rows per microbatch (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tol", type=float, default=1e-5, help="largest allowed gradient difference (1e-5)"
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


def lm_loss(outputs: dict[str, torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
    logits = outputs["logits"]  # (b, t, vocab); targets (b, t)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def make_schedule(name: str, pp: int, microbatches: int) -> Schedule:
    extra = {"costs": Costs()} if name == "zb-auto" else {}  # zb-auto plans with costs
    return build_schedule(name, pp=pp, microbatches=microbatches, **extra)


def run_schedule(cfg: Config, name: str) -> dict:
    """On every rank: warm up, then `cfg.rounds` timed steps; this rank's gradients."""
    torch.set_num_threads(1)  # the ranks share a few cores
    rank, world = dist.get_rank(), dist.get_world_size()
    on_gpu = cfg.backend == "nccl"  # launch gave rank k GPU k
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    schedule = make_schedule(name, world, cfg.microbatches)
    model = cfg.model().to(device)
    mods = split_stages(model, schedule.num_stages)
    mine = schedule.stages_on(rank)
    stages = [PipelineStage(mods[s], s, schedule.num_stages) for s in mine]
    runner = ScheduleRunner(schedule, stages, lm_loss, timeout=120)
    ids, targets = (t.to(device) for t in cfg.batch())
    first, last = 0 in mine, schedule.num_stages - 1 in mine
    times, traces = [], []
    for r in range(1 + cfg.rounds):  # round 0 warms up (first messages, allocator)
        model.zero_grad(set_to_none=True)
        dist.barrier()
        t0 = time.perf_counter()
        runner.step(ids if first else None, targets=targets if last else None)
        if on_gpu:
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
    return {"times": times[1:], "grads": grads, "traces": traces}


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


def pipeline_demo(args: argparse.Namespace, cfg: Config, schedules: dict[str, Schedule]) -> int:
    """Part 2: every schedule on real ranks, the table, the report; 0 when gradients agree."""
    from zbkit import viz
    from zbkit.launch import Cluster, LaunchError

    print(f"Part 2: a transformer of {cfg.layers} blocks (dim {cfg.dim}) on {args.ranks} "
          f"{args.backend} ranks, {cfg.microbatches} microbatches of {args.batch} x "
          f"{cfg.tokens} tokens, {cfg.rounds} measured steps per schedule")  # fmt: skip
    progress = _report.Progress(len(schedules) + 2)
    runs = {}
    try:
        with Cluster(args.ranks, backend=args.backend, timeout=600) as cluster:
            progress.step(f"started {args.ranks} ranks")
            for name in schedules:
                runs[name] = cluster.run(run_schedule, cfg, name)
                progress.step(f"ran {name}")
    except LaunchError as exc:
        print(f"\nzbkit demo: a rank failed:\n{exc}", file=sys.stderr)
        return 1
    expected, plain = oracle(cfg)  # once the ranks are gone: timed on idle cores
    results = [_report.summarise(n, s, runs[n], expected) for n, s in schedules.items()]

    # the graph of stage 1 in the finest split (one block when the schedules include zb-v)
    stage = split_stages(cfg.model(), max(s.num_stages for s in schedules.values()))[1]
    x = torch.randn(args.batch, cfg.tokens, cfg.dim, requires_grad=True)  # (b, t, dim)
    (out,) = stage(x).values()  # hidden (b, t, dim), or logits on a last stage
    first, last = stage.span
    analysis = analyze(out, x, stage)
    blocks = f"block {first}" if last == first + 1 else f"blocks {first}..{last - 1}"
    graph = viz.draw_graph(analysis, max_nodes=100, title=f"stage 1 ({blocks}), its groups")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    notes = [
        f"One plain single-process step of the whole batch, one thread: {plain * 1e3:.1f} ms.",
        "Each simulation uses the F/I/W medians and the hop latency measured in the same run.",
    ]
    if args.backend == "gloo" and (cores or 1) < args.ranks:
        notes.append(
            f"{args.ranks} ranks share {cores} CPU cores here: measured times include waiting "
            "for a core, while the simulation gives every rank its own."
        )
    path = _report.write_report(
        Path(args.out),
        title="zbkit demo: pipeline schedules run for real and simulated",
        intro=f"A transformer of {cfg.layers} blocks on {args.ranks} {args.backend} ranks, "
        f"{cfg.microbatches} microbatches. " + " ".join(notes),
        results=results,
        analysis_text=str(analysis),
        graph=graph,
    )
    progress.step("wrote the report")
    print()
    print(_report.format_table([r.row() for r in results]))
    print("\n" + "\n".join(notes))
    worst = max(r.grad_diff for r in results)
    ok = worst <= args.tol
    print(f"gradients vs one process: worst {worst:.2e} (tolerance {args.tol:g}): "
          f"{'OK' if ok else 'FAILED'}\nreport: {path}")  # fmt: skip
    return 0 if ok else 1
