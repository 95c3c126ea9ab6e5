"""`check_torch_ops(schedule)`: the checks `validate` runs on torch's transfers and FSDP
actions kept on a loaded schedule (what they must be: `zbkit.schedules.core.torch_ops`)."""

from __future__ import annotations

from zbkit.schedules.core.action import kinds_making
from zbkit.schedules.core.schedule import Schedule, ScheduleError
from zbkit.schedules.core.torch_ops import (
    SEND_RECV,
    TRANSFERS,
    TorchOp,
    TorchOpKind,
    derive_torch_ops,
)

__all__ = ["check_torch_ops"]


def check_torch_ops(schedule: Schedule) -> None:
    """Raise ScheduleError naming the first torch action that cannot be right (module doc)."""
    ops = schedule.torch_ops
    if not any(ops.values()):
        return
    where, n = schedule.stage_to_rank, schedule.num_stages
    at: dict[tuple, tuple[int, int]] = {}  # (stage, kind, mb) -> (rank, slot), compute and ops
    for rank, items in schedule.program.items():
        for pos, item in enumerate(items):
            for a in item.halves:
                at[a.stage, a.kind, a.microbatch] = (rank, pos)
    seen: dict[tuple, tuple[int, int]] = {}

    def fail(rank: int, op: TorchOp, why: str) -> ScheduleError:
        return ScheduleError(f"rank {rank}: {op} {why}")

    for rank, listed in sorted(ops.items()):
        for slot, op in listed:
            if not 0 <= op.stage < n or where[op.stage] != rank:
                home = f"rank {where[op.stage]}" if 0 <= op.stage < n else "no rank"
                raise fail(rank, op, f"is on rank {rank}, but stage {op.stage} lives on {home}")
            key = (op.stage, op.kind, op.microbatch)
            if key in seen:
                raise fail(rank, op, "is listed twice")
            seen[key] = (rank, slot)
    for (stage, kind, mb), (rank, slot) in seen.items():
        op = TorchOp(stage, kind, mb)
        if kind in TRANSFERS:
            _check_transfer(op, rank, slot, at, seen, where, n, fail)
    _check_all_listed(schedule, seen, fail)
    _check_fsdp(schedule, fail)


def _check_transfer(op, rank, slot, at, seen, where, n, fail) -> None:
    product, offset, partner = SEND_RECV[op.kind]
    compute = [k.letter for k in kinds_making(product)]
    other = op.stage + offset
    if not 0 <= other < n or where[other] == rank:
        raise fail(rank, op, f"has no other rank to talk to (stage {other} is not on another rank)")
    mine = next(
        (at[op.stage, k, op.microbatch] for k in compute if (op.stage, k, op.microbatch) in at),
        None,
    )
    name = f"{op.stage}{compute[0]}{op.microbatch}"
    if mine is None:
        raise fail(rank, op, f"serves {name}, which is not in the program")
    sending = op.kind in (TorchOpKind.SEND_F, TorchOpKind.SEND_B)
    if sending and slot <= mine[1]:
        raise fail(rank, op, f"comes before {name}, whose result it sends (step {mine[1]})")
    if not sending and slot > mine[1]:
        raise fail(rank, op, f"comes after {name}, which needs what it receives (step {mine[1]})")
    if (other, partner, op.microbatch) not in seen:
        raise fail(
            rank, op, f"has no matching {other}{partner}{op.microbatch} on rank {where[other]}"
        )


def _check_all_listed(schedule, seen, fail) -> None:
    """Once transfers are listed, every one the program needs is (torch moves only those)."""
    if not any(k[1] in TRANSFERS for k in seen):
        return
    for rank, items in derive_torch_ops(schedule.program, schedule.stage_to_rank).items():
        for _, op in items:
            if (op.stage, op.kind, op.microbatch) not in seen:
                raise fail(
                    rank, op, "is needed (a transfer between ranks) but missing from the row"
                )


def _check_fsdp(schedule, fail) -> None:
    for rank, items in schedule.program.items():
        ops = schedule.torch_ops.get(rank, [])
        fsdp = {
            op.stage
            for _, op in ops
            if op.kind is not TorchOpKind.REDUCE_GRAD and op.kind not in TRANSFERS
        }
        sharded = {s: True for s in fsdp}  # stages this rank unshards: sharded until UNSHARD
        by_slot: dict[int, list[TorchOp]] = {}
        for slot, op in ops:
            by_slot.setdefault(slot, []).append(op)
        last_weight: dict[int, int] = {}
        for pos, item in enumerate(items):
            for a in item.halves:
                if a.info.does_weight:
                    last_weight[a.stage] = pos
        for pos in range(len(items) + 1):
            for op in by_slot.get(pos, []):
                if op.kind is TorchOpKind.UNSHARD:
                    sharded[op.stage] = False
                elif op.kind is TorchOpKind.RESHARD:
                    sharded[op.stage] = True
                elif op.kind is TorchOpKind.REDUCE_GRAD and pos <= last_weight.get(op.stage, -1):
                    raise fail(
                        rank, op, f"comes before the last weight gradient of stage {op.stage}"
                    )
            if pos < len(items):
                for a in items[pos].halves:
                    if sharded.get(a.stage):
                        raise fail(
                            rank,
                            TorchOp(a.stage, TorchOpKind.UNSHARD),
                            f"is missing before {a}: stage {a.stage} is sharded there",
                        )
