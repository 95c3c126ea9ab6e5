"""Part 2 of `zbkit demo`: real pipelines against their simulations, and the report.

``pipeline_demo`` starts the ranks (a ``Cluster``) and sends them the functions of
``_runs``: each block's F, I and W measured once (the one cost set), every schedule on the
real transformer, and, with synthetic timing, every schedule again on stages that sleep the
measured times. Then it sets each run beside its simulation (``_report``), prints the tables
and writes the HTML report (``_html``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from zbkit import viz
from zbkit.demo import _report
from zbkit.demo._html import write_report
from zbkit.demo._runs import Config, measure_blocks, oracle, run_schedule
from zbkit.launch import Cluster, LaunchError
from zbkit.launch.machine import MachineLoad, machine_load
from zbkit.models import split_stages, stage_spans
from zbkit.schedules import Costs, Schedule
from zbkit.splitgrad import analyze


def _work(costs: Costs) -> float:
    return costs.F + costs.I + costs.W


def why_synthetic(machine: MachineLoad, stage_ms: float) -> str:
    """Why the timed runs sleep instead of computing: more ranks than cores (real actions
    of a third of ``stage_ms`` would time the wait for a core), or the option asked for it."""
    if not machine.crowded:
        return "as asked (--timing synthetic)"
    return (
        f"{machine.ranks} ranks share {machine.cores} CPU cores, so real ~{stage_ms / 3:.0f} ms "
        "actions would time the wait for a core, not the schedule"
    )


@dataclass
class _Ran:
    """What the ranks measured: the block costs, each schedule's runs, the machine's load."""

    blocks: list[Costs]  # each block's F, I, W, measured once in one process
    real_runs: dict[str, list[dict]]  # name -> run_schedule's result per rank, real stages
    timed_runs: dict[str, list[dict]]  # the same on synthetic stages (empty unless synthetic)
    scale: float  # synthetic stages sleep the measured times x scale
    machine: MachineLoad


@dataclass
class _Compared:
    """Each run beside its simulation (``_report.compare``) and the numbers the text cites."""

    real: list[_report.Run]
    real_hop: float  # seconds per hop, measured on the real runs
    timed: list[_report.Run]  # the synthetic runs, or the real ones
    hop: float
    real_costs: dict[str, list[Costs]]
    stage_ms: float  # one of `ranks` stages' F + I + W, unscaled


def pipeline_demo(
    args: argparse.Namespace,
    cfg: Config,
    schedules: dict[str, Schedule],
    *,
    synthetic: bool,
    cores: int,
) -> int:
    """Part 2: one cost set, every schedule on real ranks, the timed comparison, the report;
    0 when gradients agree.

    ``synthetic``: time the comparison on ``SyntheticStage``s (``--timing``, see
    ``use_synthetic``); ``cores``: the CPU cores the ranks share, named in the text.
    """
    from zbkit.viz import plot_schedule  # noqa: F401  the report's plots need matplotlib: fail now

    baseline = "1f1b" if "1f1b" in schedules else next(iter(schedules))
    print(f"Part 2: a transformer of {cfg.layers} blocks (dim {cfg.dim}) on {args.ranks} "
          f"{args.backend} ranks, {cfg.microbatches} microbatches of {args.batch} x "
          f"{cfg.tokens} tokens, {cfg.rounds} measured steps per schedule")  # fmt: skip
    progress = _report.Progress(2 + len(schedules) * (1 + synthetic) + 1)
    ran = _run_on_ranks(args, cfg, schedules, synthetic, cores, progress)
    if ran is None:
        return 1
    expected, plain = oracle(cfg)  # once the ranks are gone: timed on idle cores
    got = _compare(args, cfg, schedules, ran, expected, synthetic)
    lines, reading, timed_note, real_note = _texts(args, ran, got, synthetic, cores)
    analysis, graph = _stage_graph(args, cfg, schedules)
    path = write_report(
        Path(args.out),
        title="zbkit demo: pipeline schedules run for real and simulated",
        intro=[*lines, timed_note, reading] + ([real_note] if synthetic else []),
        real=got.real,
        timed=got.timed if synthetic else None,
        baseline=baseline,
        analysis_text=str(analysis),
        graph=graph,
    )
    progress.step("wrote the report")

    print("\n" + "\n".join(lines))
    what = "synthetic stages" if synthetic else "the real transformer"
    hop_work = got.hop * 1e3 / (args.stage_ms if synthetic else got.stage_ms)
    print(f"\nSpeed-up over {baseline}, measured on {what} and simulated with the same costs "
          f"(hop {got.hop * 1e3:.2f} ms, {hop_work:.1%} of a stage's F + I + W):")  # fmt: skip
    print(_report.format_table(_report.SPEEDUP_HEADER, _report.speedup_rows(got.timed, baseline)))
    print(timed_note)
    print("\nThe real transformer on the same ranks, gradients against one process:")
    print(_report.format_table(_report.REAL_HEADER, _report.real_rows(got.real)))
    if synthetic:
        print(real_note)
    print(f"{reading}\nOne plain single-process step of the whole batch, one thread: "
          f"{plain * 1e3:.1f} ms.")  # fmt: skip
    worst = max(r.grad_diff for r in got.real if r.grad_diff is not None)  # all set: real stages
    ok = worst <= args.tol
    print(f"gradients vs one process: worst {worst:.2e} (tolerance {args.tol:g}): "
          f"{'OK' if ok else 'FAILED'}\nreport: {path}")  # fmt: skip
    return 0 if ok else 1


def _run_on_ranks(
    args: argparse.Namespace,
    cfg: Config,
    schedules: dict[str, Schedule],
    synthetic: bool,
    cores: int,
    progress: _report.Progress,
) -> _Ran | None:
    """The ranks' part: the blocks measured, every schedule run (and timed on synthetic
    stages); None, said on stderr, when a rank failed."""
    real_runs: dict[str, list[dict]] = {}
    timed_runs: dict[str, list[dict]] = {}
    scale = 1.0
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
                for name, schedule in schedules.items():
                    spans = stage_spans(cfg.layers, schedule.num_stages)
                    costs = _report.stage_costs(blocks, spans, scale, args.ranks)
                    timed_runs[name] = cluster.run(run_schedule, cfg, name, costs)
                    progress.step(f"timed {name} on synthetic stages")
            # the last minute's load, read while the ranks are still up: what they ran beside
            machine = machine_load(args.ranks, cores=cores)
    except LaunchError as exc:
        print(f"\nzbkit demo: a rank failed:\n{exc}", file=sys.stderr)
        return None
    return _Ran(blocks, real_runs, timed_runs, scale, machine)


def _compare(
    args: argparse.Namespace,
    cfg: Config,
    schedules: dict[str, Schedule],
    ran: _Ran,
    expected: dict,
    synthetic: bool,
) -> _Compared:
    """Each run beside its simulation with the same (measured) costs."""
    spans = {n: stage_spans(cfg.layers, s.num_stages) for n, s in schedules.items()}
    blocks = ran.blocks
    real_costs = {n: _report.stage_costs(blocks, spans[n], ranks=args.ranks) for n in schedules}
    real, real_hop = _report.compare(schedules, ran.real_runs, real_costs, expected)
    timed, hop = real, real_hop
    if synthetic:
        scaled = {
            n: _report.stage_costs(blocks, spans[n], ran.scale, args.ranks) for n in schedules
        }
        timed, hop = _report.compare(schedules, ran.timed_runs, scaled)
    pp_costs = _report.stage_costs(blocks, stage_spans(cfg.layers, args.ranks))
    stage_ms = statistics.median(map(_work, pp_costs)) * 1e3  # one of `ranks` stages, unscaled
    return _Compared(real, real_hop, timed, hop, real_costs, stage_ms)


def _texts(
    args: argparse.Namespace, ran: _Ran, got: _Compared, synthetic: bool, cores: int
) -> tuple[list[str], str, str, str]:
    """The intro's lines, the reading of real against synthetic times, and the notes on the
    machine's load beside each table."""
    machine, stage_ms = ran.machine, got.stage_ms
    where = f"{args.ranks} ranks share {cores} CPU cores"
    lines = [
        f"One cost set for every schedule: each block's F, I, W measured once, in one process "
        f"(a stage of {args.ranks}: F + I + W = {stage_ms:.2f} ms per microbatch); each "
        "simulation sums its stages' blocks and adds the hop latency measured between ranks.",
    ]
    if synthetic:
        lines.append(
            f"Timing on synthetic stages: {why_synthetic(machine, stage_ms)}. The timed runs use "
            f"SyntheticStages that sleep (no CPU work) the measured times x{ran.scale:.0f}, a "
            f"stage's F + I + W {args.stage_ms:g} ms, so that a hop is small beside it, as on GPUs."
        )
    elif args.backend == "gloo" and machine.crowded:
        lines.append(
            f"Timing on the real transformer, as asked: {where}, so measured times include "
            "waiting for a core, while the simulation gives every rank its own."
        )
    over = [r.step / r.sim.makespan for r in got.real]
    reading = (
        f"Real timings differ from the synthetic ones: the real steps took {min(over):.1f}-"
        f"{max(over):.1f}x their simulation while their actions took "
        f"{_report.slowdown(got.real, got.real_costs):.1f}x their one-process time: the time goes "
        f"between ~{stage_ms / 3:.1f} ms actions, to per-action overhead and hops of "
        f"{got.real_hop * 1e3:.2f} ms, which dominate such small stages on CPU"
        + (f" ({where})" if args.backend == "gloo" and machine.crowded else "")
        + "."
    )
    # beside each table: was the machine busy while it was measured (and what that does)
    timed_note = machine.note(sleeping=synthetic)
    real_note = machine.note() if synthetic else timed_note
    return lines, reading, timed_note, real_note


def _stage_graph(args: argparse.Namespace, cfg: Config, schedules: dict[str, Schedule]) -> tuple:
    """The analysis and graph of stage 1 in the finest split, one box per layer
    (blocks.1.attn.qkv)."""
    stage = split_stages(cfg.model(), max(s.num_stages for s in schedules.values()))[1]
    x = torch.randn(args.batch, cfg.tokens, cfg.dim, requires_grad=True)  # (b, t, dim)
    (out,) = stage(x).values()  # hidden (b, t, dim), or logits on a last stage
    first, last = stage.span
    analysis = analyze(out, x, stage)
    blocks_text = f"block {first}" if last == first + 1 else f"blocks {first}..{last - 1}"
    graph = viz.draw_graph(analysis, depth=4, title=f"stage 1 ({blocks_text}), one box per layer")
    return analysis, graph
