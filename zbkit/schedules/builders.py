"""`build_schedule(name, pp=, microbatches=, **options)`: the named schedules.

What each name is (its builder, options, placement, ...) is its record in `catalog.py`; here
a name is built, its options checked against the record, and the result's counts checked.

Every builder refuses what it cannot build with a ValueError saying why, and ends with an
invariant check: per stage, m forwards and m backwards (B, or I and W), nothing else.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from zbkit.schedules.catalog import RECORDS, SCHEDULES, record, searchers
from zbkit.schedules.core.action import KINDS, PARTS
from zbkit.schedules.core.costs import Costs
from zbkit.schedules.core.schedule import Schedule
from zbkit.schedules.search.auto import PLACEMENTS, AutoSearch, search

__all__ = ["PLACEMENTS", "SCHEDULES", "AutoSearch", "build_schedule", "explain_auto"]


# building, validating and simulating take ~20 us an action in Python: a million is ~20 s
MAX_ACTIONS = 1_000_000


def _check(name: str, pp: int, microbatches: int) -> None:
    record(name)  # an unknown name: a ValueError listing the known ones
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
    """Build schedule `name` (one of `SCHEDULES`; its record in `catalog.RECORDS` says what
    it takes) for `pp` ranks and `microbatches`.

    Options: `stages_per_rank` (interleaved-1f1b, looped-bfs, interleaved-zb; default 2);
    `costs` (one `Costs`: a rank's share, split over its chunks; or one per stage),
    `memory_limit` (peak per rank in rank-microbatches x `Costs.mem_activation`, whatever the
    placement) and `placement` ("linear" or "v") for zb-auto, which searches (see
    `explain_auto`). zb-v without costs or a limit is the paper's hand-written ZB-V; with
    them, zb-auto's V search (default limit p, 1F1B's peak), never slower than the paper's
    ZB-V or the reference repo's V scheduler.
    """
    _check(name, pp, microbatches)
    found = RECORDS[name]
    if found.searches == "never" and (costs is not None or memory_limit is not None):
        raise ValueError(
            f"{name} takes no costs/memory_limit (its order is fixed; simulate it with "
            f"costs instead). {' and '.join(searchers())} build for costs under a limit"
        )
    for option in options:
        if option not in found.options:
            takes = ", ".join(found.options) or "no options"
            raise ValueError(f"{name}: bad option {option!r} ({name} takes {takes})")
    given = {**found.options, **options}  # the record's defaults, then what was given
    if found.largest is not None and _actions(found, pp, microbatches, options) > found.largest:
        actions = _actions(found, pp, microbatches, options)
        raise ValueError(
            f"{name}: {actions} actions (F, I, W per stage and microbatch) > {found.largest}, "
            f"the most it proves in about a minute; use zb-auto (explain_auto says how far "
            f"from optimal it can be) or zbkit.schedules.solve(..., time_limit=...)"
        )
    if found.searches != "never":
        given.update(costs=costs, memory_limit=memory_limit)
    schedule = found.build(pp, microbatches, name, **given)
    check_counts(schedule)
    return schedule


def _actions(found, pp: int, m: int, options: dict) -> int:
    """F, I and W per stage and microbatch; 0 for a placement it refuses (its builder says)."""
    try:
        return 3 * len(found.stage_to_rank(pp, **options)) * m
    except ValueError:
        return 0


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
