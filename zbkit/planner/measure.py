"""`measure(layers, batch, schedule, pp=, microbatches=)`: the plan run for real, per rank.

Each rank is a fresh process (`zbkit.launch`: gloo on CPU, NCCL on GPUs) holding its stages'
layers in a `PipelineStage`, stepped by `ScheduleRunner` with the optimizer named. After
`warmup` steps (the optimizer's state exists from the first on; a host's allocator takes a
few more to settle, each one faster than the last), one step is watched by torch's own
allocator and `steps` more are timed: on CUDA `max_memory_allocated` after
`reset_peak_memory_stats`; on the CPU the allocation and free events `torch.profiler`
records (`allocator.watch`), on top of what was live when the step began: the parameters,
counted from the tensors, and what the setup and the warm-up left allocated (the optimizer's
state, the runtime's receive buffers), from the same events. The last timed step's trace,
every rank's merged, comes back too (`Measured.trace`), to draw over the prediction.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from zbkit.launch import launch
from zbkit.parallel.process_group import group_device
from zbkit.pipeline import PipelineStage, ScheduleRunner, Trace
from zbkit.planner.allocator import settle, watch
from zbkit.planner.predict import stage_ranges
from zbkit.planner.profile import OPTIMIZERS, feed, map_tensors, tensor_bytes
from zbkit.schedules import Schedule, build_schedule

__all__ = ["Chain", "Measured", "RankMeasured", "measure"]


class Chain(nn.Module):
    """Layers run one after another, each fed the previous one's output (a tensor goes in
    as is, a tuple as positional inputs, a dict as keyword inputs): one stage's module."""

    def __init__(self, layers: Sequence[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        x = self.layers[0](*args, **kwargs)
        for layer in self.layers[1:]:
            x = feed(layer, x)
        return x


@dataclass(frozen=True)
class RankMeasured:
    peak_bytes: int  # the most the allocator held during a step
    start_bytes: int  # live when the step began: parameters, optimizer state, buffers
    seconds: float  # median step, the optimizer's step included
    samples: tuple[float, ...]


@dataclass(frozen=True)
class Measured:
    schedule: str
    stages: list[range]
    ranks: list[RankMeasured]
    device: str  # what rank 0 ran on ("cpu", "cuda:0")
    program: Schedule  # what ran
    trace: Trace | None = field(default=None, repr=False)  # the last timed step, every rank

    @property
    def step_seconds(self) -> float:
        return max(r.seconds for r in self.ranks)

    @property
    def fastest_step_seconds(self) -> float:
        """The fastest timed step, each step as long as its slowest rank (a barrier starts
        every step on all ranks at once). Other work on a shared host only ever adds time,
        so the fastest step is the closest to what the step itself costs."""
        return min(max(step) for step in zip(*(r.samples for r in self.ranks), strict=True))


def measure(
    layers: nn.Sequential | Sequence[nn.Module],
    batch: Any,
    schedule: str | Schedule,
    *,
    pp: int,
    microbatches: int,
    stages: Sequence[Sequence[int] | range] | None = None,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    optimizer: str = "adam",
    steps: int = 3,
    warmup: int = 3,
    backend: str = "gloo",
    timeout: float = 600.0,
) -> Measured:
    """Run `schedule` on `pp` ranks over `batch` (module docstring). `batch` is `(inputs,
    targets)`, split into `microbatches` on dim 0; `stages` the layers of each stage (as a
    `Prediction`'s, to measure what was predicted; `None`: as even as the layer count
    allows)."""
    mods = list(layers)
    if loss_fn is None or not callable(loss_fn):
        raise ValueError("measure needs a loss_fn(outputs, targets): a step trains on it")
    if not isinstance(batch, tuple | list) or len(batch) != 2:
        raise ValueError("measure: batch is (inputs, targets)")
    if optimizer not in OPTIMIZERS:
        raise ValueError(
            f"measure: unknown optimizer {optimizer!r}: one of {', '.join(OPTIMIZERS)}"
        )
    for what, value in (("steps", steps), ("warmup", warmup)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"measure: {what} must be an int >= 1, got {value!r}")
    built = (
        schedule
        if isinstance(schedule, Schedule)
        else build_schedule(schedule, pp=pp, microbatches=microbatches)
    )
    if (built.pp, built.microbatches) != (pp, microbatches):
        raise ValueError(
            f"measure: the schedule is for pp={built.pp}, m={built.microbatches}, "
            f"not pp={pp}, microbatches={microbatches}"
        )
    parts = _parts(len(mods), built.num_stages, stages)
    found = launch(_rank, mods, batch, built, parts, loss_fn, optimizer, steps, warmup,
                   nprocs=pp, backend=backend, timeout=timeout)  # fmt: skip
    ranks = [RankMeasured(*r[:4]) for r in found]
    return Measured(built.name, parts, ranks, found[0][4], built, found[0][5])


def _parts(n: int, count: int, stages) -> list[range]:
    if stages is not None:
        return stage_ranges(n, stages, count, "measure")
    if count > n:
        raise ValueError(f"measure: {count} stages but {n} layers")
    size, extra = divmod(n, count)
    edges = [0]
    for s in range(count):
        edges.append(edges[-1] + size + (s < extra))
    return [range(a, b) for a, b in zip(edges, edges[1:], strict=False)]


def _rank(mods, batch, schedule, parts, loss_fn, optimizer, steps, warmup):
    """One rank's share: its stages, the runner, warm-up steps, a watched step, timed steps.

    What is live when the watched step begins is every byte this rank holds: on CUDA the
    allocator's count; on the CPU the parameters (made before this function ran) and what
    the setup and the warm-up left allocated (the optimizer's state, the runtime's receive
    buffers), as the allocator's events under `watch` say."""
    rank = dist.get_rank()
    device = group_device()
    mine = [s for s, r in enumerate(schedule.stage_to_rank) if r == rank]
    params: list[torch.Tensor] = []
    made: dict[str, Any] = {}

    def setup() -> None:
        settle(device)  # as the profile's: the allocator as a long run's
        stages = [
            PipelineStage(Chain([mods[i] for i in parts[s]]).to(device), s, schedule.num_stages)
            for s in mine
        ]
        params.extend(p for st in stages for p in st.module.parameters())
        made["runner"] = ScheduleRunner(schedule, stages, loss_fn)
        made["opt"] = OPTIMIZERS[optimizer](params)
        made["step"] = _stepper(made["runner"], made["opt"], batch, device)
        for _ in range(warmup):  # the optimizer's state, the analyses, the shapes, the pages
            made["step"]()

    step: Callable[[], None]
    dist.barrier()
    if device.type == "cuda":
        setup()
        step = made["step"]
        dist.barrier()
        torch.cuda.synchronize(device)
        start_bytes = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
    else:
        set_up = watch(setup, device)
        step = made["step"]
        start_bytes = tensor_bytes(params) + set_up.held()
        dist.barrier()
        peak = watch(step, device).peak() + start_bytes
    samples = []
    for _ in range(steps):
        dist.barrier()
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        samples.append(time.perf_counter() - start)
    trace = made["runner"].gather_trace()  # after the timing: a collective costs no sample
    return peak, start_bytes, statistics.median(samples), tuple(samples), str(device), trace


def _stepper(runner: ScheduleRunner, opt: torch.optim.Optimizer, batch, device):
    """One training step: the schedule, the optimizer's step, the gradients let go."""
    inputs, targets = (map_tensors(lambda t: t.to(device), x) for x in batch)

    def step() -> None:
        runner.step(inputs, targets=targets)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step
