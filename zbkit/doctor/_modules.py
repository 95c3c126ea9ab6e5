"""Checks that read the modules themselves: DDP wrappers, and parameters two stages share.

- A `DistributedDataParallel` module in a stage whose backward is split: DDP all-reduces
  from hooks that fire when autograd accumulates a parameter's gradient; a split backward
  computes the weight gradients with `torch.autograd.grad` and adds them itself, so the
  hooks never fire for them (pytorch/pytorch issue 144530).
- One parameter (by identity) in two stages of one rank while torch's schedule divides each
  stage's gradients by the microbatch count (`scale_grads=True`): torch divides a stage's
  `.grad` when that stage's last backward ends, so the shared `.grad` is divided once per
  stage, each time holding a different part of it. zbkit's runtimes scale the loss instead,
  once per microbatch, which is exact for a shared parameter.
- One parameter in stages the schedule puts on different ranks (a tied embedding under a
  linear placement): each rank builds the model and keeps its own stages, so each holds its
  own copy of the parameter and gets only its stages' part of the gradient; nothing adds the
  parts (in zbkit's runtimes or torch's), and the copies drift apart. Seen only where every
  stage is given (one process's view of the whole model).
"""

from __future__ import annotations

from torch.nn.parallel import DistributedDataParallel

from zbkit.doctor._setup import Setup, StageInfo
from zbkit.doctor.findings import Finding


def check_ddp(setup: Setup, s: StageInfo) -> list[Finding]:
    found = [name or "(the stage module)" for name, m in s.module.named_modules()
             if isinstance(m, DistributedDataParallel)]  # fmt: skip
    zbkit = setup.runtime == "zbkit"
    if not found or not (zbkit or setup.splits(s)):
        return []
    if zbkit:  # zbkit's executors never call DDP's no_sync / prepare_for_backward
        happens = (
            "zbkit's runtimes do not drive DDP's reducer: each forward prepares it for one "
            "backward, so with several microbatches in flight some microbatches' gradients "
            "are never all-reduced, and the replicas drift apart"
        )
    else:
        happens = (
            "the split backward computes weight gradients outside DDP's reducer hooks "
            "(pytorch/pytorch issue 144530): this stage's gradients are not all-reduced "
            "across the data-parallel replicas, which then drift apart"
        )
    fix = (
        "give zbkit's ScheduleRunner the bare module and the data-parallel group "
        "(ScheduleRunner(..., dp_group=...) averages after each stage's last W)"
        + ("" if zbkit else ", or a schedule without I/W (Schedule1F1B, ScheduleGPipe)")
    )
    return [Finding(
        "ddp-under-split", f"{setup.where(s)}, DistributedDataParallel module {', '.join(found)}",
        happens, fix, "wrong", s.index, setup.rank_of(s),
    )]  # fmt: skip


def check_shared(setup: Setup) -> list[Finding]:
    if not setup.scale_grads:  # zbkit's runtimes, or torch's scale_grads=False
        return []
    by_rank: dict[int | None, list[StageInfo]] = {}
    for s in setup.stages:
        by_rank.setdefault(setup.rank_of(s), []).append(s)
    return [f for rank, held in by_rank.items() for f in _shared_on(setup, rank, held)]


def _shared_on(setup: Setup, rank: int | None, held: list[StageInfo]) -> list[Finding]:
    owners: dict[int, list[tuple[int, str]]] = {}
    for s in held:
        for name, p in s.module.named_parameters():
            owners.setdefault(id(p), []).append((s.index, name))
    out = []
    for places in owners.values():
        stages = sorted({i for i, _ in places})
        if len(stages) < 2:
            continue
        named = ", ".join(f"stage {i} {n}" for i, n in places)
        m = setup.schedule.microbatches
        out.append(Finding(
            "shared-param-scaled-twice", f"rank {rank}, one parameter in stages {stages}: {named}",
            f"torch's schedule (scale_grads=True) divides each stage's .grad by {m} when that "
            f"stage's last backward ends, so this parameter's gradient is divided {len(stages)} "
            "times, each time over a different part of it: a wrong gradient",
            f"build the schedule with scale_grads=False and divide the loss by the microbatch "
            f"count in loss_fn (loss / {m}); zbkit's runtimes do this and are exact",
            "wrong", stages[0], rank,
        ))  # fmt: skip
    return out


def check_shared_across_ranks(setup: Setup) -> list[Finding]:
    if not setup.whole:  # one rank's stages: the other ranks' copies are not here to see
        return []
    owners: dict[int, list[tuple[int, str]]] = {}
    for s in setup.stages:
        for name, p in s.module.named_parameters():
            owners.setdefault(id(p), []).append((s.index, name))
    out = []
    for places in owners.values():
        ranks = sorted({setup.schedule.stage_to_rank[i] for i, _ in places})
        if len(ranks) < 2:
            continue
        stages = sorted({i for i, _ in places})
        named = ", ".join(f"stage {i} {n}" for i, n in places)
        out.append(Finding(
            "shared-param-across-ranks",
            f"one parameter in stages {stages} on ranks {ranks}: {named}",
            f"on real ranks (ScheduleRunner, or torch's runtime) each of ranks {ranks} holds "
            "its own copy and gets only its stages' part of the gradient, silently: nothing "
            "adds the parts, and the copies drift apart after the first optimizer step "
            "(LocalPipeline, one process, holds one parameter and is exact)",
            f"zbkit's ScheduleRunner(..., tied={{name: p}}) on every rank (zbkit.hf.tied(model) "
            "for a Hugging Face model) keeps the copies one weight; under torch's runtime, "
            f"after each step sum its gradient over ranks {ranks} (torch.distributed."
            "all_reduce(p.grad, group=...)) before the optimizer; or untie it; or a V "
            f"schedule (zb-v, dualpipev) that puts stages 0 and "
            f"{setup.schedule.num_stages - 1} on one rank",
            "wrong", stages[0], ranks[0],
        ))  # fmt: skip
    return out
