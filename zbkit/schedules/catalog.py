"""zbkit's named schedules, registered: one `ScheduleRecord` each, with its builder.

A record (`zbkit.schedules.core.registry`) holds every fact zbkit knows about a named
schedule: the builder, the options it takes with their defaults, where its stages live,
torch's class of the same schedule, the paper's closed forms and when they hold, whether it
searches, and one line saying what it is. A new schedule is one builder function and one
`register(ScheduleRecord(...))` here; its colour on the frontier is `zbkit.viz.frontier`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zbkit.schedules import formulas as f
from zbkit.schedules.core.placement import stage_to_rank
from zbkit.schedules.core.registry import (
    RECORDS,
    SCHEDULES,
    Formulas,
    ScheduleRecord,
    record,
    register,
    searchers,
)
from zbkit.schedules.core.schedule import Schedule
from zbkit.schedules.named import fixed, looped
from zbkit.schedules.named.dualpipe import dualpipe_v
from zbkit.schedules.named.v import v_schedule
from zbkit.schedules.search.auto import zb_auto
from zbkit.schedules.search.optimal import optimum

__all__ = [
    "RECORDS",
    "SCHEDULES",
    "Formulas",
    "ScheduleRecord",
    "record",
    "register",
    "searchers",
    "stage_to_rank",
]


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
    """The exact solver's schedule (`solve`): proven optimal, or the best it found in
    `time_limit` seconds."""
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
_V2 = {"stages_per_rank": 2}
for _record in (
    ScheduleRecord(
        "gpipe", _single(fixed.gpipe), "all forwards, then all backwards (GPipe)",
        torch=("ScheduleGPipe",),
        formulas=Formulas(f.one_f_one_b_bubble, f.gpipe_peak),
    ),
    ScheduleRecord(
        "1f1b", _single(fixed.one_f_one_b), "one forward, one backward (PipeDream-Flush)",
        torch=("Schedule1F1B",),
        formulas=Formulas(f.one_f_one_b_bubble, f.one_f_one_b_peak),
    ),
    ScheduleRecord(
        "interleaved-1f1b", _interleaved, "Megatron's 1F1B over v looped chunks a rank",
        placement="looped", options=_V2, torch=("ScheduleInterleaved1F1B",),
        formulas=Formulas(f.interleaved_bubble, f.interleaved_peak),
    ),
    ScheduleRecord(
        "zb-h1", _single(fixed.zb_h1),
        "1F1B's memory, the bubble cut to (p-1)(F+I-W) by delaying W",
        formulas=Formulas(f.zb_h1_bubble, f.one_f_one_b_peak, "W <= min(F, I) and m >= p"),
    ),
    ScheduleRecord(
        "zb-h2", _single(fixed.zb_h2), "zero bubble with more warm-up forwards (2p-1 held)",
        formulas=Formulas(f.zb_h2_bubble, f.zb_h2_peak, "m >= 2p (or F = I = W and m >= 2p-1)"),
    ),
    ScheduleRecord(
        "zb-v", _zb_v, "the paper's ZB-V; with costs or a memory limit, the fastest V found",
        placement="v", torch=("ScheduleZBVZeroBubble",),
        formulas=Formulas(f.zb_v_bubble, f.zb_v_peak, "F = I = W and m >= 2p"),
        searches="given",
    ),
    ScheduleRecord(
        "zb-auto", _zb_auto, "the fastest of named candidates for the costs, under a limit",
        options={"placement": "linear"}, searches="always",
        placements=("linear", "v"),
    ),
    ScheduleRecord(
        "zb-opt", _zb_opt, "the proven optimum for the costs under a limit (CP-SAT; small sizes)",
        options={"placement": "linear", "time_limit": 60.0}, searches="always",
        placements=("linear", "v"), largest=144,
    ),
    ScheduleRecord(
        "looped-bfs", _looped_bfs, "torch's looped BFS: every microbatch through a chunk first",
        placement="looped", options=_V2, torch=("ScheduleLoopedBFS",),
    ),
    ScheduleRecord(
        "interleaved-zb", _interleaved_zb, "torch's interleaved zero bubble over v chunks",
        placement="looped", options=_V2, torch=("ScheduleInterleavedZeroBubble",),
    ),
    ScheduleRecord(
        "v-half", _v_controllable, "a V holding half of 1F1B's activations (Qi et al. 2024)",
        placement="v",
    ),
    ScheduleRecord(
        "v-min", _v_controllable, "a V holding a third of 1F1B's activations (Qi et al. 2024)",
        placement="v",
    ),
    ScheduleRecord(
        "dualpipev", _dualpipe_v, "DeepSeek's DualPipeV: overlapped F+B pairs on the V",
        placement="v", torch=("ScheduleDualPipeV",),
    ),
):  # fmt: skip
    register(_record)
