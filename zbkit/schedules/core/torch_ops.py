"""torch's non-compute actions, kept: SEND_F/RECV_F/SEND_B/RECV_B, UNSHARD, RESHARD, REDUCE_GRAD.

torch.distributed.pipelining lowers a compute program into a "compute_comms" one: each
rank's row also lists its point-to-point transfers (`1SEND_F3`: stage 1 sends the outputs
of microbatch 3's forward; `2RECV_F3`: stage 2 receives them) and FSDP's resharding
(`0UNSHARD`, `0RESHARD`, `0REDUCE_GRAD`). zbkit keeps them on a `Schedule` as `TorchOp`s
between its compute items (`Schedule.torch_ops[rank] = [(slot, op)]`, slot = how many
compute items come before it), so a loaded file writes back unchanged, and checks them
(`zbkit.schedules.sim.torch_checks`, run by `validate`):

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from zbkit.schedules.core.action import Action, Overlap, Product, kinds_making
from zbkit.schedules.core.plan import Comm, CommOp, plan_of

__all__ = ["TorchOp", "TorchOpKind", "derive_torch_ops", "parse_torch_op"]


class TorchOpKind(StrEnum):
    """The non-compute actions of torch's lowered programs, spelled as torch's CSV files do."""

    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    UNSHARD = "UNSHARD"
    RESHARD = "RESHARD"
    REDUCE_GRAD = "REDUCE_GRAD"


TRANSFERS = {TorchOpKind.SEND_F, TorchOpKind.RECV_F, TorchOpKind.SEND_B, TorchOpKind.RECV_B}
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
    if (kind in TRANSFERS) != bool(mb):
        form = "a microbatch, e.g. 1SEND_F3" if kind in TRANSFERS else "no microbatch: 0UNSHARD"
        raise ValueError(f"{text.strip()!r}: {kind} takes {form}")
    return TorchOp(int(stage), kind, int(mb) if mb else None)


# transfer kind -> (what it carries, stage offset of its partner, partner); the compute it
# follows or precedes is whatever kind makes that product (the KINDS table: F; I or B)
SEND_RECV = {
    TorchOpKind.SEND_F: (Product.ACT, +1, TorchOpKind.RECV_F),
    TorchOpKind.RECV_F: (Product.ACT, -1, TorchOpKind.SEND_F),
    TorchOpKind.SEND_B: (Product.GRAD, -1, TorchOpKind.RECV_B),
    TorchOpKind.RECV_B: (Product.GRAD, +1, TorchOpKind.SEND_B),
}


def derive_torch_ops(
    program: Mapping[int, Sequence[Action | Overlap]], stage_to_rank: Sequence[int]
) -> dict[int, list[tuple[int, TorchOp]]]:
    """The transfers of the communication plan (`plan_of`), in torch's words and places: what
    torch's runtime needs to run this program in its compute_comms form (no FSDP actions)."""
    out: dict[int, list[tuple[int, TorchOp]]] = {}
    for rank in range(max(stage_to_rank, default=-1) + 1):
        slot, ops = 0, []
        for step in plan_of(program.get(rank, []), stage_to_rank, rank):
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
