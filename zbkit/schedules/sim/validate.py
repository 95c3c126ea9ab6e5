"""`validate(schedule)`: every action once, in an order that can run, without deadlock.

Each failure raises `ScheduleError` naming rank, position, stage and microbatch, with the
rank-by-step grid and the failing cells marked `<-- ERROR HERE`.

What each kind needs and which parts of the work (F, I, W) it does come from the `KINDS`
table; the checks run in one pass per rank, so a 24k-action schedule validates in a few
tens of milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence

from zbkit.schedules.core.action import KINDS, PARTS, Action, Overlap, Product, kinds_making
from zbkit.schedules.core.schedule import Schedule, ScheduleError, expect_schedule
from zbkit.schedules.sim import engine
from zbkit.schedules.sim.torch_checks import check_torch_ops

__all__ = ["validate"]

# each part of the work by the name of the kind that does only it: forward, input grad, ...
_PART_NAME = {p: next(k.name for k in KINDS.values() if k.parts == (p,)) for p in PARTS}


def _ways(s: object = "s", j: object = "j") -> str:
    """The ways to do a backward, from the table: 'sBj, or sIj then sWj'."""
    whole = [f"{s}{k.letter}{j}" for k in KINDS.values() if set(k.parts) == set(PARTS[1:])]
    split = " then ".join(f"{s}{p}{j}" for p in PARTS[1:])
    return ", or ".join([*whole, split])


class _Unit(dict):
    """Every action takes one time unit: only the order matters when looking for deadlock."""

    def __missing__(self, key: object) -> float:
        return 1.0


_UNIT = _Unit()


def _fail(schedule: Schedule, message: str, marks: list[tuple[int, int]]) -> ScheduleError:
    return ScheduleError(f"{message}\n{schedule.to_grid(marks)}")


def _where(a: Action | Overlap) -> str:
    if isinstance(a, Overlap):
        return f"the overlapped pair {a}"
    return f"{a} (stage {a.stage}, microbatch {a.microbatch})"


def validate(schedule: Schedule) -> None:
    """Raise `ScheduleError` if `schedule` misses, repeats or misorders an action or deadlocks
    (and, for a loaded torch compute_comms file, if a transfer or FSDP action is wrong)."""
    check_actions(schedule)
    check_torch_ops(schedule)
    try:
        engine.run(schedule, _UNIT, [0.0] * schedule.num_stages)
    except engine.Stuck as stuck:
        raise deadlock_error(schedule, stuck) from None


def check_actions(schedule: Schedule) -> None:
    """Everything `validate` checks but the deadlock (which needs a walk of the ranks: the
    simulator makes that walk anyway and reports a deadlock with `deadlock_error`)."""
    _check_shape(schedule)
    done = _check_actions(schedule)
    _check_complete(schedule, done)


def _check_shape(schedule: Schedule) -> None:
    expect_schedule(schedule, "validate")
    pp, placement = schedule.pp, schedule.stage_to_rank
    if schedule.microbatches < 1:
        raise ScheduleError(f"microbatches must be >= 1, got {schedule.microbatches}")
    if not placement or any(not isinstance(r, int) or r < 0 for r in placement):
        raise ScheduleError(f"stage_to_rank must list a rank >= 0 per stage, got {placement}")
    if sorted(schedule.program) != list(range(pp)):
        raise ScheduleError(
            f"program has ranks {sorted(schedule.program)} but stage_to_rank {placement} places "
            f"stages on {pp} ranks: give one program per rank 0..{pp - 1}"
        )
    n, m, total = len(placement), schedule.microbatches, len(schedule)
    if n * m > 4 * total + 1024:  # checking costs memory per (stage, microbatch): bound it
        raise ScheduleError(
            f"{n} stages x {m} microbatches need at least {2 * n * m:,} actions (a forward and a "
            f"backward each), but the schedule has {total:,}: check microbatches= and "
            "stage_to_rank="
        )
    empty = [r for r in range(pp) if r not in placement]
    if empty:
        raise ScheduleError(f"rank(s) {empty} hold no stage in stage_to_rank {placement}")


def _check_actions(schedule: Schedule) -> list[int]:
    """One pass per rank, asking the `KINDS` table; returns the position of the action that
    did each part of each (stage, microbatch): done[part * n*m + stage * m + mb], or -1.

    Each action must be new, on its stage's rank, do no part of the work (F, I, W) that an
    earlier action already did, and come after what it needs from its own stage. Keys are
    integers (index * n*m + stage * m + microbatch) so 24k actions check in tens of ms.
    """
    n, m = schedule.num_stages, schedule.microbatches
    nm, where = n * m, schedule.stage_to_rank
    letters, products, table = list(KINDS), list(Product), _kind_table(nm)
    seen = [-1] * (len(letters) * nm)  # action -> position
    done = [-1] * (len(PARTS) * nm)  # part of (stage, mb) -> position of who did it
    made = [False] * (len(products) * nm)

    def check(
        a: Action, item: Action | Overlap, rank: int, pos: int, program: Sequence[Action | Overlap]
    ) -> int:
        """Checks one action (or one half of an overlapped pair `item`); books what it did
        and returns the key of what it makes (-1: nothing), for the caller to mark made.
        Messages are built only on failure: 200k actions check in a fraction of a second."""
        s, j = a.stage, a.microbatch
        if s >= n or j >= m:
            raise _fail(
                schedule,
                f"rank {rank}, position {pos}: unknown action {_where(a)}: stages are "
                f"0..{n - 1} and microbatches 0..{m - 1}",
                [(rank, pos)],
            )
        if where[s] != rank:
            raise _fail(
                schedule,
                f"{_here(rank, pos, a)} runs on rank {rank}, but stage {s} lives on rank "
                f"{where[s]}; a stage cannot be on two ranks",
                [(rank, pos)],
            )
        base = s * m + j
        index, parts, local_needs, makes = table[a.kind]
        first = seen[index + base]
        if first >= 0:
            msg = f"{_here(rank, pos, a)} is repeated (first at position {first})"
            raise _fail(schedule, msg, [(rank, first), (rank, pos)])
        for p in parts:
            p2 = done[p + base]
            if p2 >= 0:  # same stage means same rank: p2 is a position on this rank
                raise _fail(
                    schedule,
                    f"{_here(rank, pos, a)} computes the {_PART_NAME[PARTS[p // nm]]} a second "
                    f"time ({program[p2]} at position {p2} did); each of {', '.join(PARTS)} "
                    f"runs once per stage and microbatch: {_ways()}",
                    [(rank, p2), (rank, pos)],
                )
        for q in local_needs:  # what it needs from its own stage: made earlier here
            if not made[q + base]:
                why = _missing(a, item, products[q // nm], program)
                raise _fail(schedule, f"{_here(rank, pos, a)} {why}", [(rank, pos)])
        for p in parts:
            done[p + base] = pos
        seen[index + base] = pos
        return makes + base if makes >= 0 else -1

    for rank in range(schedule.pp):
        program = schedule.program[rank]
        for pos, item in enumerate(program):
            if type(item) is Action:  # the common case first
                key = check(item, item, rank, pos, program)
                if key >= 0:
                    made[key] = True
                continue
            if not isinstance(item, Overlap):
                raise _fail(
                    schedule,
                    f"rank {rank}, position {pos}: {item!r} is not an Action (or Overlap)",
                    [(rank, pos)],
                )
            # a pair starts when both halves are ready: what one makes, the other cannot use
            keys = [check(a, item, rank, pos, program) for a in item.halves]
            for key in keys:
                if key >= 0:
                    made[key] = True
    return done


def _kind_table(nm: int) -> dict[str, tuple[int, tuple[int, ...], tuple[int, ...], int]]:
    """Per kind, from `KINDS`, each index times `nm` (a key less stage * m + microbatch):
    its own, its parts', what it needs from its own stage (products), what it makes (a
    product, or -1)."""
    letters, products = list(KINDS), list(Product)
    return {
        k: (
            letters.index(k) * nm,
            tuple(PARTS.index(p) * nm for p in kind.parts),
            tuple(products.index(p) * nm for p, d in kind.needs if d == 0),
            products.index(kind.makes) * nm if kind.makes is not None else -1,
        )
        for k, kind in KINDS.items()
    }


def _here(rank: int, pos: int, a: Action) -> str:
    return f"rank {rank}, position {pos}: {_where(a)}"


def _missing(
    a: Action, item: Action | Overlap, product: Product, program: Sequence[Action | Overlap]
) -> str:
    """Why `a` cannot run yet: what it needs from its own stage comes later, or never."""
    s, j = a.stage, a.microbatch
    options = [Action(s, k.letter, j) for k in kinds_making(product)]
    mine = [h for it in program for h in it.halves]
    later = next((o for o in options if o in mine), None)
    if later is not None and item is not a and later in item.halves:
        return (
            f"needs {later}, the other half of its overlapped pair {item}: both halves must "
            "be ready when the pair starts (torch refuses it too)"
        )
    if later is not None:
        return f"comes before its {later.info.name} {later}"
    return f"but {options[0]} is missing"


def _check_complete(schedule: Schedule, done: list[int]) -> None:
    """Every (stage, microbatch) does each part of the work: F, then I and W (or B)."""
    n, m = schedule.num_stages, schedule.microbatches
    nm = n * m
    if min(done) >= 0:
        return  # every part of every (stage, microbatch) was done: nothing to name
    for s in range(n):
        rank = schedule.stage_to_rank[s]
        program = schedule.program[rank]
        end = [(rank, len(program))]
        for j in range(m):
            at = {p: done[i * nm + s * m + j] for i, p in enumerate(PARTS)}
            missing = [p for p in PARTS if at[p] < 0]
            if not missing:
                continue
            if PARTS[0] in missing:
                msg = f"rank {rank}: missing {s}{PARTS[0]}{j} (stage {s}, microbatch {j})"
                raise _fail(schedule, msg, end)
            present = [at[p] for p in PARTS[1:] if at[p] >= 0]
            alternatives = " or ".join(
                f"{s}{k.letter}{j}" for k in KINDS.values() if set(k.parts) & set(missing)
            )
            if present:
                pos = present[0]
                raise _fail(
                    schedule,
                    f"rank {rank}, position {pos}: {_where(program[pos])} has no matching "
                    f"{alternatives}: the {_PART_NAME[missing[0]]} would never be computed",
                    [(rank, pos)],
                )
            raise _fail(
                schedule,
                f"rank {rank}: missing the backward of stage {s}, microbatch {j} ({_ways(s, j)})",
                end,
            )


def deadlock_error(schedule: Schedule, stuck: engine.Stuck) -> ScheduleError:
    seen = {
        a: (r, p)
        for r, prog in schedule.program.items()
        for p, it in enumerate(prog)
        for a in it.halves
    }
    lines = []
    for rank, (pos, a, (what, s, j)) in sorted(stuck.blocked.items()):
        # the action that would make what is awaited (F; or I or B), from the table
        makers = [Action(s, k.letter, j) for k in kinds_making(list(Product)[what])]
        producer = next((p for p in makers if p in seen), None)
        if producer is None:
            lines.append(f"  rank {rank}, position {pos}: {_where(a)} waits for stage {s} mb {j}")
        else:
            r2, p2 = seen[producer]
            lines.append(
                f"  rank {rank}, position {pos}: {_where(a)} waits for {producer} "
                f"(rank {r2}, position {p2})"
            )
    marks = [(r, pos) for r, (pos, _, _) in stuck.blocked.items()]
    return _fail(
        schedule,
        "deadlock: these actions wait on each other and no rank can move on:\n" + "\n".join(lines),
        marks,
    )
