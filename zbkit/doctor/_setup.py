"""What `check` was given, in one form: the stages (index, module, rank) and the schedule's
facts (zbkit's `Schedule`, torch's converted with `Schedule.from_torch`), arguments checked.

A torch schedule's facts come from its object (its `pipeline_order`, its
`stage_index_to_group_rank`, its `scale_grads`); a torch class is built for the sizes given,
on stand-in stages, by `from_torch`. Nothing here reads a class name the user chose.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage as TorchStage
from torch.distributed.pipelining.schedules import PipelineScheduleMulti, PipelineScheduleSingle

from zbkit.pipeline.stage import PipelineStage as ZbkitStage
from zbkit.schedules import KINDS, Schedule

RUNTIMES = ("zbkit", "torch", "torch+zbkit")
TORCH_SCHEDULES = (PipelineScheduleSingle, PipelineScheduleMulti)


@dataclass(frozen=True)
class StageInfo:
    index: int
    module: nn.Module  # what computes: the stage's module (torch's `submod`)
    rank: int | None  # where it runs; None: the whole model is given, placed by the map
    given_rank: bool = False  # the stage object says its rank (torch's group_rank)
    split_first: bool = False  # zbkit's PipelineStage(split_first_stage=True)


@dataclass(frozen=True)
class Setup:
    runtime: str
    schedule: Schedule  # zbkit's form of the schedule that will run
    stages: tuple[StageInfo, ...]
    whole: bool  # every stage of the model was given (a LocalPipeline, or a notebook check)
    scale_grads: bool | None  # torch's schedule divides grads by m per stage; None: zbkit
    multi: bool  # torch: a multi-stage schedule (its pipeline_order is what runs)
    label: str = ""  # torch's class name; "" for zbkit's (its name is the schedule's)

    def where(self, s: StageInfo) -> str:
        rank = self.rank_of(s)
        return f"stage {s.index}" + ("" if rank is None else f" (rank {rank})")

    def rank_of(self, s: StageInfo) -> int | None:
        if s.rank is not None:
            return s.rank
        return self.schedule.stage_to_rank[s.index] if s.index < self.schedule.num_stages else None

    def splits(self, s: StageInfo) -> bool:
        """Whether stage `s`'s backward runs as I then W on this runtime. torch runs its
        first stage's backward whole at W; zbkit too, unless split_first_stage."""
        kinds = {a.kind for r in self.schedule.program for a in self.schedule.actions(r)
                 if a.stage == s.index}  # fmt: skip
        if not any(KINDS[k].parts == ("I",) for k in kinds):
            return False
        return s.index != 0 or (self.runtime == "zbkit" and s.split_first)

    @property
    def exact(self) -> bool:
        """zbkit's split runs (its runtimes, or the torchpp drop-in inside torch's)."""
        return self.runtime in ("zbkit", "torch+zbkit")

    @property
    def name(self) -> str:
        s = self.schedule
        sizes = f"pp={s.pp}, {s.num_stages} stages, {s.microbatches} microbatches"
        return f"{self.label or s.name} ({sizes})"


def setup(
    stages: Sequence[Any],
    schedule: Any,
    runtime: str | None,
    microbatches: int | None,
    pp: int | None,
    rank: int | None,
) -> tuple[Setup, tuple[str, int] | None]:
    """The checked arguments, and (for a torch class whose constructor refused the sizes)
    torch's refusal, which the schedule checks report."""
    infos = _stages(stages, rank)
    is_torch = isinstance(schedule, TORCH_SCHEDULES) or (
        isinstance(schedule, type) and issubclass(schedule, TORCH_SCHEDULES)
    )
    runtime = runtime or ("torch" if is_torch else "zbkit")
    if runtime not in RUNTIMES:
        raise ValueError(
            f"runtime must be one of {', '.join(map(repr, RUNTIMES))}, got {runtime!r}"
        )
    if is_torch == (runtime == "zbkit"):
        raise ValueError(
            f"runtime={runtime!r} with {_kind(schedule)}: a zbkit Schedule runs on 'zbkit'; "
            "torch's schedules on 'torch' (its own split) or 'torch+zbkit' (inside "
            "zbkit.torchpp.exact_split_backward())"
        )
    refused = None
    if is_torch:
        zb, refused = _from_torch(schedule, microbatches, pp or _pp(stages))
        scale, multi = _scale_grads(schedule), _is_multi(schedule)
    else:
        zb, scale, multi = _zbkit(schedule, microbatches), None, True
    whole = all(not s.given_rank for s in infos) and len(infos) == zb.num_stages
    if whole and sorted(s.index for s in infos) != list(range(zb.num_stages)):
        raise ValueError(
            f"the stages' indices {[s.index for s in infos]} are not 0..{zb.num_stages - 1}"
        )
    infos = tuple(s if whole or s.rank is not None else _ranked(s, rank) for s in infos)
    label = "" if not is_torch else f"torch's {_kind(schedule)}"
    return Setup(runtime, zb, infos, whole, scale, multi, label), refused


def _kind(value: Any) -> str:
    return getattr(value, "__name__", type(value).__name__)


def _stages(stages: Sequence[Any], rank: int | None) -> tuple[StageInfo, ...]:
    if isinstance(stages, nn.Module | ZbkitStage | TorchStage) or not isinstance(stages, Sequence):
        raise TypeError(
            f"stages must be a list (one module or PipelineStage per stage), got {_kind(stages)}"
        )
    if not stages:
        raise ValueError("stages is empty: give the modules (or PipelineStages) to check")
    out = []
    for i, st in enumerate(stages):
        if isinstance(st, TorchStage):
            out.append(StageInfo(st.stage_index, st.submod, st.group_rank, True))
        elif isinstance(st, ZbkitStage):
            out.append(StageInfo(st.stage_index, st.module, None, False, st.split_first_stage))
        elif isinstance(st, nn.Module):
            out.append(StageInfo(i, st, None))
        else:
            raise TypeError(f"stages[{i}] is a {_kind(st)}, not an nn.Module or PipelineStage")
    return tuple(out)


def _ranked(s: StageInfo, rank: int | None) -> StageInfo:
    """A zbkit stage of one rank's share: on `rank`, else this process's rank."""
    if rank is None:
        if not dist.is_initialized():
            raise ValueError(
                f"stage {s.index} is one rank's share of the model, but no rank= was given and "
                "no process group is initialized: pass rank=, or every stage of the model"
            )
        rank = dist.get_rank()
    return StageInfo(s.index, s.module, rank, True, s.split_first)


def _zbkit(schedule: Any, microbatches: int | None) -> Schedule:
    if not isinstance(schedule, Schedule):
        raise TypeError(
            f"schedule must be a zbkit Schedule (build_schedule) or a torch schedule object or "
            f"class, got {_kind(schedule)}"
        )
    if microbatches is not None and microbatches != schedule.microbatches:
        raise ValueError(
            f"microbatches={microbatches}, but the schedule was built for "
            f"{schedule.microbatches}: zbkit's runtimes take the schedule's"
        )
    return schedule


def _from_torch(
    schedule: Any, microbatches: int | None, pp: int | None
) -> tuple[Schedule, tuple[str, int] | None]:
    """torch's schedule as zbkit's; for a class, its refusal of these sizes (and the
    schedule at the fewest microbatches it takes, so the other checks still run)."""
    if not isinstance(schedule, type):
        m = int(schedule._n_microbatches)
        if microbatches is not None and microbatches != m:
            raise ValueError(f"microbatches={microbatches}, but the torch schedule has {m}")
        return Schedule.from_torch(schedule), None
    if microbatches is None or pp is None:
        raise ValueError(
            f"a torch schedule class ({schedule.__name__}) needs microbatches= and pp= (or "
            "torch PipelineStages, whose group_size is pp); or pass the schedule object"
        )
    try:
        return Schedule.from_torch(schedule, pp=pp, microbatches=microbatches), None
    except ValueError as exc:
        refused = str(exc)
    for m in range(microbatches + 1, 8 * pp * 2 + 1):  # the fewest it takes: ask it
        try:
            return Schedule.from_torch(schedule, pp=pp, microbatches=m), (refused, m)
        except ValueError:
            continue
    raise ValueError(f"{schedule.__name__} refuses pp={pp}, microbatches={microbatches}: {refused}")


def _pp(stages: Sequence[Any]) -> int | None:
    sizes = {st.group_size for st in stages if isinstance(st, TorchStage)}
    return sizes.pop() if len(sizes) == 1 else None


def _scale_grads(schedule: Any) -> bool:
    if isinstance(schedule, type):  # torch's constructors default to True
        return True
    return bool(schedule.scale_grads)


def _is_multi(schedule: Any) -> bool:
    cls = schedule if isinstance(schedule, type) else type(schedule)
    return issubclass(cls, PipelineScheduleMulti)
