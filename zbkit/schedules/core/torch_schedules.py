"""torch.distributed.pipelining's schedule objects, read: their rows, placement and sizes.

`read_torch(obj)` reads a torch schedule object's `pipeline_order` (its compute program;
torch's lowered `pipeline_order_with_comms` where it has one) as torch's CSV rows, with
torch's stage placement and zbkit's name of the same schedule (the records' `torch`):
what `Schedule.from_torch` makes a `Schedule` of. A class (or its name) with `pp` and
`microbatches` is built first, on stand-in stages (torch's constructors only read sizes
from a stage), so no process group is needed.
"""

from __future__ import annotations

import csv
import io
from types import SimpleNamespace
from typing import Any, NamedTuple

from zbkit.schedules.core.placement import stage_to_rank
from zbkit.schedules.core.registry import RECORDS, ScheduleRecord, torch_names

__all__ = ["TorchRows", "read_torch", "resolve_class"]


class TorchRows(NamedTuple):
    """A torch schedule as `Schedule.from_csv` takes it."""

    text: str  # torch's CSV rows, one per rank
    stage_to_rank: list[int]
    microbatches: int
    name: str  # zbkit's name of the same schedule, else torch's class name


def _torch_class_name(cls: type) -> str:
    """The torch class `cls` is (or derives from) among `torch_names()`; else its own name."""
    known = torch_names()
    for base in cls.__mro__:
        if base.__name__ in known and base.__module__.startswith("torch."):
            return base.__name__
    return cls.__name__


def resolve_class(name_or_class: str | type) -> tuple[str, type]:
    """("zb-v" | "ScheduleZBVZeroBubble" | the class) -> (torch class name, torch class)."""
    # lazily: zbkit.schedules stays torch-free at import
    from torch.distributed.pipelining import schedules as torch_schedules

    if isinstance(name_or_class, type):
        return _torch_class_name(name_or_class), name_or_class
    known = torch_names()
    by_zbkit = {zb: cls for cls, zb in known.items()}
    cls_name = by_zbkit.get(name_or_class, name_or_class)
    if cls_name not in known:
        listed = ", ".join(f"{zb} ({cls})" for cls, zb in known.items())
        raise ValueError(f"no torch schedule named {name_or_class!r}; known: {listed}")
    return cls_name, getattr(torch_schedules, cls_name)


def _record_of(cls_name: str) -> ScheduleRecord | None:
    name = torch_names().get(cls_name)
    return RECORDS[name] if name is not None else None


def _instantiate(cls: type, cls_name: str, pp: int, microbatches: int, v: int | None) -> Any:
    """torch's schedule object for these sizes, on stand-in stages (what its constructors read)."""
    found = _record_of(cls_name)
    placement = found.placement if found is not None else "looped"
    if placement == "linear":  # one stage per rank
        if v not in (None, 1):
            raise ValueError(f"{cls_name} runs one stage per rank; got stages_per_rank={v}")
        stage = SimpleNamespace(num_stages=pp, group_size=pp, group_rank=0, submod=None)
        return cls(stage, microbatches)
    if placement == "v" and v not in (None, 2):
        raise ValueError(f"{cls_name} runs two stages per rank (a V); got stages_per_rank={v}")
    v = 2 if v is None else v
    stage = SimpleNamespace(num_stages=v * pp, group_size=pp, group_rank=0, submod=None)
    return cls([stage] * v, microbatches)


def _placement(obj: Any, cls_name: str, pp: int, num_stages: int) -> list[int]:
    """torch's own map when the object has one (multi-stage schedules), else the record's
    placement (looped for a class zbkit has no record of)."""
    mapping = getattr(obj, "stage_index_to_group_rank", None)
    if mapping and len(mapping) == num_stages:
        return [int(mapping[s]) for s in range(num_stages)]
    found = _record_of(cls_name)
    placement = "v" if found is not None and found.placement == "v" else "looped"
    return stage_to_rank(placement, pp, num_stages // pp)


def _rows_text(order: dict[int, list[Any]]) -> str:
    """torch's rows as its CSV writes them (an idle step, None, as an empty cell)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for rank in sorted(order):
        writer.writerow(["" if a is None else str(a) for a in order[rank]])
    return out.getvalue()


def read_torch(
    schedule_or_class: Any,
    *,
    pp: int | None = None,
    microbatches: int | None = None,
    stages_per_rank: int | None = None,
) -> TorchRows:
    """torch's schedule (an object, or a class or its name with `pp` and `microbatches`) as
    its rows of actions in torch's CSV form, its placement, microbatches and zbkit's name
    of the same schedule: what `Schedule.from_torch` makes a `Schedule` of."""
    if isinstance(schedule_or_class, type | str):  # a class, or its name (or zbkit's)
        if pp is None or microbatches is None:
            name = getattr(schedule_or_class, "__name__", schedule_or_class)
            raise TypeError(
                f"from_torch({name}) needs pp= and microbatches= (or pass a schedule object)"
            )
        cls_name, cls = resolve_class(schedule_or_class)
        obj = _instantiate(cls, cls_name, pp, microbatches, stages_per_rank)
    else:
        obj, cls_name = schedule_or_class, _torch_class_name(type(schedule_or_class))
    order = getattr(obj, "pipeline_order_with_comms", None) or getattr(obj, "pipeline_order", None)
    if not order:
        raise ValueError(
            f"{type(obj).__name__} has no pipeline_order (torch draws none for it): nothing to load"
        )
    num_stages = int(obj._num_stages)
    m = int(obj._n_microbatches)
    size = len(order)
    for what, given, have in (("pp", pp, size), ("microbatches", microbatches, m)):
        if given is not None and given != have:
            raise ValueError(f"{what}={given}, but the torch schedule has {what}={have}")
    placement = _placement(obj, cls_name, size, num_stages)
    name = torch_names().get(cls_name, cls_name)
    return TorchRows(_rows_text(order), placement, m, name)
