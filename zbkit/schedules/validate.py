"""`validate(schedule)`: every action once, in an order that can run, without deadlock.

Each failure raises `ScheduleError` naming rank, position, stage and microbatch, with the
rank-by-step grid and the failing cells marked `<-- ERROR HERE`.
"""

from __future__ import annotations

from zbkit.schedules import _engine
from zbkit.schedules.action import Action
from zbkit.schedules.schedule import Schedule, ScheduleError

__all__ = ["validate"]


def _fail(schedule: Schedule, message: str, marks: list[tuple[int, int]]) -> ScheduleError:
    return ScheduleError(f"{message}\n{schedule.to_grid(marks)}")


def _where(a: Action) -> str:
    return f"{a} (stage {a.stage}, microbatch {a.microbatch})"


def validate(schedule: Schedule) -> None:
    """Raise `ScheduleError` if `schedule` misses, repeats or misorders an action or deadlocks."""
    _check_shape(schedule)
    seen = _check_actions(schedule)
    _check_complete(schedule, seen)
    try:
        _engine.run(schedule, lambda a: 1.0, lambda a: 0.0)
    except _engine.Stuck as stuck:
        raise _deadlock(schedule, stuck, seen) from None


def _check_shape(schedule: Schedule) -> None:
    pp, placement = schedule.pp, schedule.stage_to_rank
    if schedule.microbatches < 1:
        raise ScheduleError(f"microbatches must be >= 1, got {schedule.microbatches}")
    if not placement or any(not 0 <= r for r in placement):
        raise ScheduleError(f"stage_to_rank must list a rank >= 0 per stage, got {placement}")
    if sorted(schedule.program) != list(range(pp)):
        raise ScheduleError(
            f"program has ranks {sorted(schedule.program)} but stage_to_rank {placement} places "
            f"stages on {pp} ranks: give one program per rank 0..{pp - 1}"
        )
    empty = [r for r in range(pp) if r not in placement]
    if empty:
        raise ScheduleError(f"rank(s) {empty} hold no stage in stage_to_rank {placement}")


def _check_actions(schedule: Schedule) -> dict[Action, tuple[int, int]]:
    """Per-action checks; returns action -> (rank, position)."""
    seen: dict[Action, tuple[int, int]] = {}
    n, m = schedule.num_stages, schedule.microbatches
    for rank in range(schedule.pp):
        for pos, a in enumerate(schedule.program[rank]):
            here = [(rank, pos)]
            if not isinstance(a, Action):
                raise _fail(schedule, f"rank {rank}, position {pos}: {a!r} is not an Action", here)
            if a.stage >= n or a.microbatch >= m:
                raise _fail(
                    schedule,
                    f"rank {rank}, position {pos}: unknown action {_where(a)}: stages are "
                    f"0..{n - 1} and microbatches 0..{m - 1}",
                    here,
                )
            owner = schedule.stage_to_rank[a.stage]
            if owner != rank:
                raise _fail(
                    schedule,
                    f"rank {rank}, position {pos}: {_where(a)} runs on rank {rank}, but stage "
                    f"{a.stage} lives on rank {owner}; a stage cannot be on two ranks",
                    here,
                )
            if a in seen:
                first = seen[a]
                raise _fail(
                    schedule,
                    f"rank {rank}, position {pos}: {_where(a)} is repeated (first at position "
                    f"{first[1]})",
                    [first, (rank, pos)],
                )
            _check_order(schedule, seen, a, rank, pos)
            seen[a] = (rank, pos)
    return seen


def _check_order(schedule: Schedule, seen: dict, a: Action, rank: int, pos: int) -> None:
    s, j = a.stage, a.microbatch
    here = [(rank, pos)]
    if a.kind in "IB":
        other = Action(s, "B" if a.kind == "I" else "I", j)
        if other in seen:
            raise _fail(
                schedule,
                f"rank {rank}, position {pos}: {_where(a)} computes the backward a second time "
                f"({other} at position {seen[other][1]}); use B alone or I then W",
                [seen[other], (rank, pos)],
            )
        forward = Action(s, "F", j)
        if forward not in seen:
            later = forward in schedule.program[rank]
            problem = (
                f"comes before its forward {forward}" if later else f"but {forward} is missing"
            )
            raise _fail(schedule, f"rank {rank}, position {pos}: {_where(a)} {problem}", here)
    if a.kind == "W":
        if Action(s, "B", j) in seen:
            raise _fail(
                schedule,
                f"rank {rank}, position {pos}: {_where(a)} after the full backward {s}B{j} "
                "already computed the weight gradient",
                [seen[Action(s, "B", j)], (rank, pos)],
            )
        if Action(s, "I", j) not in seen:
            raise _fail(
                schedule,
                f"rank {rank}, position {pos}: {_where(a)} comes before its input-gradient "
                f"pass {s}I{j} (W needs what I leaves behind)",
                here,
            )


def _check_complete(schedule: Schedule, seen: dict[Action, tuple[int, int]]) -> None:
    for s in range(schedule.num_stages):
        rank = schedule.stage_to_rank[s]
        end = [(rank, len(schedule.program[rank]))]
        for j in range(schedule.microbatches):
            if Action(s, "F", j) not in seen:
                raise _fail(
                    schedule, f"rank {rank}: missing {s}F{j} (stage {s}, microbatch {j})", end
                )
            i, w = Action(s, "I", j), Action(s, "W", j)
            if i in seen and w not in seen:
                raise _fail(
                    schedule,
                    f"rank {rank}, position {seen[i][1]}: {_where(i)} has no matching {w}: the "
                    "weight gradient would never be computed",
                    [seen[i]],
                )
            if i not in seen and Action(s, "B", j) not in seen:
                raise _fail(
                    schedule,
                    f"rank {rank}: missing the backward of stage {s}, microbatch {j} "
                    f"({s}B{j}, or {s}I{j} then {s}W{j})",
                    end,
                )


def _deadlock(
    schedule: Schedule, stuck: _engine.Stuck, seen: dict[Action, tuple[int, int]]
) -> ScheduleError:
    lines = []
    for rank, (pos, a, (key, s, j)) in sorted(stuck.blocked.items()):
        # the action that would produce the awaited key: F, or the I/B of that (stage, mb)
        kinds = "F" if key == "F" else "IB"
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
