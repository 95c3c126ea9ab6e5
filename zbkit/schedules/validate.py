"""`validate(schedule)`: every action once, in an order that can run, without deadlock.

Each failure raises `ScheduleError` naming rank, position, stage and microbatch, with the
rank-by-step grid and the failing cells marked `<-- ERROR HERE`.

The checks run in one pass per rank over integer keys (kind, stage, microbatch) ->
position, so a 24k-action schedule validates in a few tens of milliseconds.
"""

from __future__ import annotations

from zbkit.schedules import _engine
from zbkit.schedules.action import Action
from zbkit.schedules.schedule import Schedule, ScheduleError

__all__ = ["validate"]

_CODE = {"F": 0, "I": 1, "W": 2, "B": 3}


class _Unit(dict):
    """Every action takes one time unit: only the order matters when looking for deadlock."""

    def __missing__(self, key: object) -> float:
        return 1.0


_UNIT = _Unit()


def _fail(schedule: Schedule, message: str, marks: list[tuple[int, int]]) -> ScheduleError:
    return ScheduleError(f"{message}\n{schedule.to_grid(marks)}")


def _where(a: Action) -> str:
    return f"{a} (stage {a.stage}, microbatch {a.microbatch})"


def validate(schedule: Schedule) -> None:
    """Raise `ScheduleError` if `schedule` misses, repeats or misorders an action or deadlocks."""
    _check_shape(schedule)
    at = _check_actions(schedule)
    _check_complete(schedule, at)
    try:
        _engine.run(schedule, _UNIT, [0.0] * schedule.num_stages)
    except _engine.Stuck as stuck:
        raise _deadlock(schedule, stuck) from None


def _check_shape(schedule: Schedule) -> None:
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
    empty = [r for r in range(pp) if r not in placement]
    if empty:
        raise ScheduleError(f"rank(s) {empty} hold no stage in stage_to_rank {placement}")


def _check_actions(schedule: Schedule) -> list[int]:
    """One pass per rank; returns at[key] = position of the action (-1 if absent)."""
    n, m = schedule.num_stages, schedule.microbatches
    nm, where = n * m, schedule.stage_to_rank
    at = [-1] * (4 * nm)  # key = code * n*m + stage * m + microbatch
    for rank in range(schedule.pp):
        for pos, a in enumerate(schedule.program[rank]):
            if not isinstance(a, Action):
                raise _fail(
                    schedule, f"rank {rank}, position {pos}: {a!r} is not an Action", [(rank, pos)]
                )
            s, k, j = a.stage, a.kind, a.microbatch
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
                    f"rank {rank}, position {pos}: {_where(a)} runs on rank {rank}, but stage "
                    f"{s} lives on rank {where[s]}; a stage cannot be on two ranks",
                    [(rank, pos)],
                )
            base = s * m + j
            key = _CODE[k] * nm + base
            if at[key] >= 0:
                raise _fail(
                    schedule,
                    f"rank {rank}, position {pos}: {_where(a)} is repeated (first at position "
                    f"{at[key]})",
                    [(rank, at[key]), (rank, pos)],
                )
            # same stage means same rank, so "seen" below means "earlier on this rank"
            if k == "I" or k == "B":
                other = (3 if k == "I" else 1) * nm + base
                if at[other] >= 0:
                    raise _fail(
                        schedule,
                        f"rank {rank}, position {pos}: {_where(a)} computes the backward a second "
                        f"time ({s}{'B' if k == 'I' else 'I'}{j} at position {at[other]}); use B "
                        "alone or I then W",
                        [(rank, at[other]), (rank, pos)],
                    )
                if at[base] < 0:
                    forward = Action(s, "F", j)
                    later = forward in schedule.program[rank]
                    problem = (
                        f"comes before its forward {forward}"
                        if later
                        else f"but {forward} is missing"
                    )
                    raise _fail(
                        schedule,
                        f"rank {rank}, position {pos}: {_where(a)} {problem}",
                        [(rank, pos)],
                    )
            elif k == "W":
                if at[3 * nm + base] >= 0:
                    raise _fail(
                        schedule,
                        f"rank {rank}, position {pos}: {_where(a)} after the full backward {s}B{j} "
                        "already computed the weight gradient",
                        [(rank, at[3 * nm + base]), (rank, pos)],
                    )
                if at[nm + base] < 0:
                    raise _fail(
                        schedule,
                        f"rank {rank}, position {pos}: {_where(a)} comes before its input-gradient "
                        f"pass {s}I{j} (W needs what I leaves behind)",
                        [(rank, pos)],
                    )
            at[key] = pos
    return at


def _check_complete(schedule: Schedule, at: list[int]) -> None:
    n, m = schedule.num_stages, schedule.microbatches
    nm = n * m
    for s in range(n):
        rank = schedule.stage_to_rank[s]
        end = [(rank, len(schedule.program[rank]))]
        for j in range(m):
            base = s * m + j
            if at[base] < 0:
                msg = f"rank {rank}: missing {s}F{j} (stage {s}, microbatch {j})"
                raise _fail(schedule, msg, end)
            i_pos = at[nm + base]
            if i_pos >= 0 and at[2 * nm + base] < 0:
                raise _fail(
                    schedule,
                    f"rank {rank}, position {i_pos}: {s}I{j} (stage {s}, microbatch {j}) has no "
                    f"matching {s}W{j}: the weight gradient would never be computed",
                    [(rank, i_pos)],
                )
            if i_pos < 0 and at[3 * nm + base] < 0:
                raise _fail(
                    schedule,
                    f"rank {rank}: missing the backward of stage {s}, microbatch {j} "
                    f"({s}B{j}, or {s}I{j} then {s}W{j})",
                    end,
                )


def _deadlock(schedule: Schedule, stuck: _engine.Stuck) -> ScheduleError:
    seen = {a: (r, p) for r, prog in schedule.program.items() for p, a in enumerate(prog)}
    lines = []
    for rank, (pos, a, (what, s, j)) in sorted(stuck.blocked.items()):
        # the action that would produce what is awaited: F, or the I/B of that (stage, mb)
        kinds = "F" if what == 0 else "IB"
        producer = next((Action(s, k, j) for k in kinds if Action(s, k, j) in seen), None)
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
