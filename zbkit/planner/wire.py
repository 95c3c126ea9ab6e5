"""`wire(pp=2)`: what the wire and the runtime add to a step, measured on real ranks.

A pipeline of stages that compute next to nothing (each multiplies its input by one scalar
parameter) runs 1F1B on `pp` ranks through zbkit's own runtime (`ScheduleRunner`), for
microbatches of two sizes. From each run's trace: the hop, the time from a producer's end
to its consumer's start on another rank where that rank sat waiting
(`zbkit.schedules.measure.hop_latency`); and the runtime's own cost per action, the median
action's duration at the smaller size (the compute in it is a few elementwise products).
The two hops give a line, `latency + bytes * per_byte`: what `predict` charges a stage
for each transfer of its tensors.

And the crowding: ranks that share a machine (gloo ranks on one host's cores) slow each
other down, through the memory bus and shared caches, where a profile measured one layer
alone. A small MLP's forward and backward is timed on each rank alone, then on every rank
at once; the median ratio is what `predict` multiplies the profile's compute by (about 1
where each rank has its own GPU).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from zbkit.launch import launch
from zbkit.parallel.process_group import group_device
from zbkit.pipeline import PipelineStage, ScheduleRunner
from zbkit.planner.allocator import settle
from zbkit.schedules import build_schedule
from zbkit.schedules.measure import hop_latency

__all__ = ["Wire", "wire"]


@dataclass(frozen=True)
class Wire:
    """Seconds a transfer adds (`latency` plus `per_byte` for each byte) and the runtime's
    own seconds per action (`overhead`), as `wire` measured them."""

    latency: float
    per_byte: float
    overhead: float
    crowding: float = 1.0  # compute on every rank at once / on one rank alone

    def hop(self, nbytes: int) -> float:
        """Seconds one transfer of `nbytes` adds to the wait of the stage receiving it."""
        return self.latency + nbytes * self.per_byte


class _Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


def wire(
    *,
    pp: int = 2,
    sizes: tuple[int, int] = (1 << 12, 1 << 22),
    microbatches: int = 8,
    backend: str = "gloo",
    timeout: float = 300.0,
) -> Wire:
    """Measure the wire and the runtime on `pp` ranks (module docstring); `sizes` are the
    two microbatch sizes in bytes (float32 tensors)."""
    if not isinstance(pp, int) or pp < 2:
        raise ValueError(f"wire: pp must be an int >= 2 (a hop needs two ranks), got {pp!r}")
    small, large = sizes
    if not 0 < small < large:
        raise ValueError(f"wire: sizes must be two byte counts, smaller first, got {sizes!r}")
    found = launch(_rank, sizes, microbatches, nprocs=pp, backend=backend, timeout=timeout)
    hops, overhead, _ = found[0]
    per_byte = max(0.0, (hops[1] - hops[0]) / (large - small))
    latency = max(0.0, hops[0] - small * per_byte)
    crowding = statistics.median(ratio for *_, ratio in found)
    return Wire(latency, per_byte, overhead, crowding)


def _rank(sizes: tuple[int, int], m: int) -> tuple[list[float], float, float]:
    rank, pp = dist.get_rank(), dist.get_world_size()
    device = group_device()
    settle(device)  # as `profile` and `measure` run (`allocator.settle`)
    schedule = build_schedule("1f1b", pp=pp, microbatches=m)
    hops, overheads = [], []
    for nbytes in sizes:
        stage = PipelineStage(_Scale().to(device), rank, pp)
        runner = ScheduleRunner(schedule, [stage], lambda out, target: (out - target).sum())
        x = torch.ones(m, nbytes // 4, device=device)
        for _ in range(2):  # a warm-up step, then the one read
            runner.step(x, targets=torch.zeros_like(x))
        trace = runner.gather_trace()
        hops.append(hop_latency(trace.events))
        overheads.append(statistics.median(e.end - e.start for e in trace.events))
    return hops, overheads[0], _crowding(device)


def _crowding(device: torch.device, repeats: int = 9, rounds: int = 5) -> float:
    """This rank's compute with every rank computing at once, over its compute alone (the
    others waiting at a barrier): medians of `repeats` forward and backward passes, the
    median ratio of `rounds` (the host's own noise comes and goes)."""
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).to(device)
    x = torch.randn(512, 256, device=device)

    def timed() -> float:
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            mlp(x).sum().backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            samples.append(time.perf_counter() - start)
        return statistics.median(samples)

    timed()  # warm-up: the allocator's pages and the kernels
    ratios = []
    for _ in range(rounds):
        alone = 0.0
        for turn in range(dist.get_world_size()):
            dist.barrier()
            if turn == dist.get_rank():
                alone = timed()
        dist.barrier()
        ratios.append(timed() / alone)
    dist.barrier()
    return statistics.median(ratios)
