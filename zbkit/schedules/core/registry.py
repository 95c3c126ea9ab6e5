"""The registry of named schedules: `ScheduleRecord`, `RECORDS`, `register`, `SCHEDULES`.

A record holds every fact zbkit knows about one named schedule: its builder, the options it
takes with their defaults, where its stages live, torch's classes of the same schedule, the
paper's closed forms, whether it searches, and one line saying what it is. The records of
zbkit's own schedules are registered by `zbkit.schedules.catalog`; `build_schedule`, the
formulas, `from_torch`, the frontier, the CLI and the explorer read them here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, overload

from zbkit.schedules.core.placement import stage_to_rank

__all__ = [
    "RECORDS",
    "SCHEDULES",
    "Formulas",
    "ScheduleRecord",
    "record",
    "register",
    "searchers",
    "torch_names",
]


class Formulas(NamedTuple):
    """The paper's closed forms; each `(pp, m, v, costs) -> (text, value)`, or None where
    its assumptions fail (`conditions` says which, for the user)."""

    bubble: Callable[[int, int, int, Any], Any]  # formulas.Bubble | None
    peak: Callable[[int, int, int, Any], Any] | None = None  # formulas.Peak | None
    conditions: str = ""  # e.g. "W <= min(F, I) and m >= p"; "" where they always hold


@dataclass(frozen=True, eq=False)
class ScheduleRecord:
    """Everything zbkit knows about one named schedule."""

    name: str  # what `build_schedule(name, ...)` and the CLI take
    build: Callable[..., Any]  # (pp, m, name, **options) -> Schedule; refuses with why
    about: str  # one line for listings and --help
    placement: str = "linear"  # "linear", "looped" or "v" (`stage_to_rank`)
    options: Mapping[str, Any] = field(default_factory=dict)  # option -> default
    torch: tuple[str, ...] = ()  # torch.distributed.pipelining classes of the same schedule
    formulas: Formulas | None = None  # the paper's closed forms (None: it has none)
    # "never"; "given": costs or a memory_limit make it search (else its fixed construction);
    # "always": it is a search, built for each of `placements` (its `placement` option)
    searches: str = "never"
    placements: tuple[str, ...] = ()
    # the most actions (F, I, W per stage and microbatch) it builds, each build being a proof
    # (None: any size); `build_schedule` refuses larger, `plot_frontier` draws it when named
    largest: int | None = None

    def stage_to_rank(self, pp: int, **options: Any) -> list[int]:
        """Where its stages live for these options (zb-auto's `placement`, `stages_per_rank`)."""
        given = {**self.options, **options}
        return stage_to_rank(given.get("placement", self.placement), pp,
                             given.get("stages_per_rank", 1))  # fmt: skip

    def searching(self, given: bool) -> bool:
        """Whether building it searches, `given` costs or a memory limit (or not)."""
        return self.searches == "always" or (self.searches == "given" and given)


RECORDS: dict[str, ScheduleRecord] = {}  # name -> record, in the order they were registered


def register(new: ScheduleRecord) -> ScheduleRecord:
    """Add a schedule (`del RECORDS[name]` takes it away). Its name and torch classes must be
    new; `searches` one of "never", "given", "always"."""
    if new.name in RECORDS:
        raise ValueError(f"a schedule named {new.name!r} is already registered")
    if new.searches not in ("never", "given", "always"):
        raise ValueError(f"{new.name}: searches must be never/given/always, got {new.searches!r}")
    taken = {c: r.name for r in RECORDS.values() for c in r.torch}
    for cls in new.torch:
        if cls in taken:
            raise ValueError(f"{new.name}: torch's {cls} is already {taken[cls]!r}")
    RECORDS[new.name] = new
    return new


def record(name: str) -> ScheduleRecord:
    """The record of `name`, or a ValueError listing the names."""
    if name not in RECORDS:
        raise ValueError(f"unknown schedule {name!r}: choose one of {', '.join(RECORDS)}")
    return RECORDS[name]


def searchers() -> list[str]:
    """The names that build for costs under a memory limit, the pure searches first."""
    found = [r for r in RECORDS.values() if r.searches != "never"]
    return [r.name for r in sorted(found, key=lambda r: r.searches != "always")]


class _Names(Sequence[str]):
    """The registered names, in order: a view, so a record registered later is in it."""

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[str, ...]: ...
    def __getitem__(self, i: int | slice) -> str | tuple[str, ...]:
        return tuple(RECORDS)[i]

    def __len__(self) -> int:
        return len(RECORDS)

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(RECORDS))

    def __contains__(self, name: object) -> bool:
        return name in RECORDS

    def __eq__(self, other: object) -> bool:  # equal to the tuple of the same names
        return tuple(self) == (tuple(other) if isinstance(other, _Names) else other)

    __hash__ = None  # type: ignore[assignment]  # it changes, so it cannot be a dict key

    def __repr__(self) -> str:
        return repr(tuple(RECORDS))


SCHEDULES: Sequence[str] = _Names()


def torch_names() -> dict[str, str]:
    """torch class -> the name of zbkit's builder of the same schedule (the records' `torch`)."""
    return {cls: r.name for r in RECORDS.values() for cls in r.torch}
