"""`build_schedule(name, pp=, microbatches=, **options)`: the named schedules.

Every builder refuses what it cannot build with a ValueError saying why, and ends with an
invariant check: per stage, m forwards and m backwards (B, or I and W), nothing else.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from zbkit.schedules import _build_fixed as fixed
from zbkit.schedules import _build_looped as looped
from zbkit.schedules._auto import PLACEMENTS, AutoSearch, search, zb_auto
from zbkit.schedules._build_dualpipe import dualpipe_v
from zbkit.schedules._build_v import v_schedule
from zbkit.schedules.action import KINDS, PARTS
from zbkit.schedules.costs import Costs
from zbkit.schedules.schedule import Schedule

__all__ = ["PLACEMENTS", "SCHEDULES", "AutoSearch", "build_schedule", "explain_auto"]

SCHEDULES = (
    "gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "zb-auto",
    "looped-bfs", "interleaved-zb", "v-half", "v-min", "dualpipev",
)  # fmt: skip


def _single(fn: Callable[[int, int], dict]) -> Callable[..., Schedule]:
    def build(pp: int, m: int, name: str) -> Schedule:
        return Schedule(fn(pp, m), list(range(pp)), m, name)

    return build


def _interleaved(pp: int, m: int, name: str, stages_per_rank: int = 2) -> Schedule:
    v = stages_per_rank
    if not isinstance(v, int) or v < 1:
        raise ValueError(f"interleaved-1f1b: stages_per_rank must be an int >= 1, got {v!r}")
    if m % pp:
        raise ValueError(
            f"interleaved-1f1b: microbatches={m} must be a multiple of pp={pp} (Megatron's "
            f"interleaved 1F1B sends microbatches in groups of pp); try {m + (-m) % pp}"
        )
    return Schedule(fixed.interleaved_1f1b(pp, m, v), [s % pp for s in range(v * pp)], m, name)


def _stages_per_rank(name: str, v) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{name}: stages_per_rank must be an int >= 1, got {v!r}")
    return v


def _looped_bfs(pp: int, m: int, name: str, stages_per_rank: int = 2) -> Schedule:
    v = _stages_per_rank(name, stages_per_rank)
    return Schedule(looped.looped_bfs(pp, m, v), [s % pp for s in range(v * pp)], m, name)


def _interleaved_zb(pp: int, m: int, name: str, stages_per_rank: int = 2) -> Schedule:
    v = _stages_per_rank(name, stages_per_rank)
    rounds, _ = looped.rounds_of(pp, m)
    if m % rounds:
        fits = [k for k in range(m - 1, 0, -1) if k % max(1, k // pp) == 0][0]
        raise ValueError(
            f"{name}: microbatches={m} must be a multiple of the number of rounds "
            f"max(1, m // pp) = {rounds} (torch's ScheduleInterleavedZeroBubble sends "
            f"microbatches in equal rounds); try {fits}"
        )
    return Schedule(looped.interleaved_zb(pp, m, v), [s % pp for s in range(v * pp)], m, name)


def _v_placement(pp: int) -> list[int]:
    # stage s and stage 2p-1-s on rank s: down the ranks and back up, a V
    return [s if s < pp else 2 * pp - 1 - s for s in range(2 * pp)]


def _zb_v(pp: int, m: int, name: str, costs=None, memory_limit=None) -> Schedule:
    """The paper's hand-written ZB-V; for given costs or a limit, the fastest V schedule
    for them (zb-auto's V search, whose candidates include the paper's ZB-V and the
    reference repo's V scheduler, so it is never slower than either)."""
    if costs is None and memory_limit is None:
        return Schedule(fixed.zb_v(pp, m), _v_placement(pp), m, name)
    return zb_auto(pp, m, name, costs, memory_limit, placement="v")


def _dualpipe_v(pp: int, m: int, name: str) -> Schedule:
    # torch's ScheduleDualPipeV: overlapped F+B pairs on ZB-V's placement
    return Schedule(dualpipe_v(pp, m), _v_placement(pp), m, name)


def _v_controllable(pp: int, m: int, name: str) -> Schedule:
    # V-Half / V-Min (Qi et al. 2024): ZB-V's placement, 1/2 or 1/3 of 1F1B's memory
    return Schedule(v_schedule(pp, m, name), _v_placement(pp), m, name)


_BUILDERS: dict[str, Callable[..., Schedule]] = {
    "gpipe": _single(fixed.gpipe),
    "1f1b": _single(fixed.one_f_one_b),
    "interleaved-1f1b": _interleaved,
    "zb-h1": _single(fixed.zb_h1),
    "zb-h2": _single(fixed.zb_h2),
    "zb-v": _zb_v,
    "zb-auto": zb_auto,
    "looped-bfs": _looped_bfs,
    "interleaved-zb": _interleaved_zb,
    "v-half": _v_controllable,
    "v-min": _v_controllable,
    "dualpipev": _dualpipe_v,
}
# the options each builder takes (beyond pp and microbatches)
_OPTIONS = {
    "interleaved-1f1b": ("stages_per_rank",),
    "zb-auto": ("placement",),
    "looped-bfs": ("stages_per_rank",),
    "interleaved-zb": ("stages_per_rank",),
}
_SEARCHES = ("zb-auto", "zb-v")  # the builders that take costs and memory_limit


# building, validating and simulating take ~20 us an action in Python: a million is ~20 s
MAX_ACTIONS = 1_000_000


def _check(name: str, pp: int, microbatches: int) -> None:
    if name not in _BUILDERS:
        raise ValueError(f"unknown schedule {name!r}: choose one of {', '.join(SCHEDULES)}")
    for label, value in (("pp", pp), ("microbatches", microbatches)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}: {label} must be an int >= 1, got {value!r}")
    actions = 3 * pp * microbatches  # F, I, W per stage and microbatch (x2 for two-chunk ones)
    if actions > MAX_ACTIONS:
        raise ValueError(
            f"{name}: pp={pp} x microbatches={microbatches} is at least {actions:,} actions, "
            f"more than the {MAX_ACTIONS:,} zbkit builds, checks and simulates in about "
            "20 s; use fewer ranks or microbatches"
        )


def build_schedule(
    name: str,
    *,
    pp: int,
    microbatches: int,
    costs: Costs | Sequence[Costs] | None = None,
    memory_limit: float | None = None,
    **options,
) -> Schedule:
    """Build schedule `name` (one of `SCHEDULES`) for `pp` ranks and `microbatches`.

    Options: `stages_per_rank` (interleaved-1f1b, looped-bfs, interleaved-zb; default 2);
    `costs` (one `Costs`: a rank's share, split over its chunks; or one per stage),
    `memory_limit` (peak per rank in rank-microbatches x `Costs.mem_activation`, whatever the
    placement) and `placement` ("linear" or "v") for zb-auto, which searches (see
    `explain_auto`). zb-v without costs or a limit is the paper's hand-written ZB-V; with
    them, zb-auto's V search (default limit p, 1F1B's peak), never slower than the paper's
    ZB-V or the reference repo's V scheduler.
    """
    _check(name, pp, microbatches)
    if name in _SEARCHES:
        options.update(costs=costs, memory_limit=memory_limit)
    elif costs is not None or memory_limit is not None:
        raise ValueError(
            f"{name} takes no costs/memory_limit (its order is fixed; simulate it with "
            "costs instead). zb-auto and zb-v build for costs under a limit"
        )
    allowed = _OPTIONS.get(name, ())
    for option in options:
        if option not in allowed and option not in ("costs", "memory_limit"):
            takes = ", ".join(allowed) or "no options"
            raise ValueError(f"{name}: bad option {option!r} ({name} takes {takes})")
    schedule = _BUILDERS[name](pp, microbatches, name, **options)
    check_counts(schedule)
    return schedule


def explain_auto(
    *,
    pp: int,
    microbatches: int,
    costs: Costs | Sequence[Costs] | None = None,
    memory_limit: float | None = None,
    placement: str = "linear",
) -> AutoSearch:
    """zb-auto's search, shown: the schedule it builds, the candidate that won, and every
    candidate's score (longest rank span, peak memory) or why it was left out.

    `print(explain_auto(pp=4, microbatches=8, placement="v"))` lists them by name, and
    `AutoSearch.tried[i].candidate.reason` says why each is in the list.
    """
    _check("zb-auto", pp, microbatches)
    found = search(pp, microbatches, "zb-auto", costs, memory_limit, placement)
    check_counts(found.schedule)
    return found


def check_counts(schedule: Schedule) -> None:
    """Builder invariant: on its own rank, each stage does every part of the work (F, I, W)
    m times: m F, and m B or m I and m W (the parts each kind does come from `KINDS`)."""
    m, where = schedule.microbatches, schedule.stage_to_rank
    kinds: Counter = Counter()  # (stage, kind) -> actions (counted in C: 100k stay cheap)
    for rank in schedule.program:
        prog = schedule.actions(rank)  # an overlapped pair's halves one by one
        wrong = next((a for a in prog if where[a.stage] != rank), None)
        if wrong is not None:
            raise AssertionError(
                f"{schedule.name}: builder bug: {wrong} on rank {rank}, but stage "
                f"{wrong.stage} lives on rank {where[wrong.stage]}"
            )
        kinds.update((a.stage, a.kind) for a in prog)
    counts: Counter = Counter()  # (stage, part) -> times done
    for (stage, kind), n in kinds.items():
        for part in KINDS[kind].parts:
            counts[stage, part] += n
    for s, rank in enumerate(where):
        got = {part: counts[s, part] for part in PARTS}
        if any(n != m for n in got.values()):
            mine = {k: n for (st, k), n in kinds.items() if st == s}
            raise AssertionError(
                f"{schedule.name}: builder bug: stage {s} on rank {rank} does the parts "
                f"{got} (actions {mine}), expected each of {', '.join(PARTS)} {m} times"
            )
