"""One record per schedule: every fact zbkit knows about a named schedule, in one place.

`RECORDS` maps each name to its `ScheduleRecord`: the builder, the options it takes with their
defaults, where its stages live (`stage_to_rank`), torch's class of the same schedule, the
paper's closed forms and when they hold, its colour and marker on the frontier, whether it
searches, and one line saying what it is. `build_schedule`, `SCHEDULES`, `from_torch`, the
formulas, `plot_frontier`, the `zbkit schedule` command, the ScheduleExplorer and the demo
all read it, so a new schedule is one builder function and one `register(ScheduleRecord(...))`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, overload

from zbkit.schedules.named import fixed as fixed
from zbkit.schedules.named import looped as looped
from zbkit.schedules import formulas as f
from zbkit.schedules.named.dualpipe import dualpipe_v
from zbkit.schedules.named.v import v_schedule
from zbkit.schedules.core.placement import stage_to_rank
from zbkit.schedules.core.schedule import Schedule

__all__ = [
    "RECORDS",
    "SCHEDULES",
    "Formulas",
    "ScheduleRecord",
    "Style",
    "record",
    "register",
    "searchers",
    "stage_to_rank",
]


class Style(NamedTuple):
    colour: str  # a matplotlib colour
    marker: str  # a matplotlib marker


class Formulas(NamedTuple):
    """The paper's closed forms; each `(pp, m, v, costs) -> (text, value)`, or None where
    its assumptions fail (`conditions` says which, for the user)."""

    bubble: Callable[[int, int, int, Any], f.Bubble | None]
    peak: Callable[[int, int, int, Any], f.Peak | None] | None = None
    conditions: str = ""  # e.g. "W <= min(F, I) and m >= p"; "" where they always hold


@dataclass(frozen=True, eq=False)
class ScheduleRecord:
    """Everything zbkit knows about one named schedule."""

    name: str  # what `build_schedule(name, ...)` and the CLI take
    build: Callable[..., Schedule]  # (pp, m, name, **options) -> Schedule; refuses with why
    about: str  # one line for listings and --help
    placement: str = "linear"  # "linear", "looped" or "v" (`stage_to_rank`)
    options: Mapping[str, Any] = field(default_factory=dict)  # option -> default
    torch: tuple[str, ...] = ()  # torch.distributed.pipelining classes of the same schedule
    formulas: Formulas | None = None  # the paper's closed forms (None: it has none)
    style: Style | None = None  # its point on the frontier (None: a colour by its position)
    # "never"; "given": costs or a memory_limit make it search (else its fixed construction);
    # "always": it is a search, drawn as one frontier curve per placement in `curves`
    searches: str = "never"
    curves: Mapping[str, Style] = field(default_factory=dict)  # placement -> its curve
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
    """Add a schedule (`del RECORDS[name]` takes it away). Its name, torch classes and
    frontier styles must be new; `searches` one of "never", "given", "always"."""
    if new.name in RECORDS:
        raise ValueError(f"a schedule named {new.name!r} is already registered")
    if new.searches not in ("never", "given", "always"):
        raise ValueError(f"{new.name}: searches must be never/given/always, got {new.searches!r}")
    taken = {c: r.name for r in RECORDS.values() for c in r.torch}
    styles = {s: r.name for r in RECORDS.values() for s in (r.style, *r.curves.values()) if s}
    for cls in new.torch:
        if cls in taken:
            raise ValueError(f"{new.name}: torch's {cls} is already {taken[cls]!r}")
    for style in (new.style, *new.curves.values()):
        if style in styles:
            raise ValueError(f"{new.name}: frontier style {style} is already {styles[style]!r}")
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


# ---- the builders: `(pp, m, name, **options) -> Schedule`, refusing with a reason ---------
def _single(fn: Callable[[int, int], dict]) -> Callable[..., Schedule]:
    def build(pp: int, m: int, name: str) -> Schedule:
        return Schedule(fn(pp, m), stage_to_rank("linear", pp), m, name)

    return build


def _spr(name: str, v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{name}: stages_per_rank must be an int >= 1, got {v!r}")
    return v


def _interleaved(pp: int, m: int, name: str, stages_per_rank: int) -> Schedule:
    v = stages_per_rank
    if not isinstance(v, int) or v < 1:
        raise ValueError(f"interleaved-1f1b: stages_per_rank must be an int >= 1, got {v!r}")
    if m % pp:
        raise ValueError(
            f"interleaved-1f1b: microbatches={m} must be a multiple of pp={pp} (Megatron's "
            f"interleaved 1F1B sends microbatches in groups of pp); try {m + (-m) % pp}"
        )
    return Schedule(fixed.interleaved_1f1b(pp, m, v), stage_to_rank("looped", pp, v), m, name)


def _looped_bfs(pp: int, m: int, name: str, stages_per_rank: int) -> Schedule:
    v = _spr(name, stages_per_rank)
    return Schedule(looped.looped_bfs(pp, m, v), stage_to_rank("looped", pp, v), m, name)


def _interleaved_zb(pp: int, m: int, name: str, stages_per_rank: int) -> Schedule:
    v = _spr(name, stages_per_rank)
    rounds, _ = looped.rounds_of(pp, m)
    if m % rounds:
        fits = [k for k in range(m - 1, 0, -1) if k % max(1, k // pp) == 0][0]
        raise ValueError(
            f"{name}: microbatches={m} must be a multiple of the number of rounds "
            f"max(1, m // pp) = {rounds} (torch's ScheduleInterleavedZeroBubble sends "
            f"microbatches in equal rounds); try {fits}"
        )
    return Schedule(looped.interleaved_zb(pp, m, v), stage_to_rank("looped", pp, v), m, name)


def _zb_auto(
    pp: int,
    m: int,
    name: str,
    costs: Any = None,
    memory_limit: Any = None,
    placement: str = "linear",
) -> Schedule:
    """The fastest of zb-auto's candidates for `placement` under the limit (`auto.search`)."""
    # imported here, not above: the search's own modules may then read this one
    # (`stage_to_rank`) without an import cycle
    from zbkit.schedules.search.auto import zb_auto

    return zb_auto(pp, m, name, costs, memory_limit, placement)


def _zb_opt(
    pp: int,
    m: int,
    name: str,
    costs: Any = None,
    memory_limit: Any = None,
    placement: str = "linear",
    time_limit: float = 60.0,
) -> Schedule:
    """The exact solver's schedule (`exact.solve`): proven optimal, or the best it found in
    `time_limit` seconds."""
    from zbkit.schedules.optimum.exact import optimum

    return optimum(pp, m, name, costs, memory_limit, placement, time_limit)


def _zb_v(pp: int, m: int, name: str, costs: Any = None, memory_limit: Any = None) -> Schedule:
    """The paper's hand-written ZB-V; for given costs or a limit, the fastest V schedule
    for them (zb-auto's V search, whose candidates include the paper's ZB-V and the
    reference repo's V scheduler, so it is never slower than either)."""
    if costs is None and memory_limit is None:
        return Schedule(fixed.zb_v(pp, m), stage_to_rank("v", pp), m, name)
    return _zb_auto(pp, m, name, costs, memory_limit, placement="v")


def _dualpipe_v(pp: int, m: int, name: str) -> Schedule:
    # torch's ScheduleDualPipeV: overlapped F+B pairs on ZB-V's placement
    return Schedule(dualpipe_v(pp, m), stage_to_rank("v", pp), m, name)


def _v_controllable(pp: int, m: int, name: str) -> Schedule:
    # V-Half / V-Min (Qi et al. 2024): ZB-V's placement, 1/2 or 1/3 of 1F1B's memory
    return Schedule(v_schedule(pp, m, name), stage_to_rank("v", pp), m, name)


# ---- the records, in SCHEDULES' order ------------------------------------------------------
# frontier colours: 1F1B's family blue, ZB-H green, V red, zb-auto's curves apart
_V2 = {"stages_per_rank": 2}
for _record in (
    ScheduleRecord(
        "gpipe", _single(fixed.gpipe), "all forwards, then all backwards (GPipe)",
        torch=("ScheduleGPipe",), style=Style("#7f7f7f", "o"),
        formulas=Formulas(f.one_f_one_b_bubble, f.gpipe_peak),
    ),
    ScheduleRecord(
        "1f1b", _single(fixed.one_f_one_b), "one forward, one backward (PipeDream-Flush)",
        torch=("Schedule1F1B",), style=Style("#1f77b4", "s"),
        formulas=Formulas(f.one_f_one_b_bubble, f.one_f_one_b_peak),
    ),
    ScheduleRecord(
        "interleaved-1f1b", _interleaved, "Megatron's 1F1B over v looped chunks a rank",
        placement="looped", options=_V2, torch=("ScheduleInterleaved1F1B",),
        style=Style("#17becf", "D"), formulas=Formulas(f.interleaved_bubble, f.interleaved_peak),
    ),
    ScheduleRecord(
        "zb-h1", _single(fixed.zb_h1),
        "1F1B's memory, the bubble cut to (p-1)(F+I-W) by delaying W", style=Style("#2ca02c", "^"),
        formulas=Formulas(f.zb_h1_bubble, f.one_f_one_b_peak, "W <= min(F, I) and m >= p"),
    ),
    ScheduleRecord(
        "zb-h2", _single(fixed.zb_h2), "zero bubble with more warm-up forwards (2p-1 held)",
        style=Style("#98c379", "v"),
        formulas=Formulas(f.zb_h2_bubble, f.zb_h2_peak, "m >= 2p (or F = I = W and m >= 2p-1)"),
    ),
    ScheduleRecord(
        "zb-v", _zb_v, "the paper's ZB-V; with costs or a memory limit, the fastest V found",
        placement="v", torch=("ScheduleZBVZeroBubble",), style=Style("#d62728", "<"),
        formulas=Formulas(f.zb_v_bubble, f.zb_v_peak, "F = I = W and m >= 2p"),
        searches="given",
    ),
    ScheduleRecord(
        "zb-auto", _zb_auto, "the fastest of named candidates for the costs, under a limit",
        options={"placement": "linear"}, searches="always",
        curves={"linear": Style("#ff7f0e", ">"), "v": Style("#9467bd", "p")},
    ),
    ScheduleRecord(
        "zb-opt", _zb_opt, "the proven optimum for the costs under a limit (CP-SAT; small sizes)",
        options={"placement": "linear", "time_limit": 60.0}, searches="always",
        curves={"linear": Style("#000000", "*"), "v": Style("#000000", "X")}, largest=144,
    ),
    ScheduleRecord(
        "looped-bfs", _looped_bfs, "torch's looped BFS: every microbatch through a chunk first",
        placement="looped", options=_V2, torch=("ScheduleLoopedBFS",), style=Style("#8c564b", "h"),
    ),
    ScheduleRecord(
        "interleaved-zb", _interleaved_zb, "torch's interleaved zero bubble over v chunks",
        placement="looped", options=_V2, torch=("ScheduleInterleavedZeroBubble",),
        style=Style("#bcbd22", "X"),
    ),
    ScheduleRecord(
        "v-half", _v_controllable, "a V holding half of 1F1B's activations (Qi et al. 2024)",
        placement="v", style=Style("#e377c2", "*"),
    ),
    ScheduleRecord(
        "v-min", _v_controllable, "a V holding a third of 1F1B's activations (Qi et al. 2024)",
        placement="v", style=Style("#9e1f63", "P"),
    ),
    ScheduleRecord(  # not zb-auto's orange: it sits next to that curve
        "dualpipev", _dualpipe_v, "DeepSeek's DualPipeV: overlapped F+B pairs on the V",
        placement="v", torch=("ScheduleDualPipeV",), style=Style("#2c3e50", "d"),
    ),
):  # fmt: skip
    register(_record)
