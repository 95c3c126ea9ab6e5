"""torch's non-compute actions, kept: SEND_F/RECV_F/SEND_B/RECV_B, UNSHARD, RESHARD, REDUCE_GRAD.

torch.distributed.pipelining lowers a compute program into a "compute_comms" one: each
rank's row also lists its point-to-point transfers (`1SEND_F3`: stage 1 sends the outputs
of microbatch 3's forward; `2RECV_F3`: stage 2 receives them) and FSDP's resharding
(`0UNSHARD`, `0RESHARD`, `0REDUCE_GRAD`). zbkit keeps them on a `Schedule` as `TorchOp`s
between its compute items (`Schedule.torch_ops[rank] = [(slot, op)]`, slot = how many
compute items come before it), so a loaded file writes back unchanged, and checks them
(`check_torch_ops`, run by `validate`):

- a SEND_F(s, j) follows F(s, j) on stage s's rank and has its RECV_F(s+1, j) on stage
  s+1's rank, which comes before F(s+1, j); likewise SEND_B(s, j) after the input gradient
  of (s, j) (I or B), its RECV_B(s-1, j) before that of (s-1, j); once each;
- once a file lists transfers, every transfer between ranks is listed (torch's runtime
  only moves what the row says: a missing one hangs);
- where a rank unshards or reshards stage s, every compute of s runs while it is
  unsharded; REDUCE_GRAD(s) comes once, after the last weight gradient (W or B) of s.

Timing: a transfer costs `Costs.comm` on the edge it serves, as for the transfers zbkit
derives itself (the simulator's model is unchanged by listing them); FSDP's actions are
modelled as taking no time (they are kept, checked and drawn, not timed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from zbkit.schedules.core.action import Product, kinds_making

__all__ = ["TorchOp", "TorchOpKind", "check_torch_ops", "derive_torch_ops", "parse_torch_op"]


class TorchOpKind(StrEnum):
    """The non-compute actions of torch's lowered programs, spelled as torch's CSV files do."""

    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    UNSHARD = "UNSHARD"
    RESHARD = "RESHARD"
    REDUCE_GRAD = "REDUCE_GRAD"


_TRANSFERS = {TorchOpKind.SEND_F, TorchOpKind.RECV_F, TorchOpKind.SEND_B, TorchOpKind.RECV_B}
_PATTERN = re.compile(r"^(\d+)(" + "|".join(k.value for k in TorchOpKind) + r")(\d*)$")


@dataclass(frozen=True, slots=True)
class TorchOp:
    """One non-compute action of torch's lowered form, e.g. `1SEND_F3` or `0UNSHARD`."""

    stage: int
    kind: TorchOpKind
    microbatch: int | None = None  # None for FSDP's per-stage actions

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{'' if self.microbatch is None else self.microbatch}"


def parse_torch_op(text: str) -> TorchOp | None:
    """`1SEND_F3` -> TorchOp(1, SEND_F, 3); None if `text` is not one of these actions.
    Raises ValueError for a transfer without a microbatch or an FSDP action with one."""
    match = _PATTERN.match(text.strip())
    if match is None:
        return None
    stage, kind, mb = match.groups()
    kind = TorchOpKind(kind)
    if (kind in _TRANSFERS) != bool(mb):
        form = "a microbatch, e.g. 1SEND_F3" if kind in _TRANSFERS else "no microbatch: 0UNSHARD"
        raise ValueError(f"{text.strip()!r}: {kind} takes {form}")
    return TorchOp(int(stage), kind, int(mb) if mb else None)


# transfer kind -> (what it carries, stage offset of its partner, partner); the compute it
# follows or precedes is whatever kind makes that product (the KINDS table: F; I or B)
_SEND_RECV = {
    TorchOpKind.SEND_F: (Product.ACT, +1, TorchOpKind.RECV_F),
    TorchOpKind.RECV_F: (Product.ACT, -1, TorchOpKind.SEND_F),
    TorchOpKind.SEND_B: (Product.GRAD, -1, TorchOpKind.RECV_B),
    TorchOpKind.RECV_B: (Product.GRAD, +1, TorchOpKind.SEND_B),
}


def derive_torch_ops(schedule) -> dict[int, list[tuple[int, TorchOp]]]:
    """The transfers of `derive_plan`, in torch's words and places: what torch's runtime
    needs to run this schedule in its compute_comms form (no FSDP actions)."""
    from zbkit.schedules.core.plan import Comm, CommOp, derive_plan

    out: dict[int, list[tuple[int, TorchOp]]] = {}
    for rank in range(schedule.pp):
        slot, ops = 0, []
        for step in derive_plan(schedule, rank):
            if not isinstance(step, Comm):
                slot += 1
                continue
            act = step.what is Product.ACT
            if step.op is CommOp.RECV:
                kind, stage = (TorchOpKind.RECV_F if act else TorchOpKind.RECV_B), step.stage
            else:  # torch names a send by the stage that produced it (`to` stages before)
                kind = TorchOpKind.SEND_F if act else TorchOpKind.SEND_B
                stage = step.stage - kinds_making(step.what)[0].to
            ops.append((slot, TorchOp(stage, kind, step.microbatch)))
        out[rank] = ops
    return out


def check_torch_ops(schedule) -> None:
    """Raise ScheduleError naming the first torch action that cannot be right (module doc)."""
    from zbkit.schedules.core.schedule import ScheduleError

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

    for rank, items in sorted(ops.items()):
        for slot, op in items:
            if not 0 <= op.stage < n or where[op.stage] != rank:
                home = f"rank {where[op.stage]}" if 0 <= op.stage < n else "no rank"
                raise fail(rank, op, f"is on rank {rank}, but stage {op.stage} lives on {home}")
            key = (op.stage, op.kind, op.microbatch)
            if key in seen:
                raise fail(rank, op, "is listed twice")
            seen[key] = (rank, slot)
    for (stage, kind, mb), (rank, slot) in seen.items():
        op = TorchOp(stage, kind, mb)
        if kind in _TRANSFERS:
            _check_transfer(op, rank, slot, at, seen, where, n, fail)
    _check_all_listed(schedule, seen, fail)
    _check_fsdp(schedule, fail)


def _check_transfer(op, rank, slot, at, seen, where, n, fail) -> None:
    product, offset, partner = _SEND_RECV[op.kind]
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
    if not any(k[1] in _TRANSFERS for k in seen):
        return
    for rank, items in derive_torch_ops(schedule).items():
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
            if op.kind is not TorchOpKind.REDUCE_GRAD and op.kind not in _TRANSFERS
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
