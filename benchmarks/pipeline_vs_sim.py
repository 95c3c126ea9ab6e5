"""Measured pipeline steps against the simulator, on real ranks.

Part 1 (4 gloo ranks, synthetic stages with F = I = W = 20 ms, m = 8): for 1f1b, zb-h1, zb-h2
and zb-v, the measured makespan over the simulated one (target <= 1.10), and the measured
speed-up of zb-h1 over 1f1b against the simulated speed-up (target >= 90%).

Part 2 (2 gloo ranks, a small transformer split in two stages): ms per step for gpipe, 1f1b
and zb-h1 beside one plain full-batch step of the same model in the same process, and the
measured makespan over the simulated one with the F, I, W times measured in the run.

Schedules alternate inside every round (paired runs), and medians over rounds are printed,
because the machine is shared and noisy.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/pipeline_vs_sim.py [--rounds 5] [--backend gloo]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

from zbkit.launch import launch
from zbkit.pipeline import PipelineStage, ScheduleRunner, SyntheticStage, Trace
from zbkit.schedules import Costs, build_schedule, simulate
from zbkit.schedules.measure import hop_latency, measured_costs

SYNTH_NAMES = ("1f1b", "zb-h1", "zb-h2", "zb-v")
# label -> (schedule, split_first_stage): stage 0's I runs at its W by default; the "+split"
# rows give stage 0 a real I pass, the timing every stage has in the simulator
SYNTH_RUNS = {n: (n, False) for n in SYNTH_NAMES} | {
    "zb-h1+split": ("zb-h1", True),
    "zb-v+split": ("zb-v", True),
}
T = 0.020  # seconds for each of F, I, W


def _synthetic_rank(runs: dict, rounds: int, m: int, backend: str) -> dict:
    """On every rank: one runner per run; each round runs every one of them once."""
    dev = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else "cpu"
    rank = dist.get_rank()
    runners, names = {}, list(runs)
    for name, (schedule, split) in runs.items():
        sch = build_schedule(schedule, pp=dist.get_world_size(), microbatches=m)
        stages = [
            PipelineStage(
                SyntheticStage(T, T, T, width=16).to(dev), s, sch.num_stages,
                split_first_stage=split,
            )
            for s in sch.stages_on(rank)
        ]  # fmt: skip
        runners[name] = ScheduleRunner(sch, stages, lambda out, y: out["x"].pow(2).mean())
    x = torch.randn(4 * m, 16, device=dev)
    traces: dict[str, list[Trace]] = {n: [] for n in names}
    for r in range(rounds + 1):  # round 0 warms up (first messages, allocator, threads)
        for name in names:
            runners[name].step(x, targets=x)
            if r:
                traces[name].append(runners[name].trace)
    return traces


def _overheads(trace: Trace, costs: Costs) -> tuple[float, float]:
    """(median time an action took beyond its set time, median hop latency), seconds.

    A hop is the gap between the end of the action producing a microbatch's tensors and
    the start of the action consuming them on another rank, when that rank was idle.
    """
    over = [e.end - e.start - costs.duration(e.kind) for e in trace.events]
    return statistics.median(over), hop_latency(trace.events)


def part1(rounds: int, backend: str) -> None:
    m = 8
    out = launch(_synthetic_rank, SYNTH_RUNS, rounds, m, backend, nprocs=4, backend=backend,
                 timeout=600)  # fmt: skip
    costs = Costs(F=T, I=T, W=T)
    print(f"Part 1: 4 ranks ({backend}), synthetic stages F = I = W = {T * 1e3:.0f} ms, m = {m}")
    print(f"{'schedule':>12} {'measured ms':>12} {'simulated ms':>13} {'ratio':>7}  target  "
          f"| overrun/action  hop   sim with both  ratio")  # fmt: skip
    measured, simulated = {}, {}
    for name, (schedule, _) in SYNTH_RUNS.items():
        traces = [Trace.merge(rank[name][i] for rank in out) for i in range(rounds)]
        spans = [t.makespan for t in traces]
        measured[name] = statistics.median(spans)
        typical = traces[spans.index(min(spans, key=lambda x: abs(x - measured[name])))]
        over, hop = _overheads(typical, costs)
        sch = build_schedule(schedule, pp=4, microbatches=m)
        simulated[name] = simulate(sch, costs).makespan
        ratio = measured[name] / simulated[name]
        flag = "ok" if ratio <= 1.10 else "OVER"
        # what the simulator says once the measured overheads are put into its costs
        padded = Costs(F=T + over, I=T + over, W=T + over, comm=hop)
        sim2 = simulate(sch, padded).makespan
        print(f"{name:>12} {measured[name] * 1e3:12.1f} {simulated[name] * 1e3:13.1f} "
              f"{ratio:7.3f}  <= 1.10 {flag:>4} | {over * 1e3:11.2f} ms {hop * 1e3:5.2f} ms "
              f"{sim2 * 1e3:10.1f} ms {measured[name] / sim2:6.3f}")  # fmt: skip
    for zb in ("zb-h1", "zb-h1+split"):
        sp_meas = measured["1f1b"] / measured[zb]
        sp_sim = simulated["1f1b"] / simulated[zb]
        share, gain = sp_meas / sp_sim, (sp_meas - 1) / (sp_sim - 1)
        verdict = "ok" if share >= 0.9 else "UNDER"
        print(f"{zb} over 1f1b: measured speed-up {sp_meas:.3f}x, simulated {sp_sim:.3f}x, "
              f"measured/simulated {share:.1%} (target >= 90%: {verdict}); "
              f"{gain:.0%} of the simulated gain")  # fmt: skip


class _Block(nn.Module):
    """Two transformer encoder layers: one pipeline stage of the small real model."""

    def __init__(self, d: int, last: bool) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            *[
                nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
                for _ in range(2)
            ]  # fmt: skip
        )
        self.head = nn.Linear(d, d) if last else None

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.layers(x)  # (batch, seq, d)
        return {"x": self.head(h) if self.head is not None else h}


def _transformer_rank(names: tuple[str, ...], rounds: int, m: int) -> dict:
    rank, d = dist.get_rank(), 128
    torch.manual_seed(0)
    blocks = [_Block(d, last=False), _Block(d, last=True)]
    x, y = torch.randn(4 * m, 64, d), torch.randn(4 * m, 64, d)
    loss_fn = lambda out, t: nn.functional.mse_loss(out["x"], t)  # noqa: E731
    runners = {}
    for name in names:
        sch = build_schedule(name, pp=2, microbatches=m)
        stages = [PipelineStage(blocks[s], s, 2) for s in sch.stages_on(rank)]
        runners[name] = ScheduleRunner(sch, stages, loss_fn)
    plain: list[float] = []
    traces: dict[str, list[Trace]] = {n: [] for n in names}
    for r in range(rounds + 1):
        if rank == 0:  # the baseline: one plain full-batch step of the whole model, here
            t0 = time.perf_counter()
            loss_fn(blocks[1](blocks[0](x)["x"]), y).backward()
            plain.append(time.perf_counter() - t0)
        dist.barrier()
        for name in names:
            runners[name].step(x, targets=y)
            if r:
                traces[name].append(runners[name].trace)
    for b in blocks:
        b.zero_grad(set_to_none=True)
    return {"traces": traces, "plain": plain[1:]}


def part2(rounds: int) -> None:
    names, m = ("gpipe", "1f1b", "zb-h1"), 4
    out = launch(_transformer_rank, names, rounds, m, nprocs=2, timeout=600)
    plain = statistics.median(out[0]["plain"])
    print(f"\nPart 2: small transformer (2 x 2 encoder layers, d=128, seq 64, batch {4 * m}) "
          f"on 2 gloo ranks, m = {m}")  # fmt: skip
    print(f"plain full-batch step in one process: {plain * 1e3:.1f} ms")
    print(f"{'schedule':>10} {'ms/step':>8} {'vs plain':>9} {'sim ms':>7} {'meas/sim':>9}")
    for name in names:
        traces = [Trace.merge(rank["traces"][name][i] for rank in out) for i in range(rounds)]
        spans = [t.makespan for t in traces]
        med = statistics.median(spans)
        best = traces[spans.index(min(spans, key=lambda s: abs(s - med)))]
        sim = simulate(build_schedule(name, pp=2, microbatches=m), measured_costs(best.events, 2))
        print(f"{name:>10} {med * 1e3:8.1f} {plain / med:8.2f}x {sim.makespan * 1e3:7.1f} "
              f"{med / sim.makespan:9.3f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    parser.add_argument("--part", type=int, choices=[1, 2], default=None)
    args = parser.parse_args()
    if args.part in (None, 1):
        part1(args.rounds, args.backend)
    if args.part in (None, 2):
        part2(args.rounds)


if __name__ == "__main__":
    main()
