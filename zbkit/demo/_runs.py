"""What the ranks of `zbkit demo` run: functions a ``Cluster`` ships to every rank by
cloudpickle (module-level, so they travel by reference), and the config they rebuild from.

- ``Config``: everything a rank needs to build the same model and data as every other;
- ``measure_blocks``: on rank 0, each block's F, I and W in one process: the one cost set
  every schedule's simulation uses;
- ``run_schedule``: on every rank, one schedule's timed steps, on the real transformer or on
  ``SyntheticStage``s that sleep the measured times;
- ``oracle``: plain single-process training, the gradients the pipelines must match.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from zbkit.models import TinyTransformer, split_stages
from zbkit.pipeline import LocalPipeline, PipelineStage, ScheduleRunner, SyntheticStage
from zbkit.schedules import Costs, Schedule, build_schedule
from zbkit.schedules.catalog import RECORDS
from zbkit.schedules.measure import measured_costs


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
    # a schedule that always searches (zb-auto) plans with costs; the others take none
    searches = RECORDS[name].searches == "always"
    extra: dict[str, Any] = {"costs": Costs()} if searches else {}
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
        mods: Sequence[nn.Module] = split_stages(cfg.model().to(device), schedule.num_stages)
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


def oracle(cfg: Config) -> tuple[dict[str, torch.Tensor | None], float]:
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
