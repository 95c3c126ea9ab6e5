"""The communication plan: a rank's compute actions with the transfers they imply, as data.

The schedule builders emit compute actions only. ``plan_of`` walks one rank's program
once and, asking the ``KINDS`` table, wraps each action with its transfers:

- before it, a receive for each thing it needs from a stage on another rank
  (``Kind.needs`` with a stage offset: F(s, j) the activations of (s-1, j); I/B(s, j) the
  gradients of (s+1, j)'s outputs);
- after it, a send of what it makes to the consuming stage, if that lives on another rank
  (F to s+1, I/B to s-1); W makes nothing anyone else waits for.

Neighbouring stages on the same rank (the V of zb-v) hand tensors over locally: no ``Comm``.
The plan is pure data (no torch), printable, and what ``zbkit.pipeline.ScheduleRunner``
walks: ``for step in plan: comm -> send/receive; action -> run it``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Union

from zbkit.schedules.core.action import Action, Overlap, Product

__all__ = ["Comm", "CommOp", "Plan", "PlanStep", "plan_of"]


class CommOp(StrEnum):
    """A transfer's direction, seen from the rank whose plan holds it (prints as "send")."""

    SEND = "send"
    RECV = "recv"


@dataclass(frozen=True, slots=True)
class Comm:
    """One transfer in a rank's plan: ``what`` of (stage, microbatch) to or from ``peer``.

    ``stage`` is the stage that consumes the tensors: for activations the receiving stage
    s (sent by s-1); for gradients the stage s that receives the grads of its outputs.
    """

    op: CommOp
    what: Product
    stage: int
    microbatch: int
    peer: int  # rank in the pipeline group
    action: str = ""  # the compute action it serves: the consumer of a recv, producer of a send

    @property
    def key(self) -> tuple[Product, int, int]:
        """The mailbox key both ends use: (what, consuming stage, microbatch)."""
        return (self.what, self.stage, self.microbatch)

    def __repr__(self) -> str:
        return f"Comm({str(self)!r}, for {self.action or '?'})"

    def __str__(self) -> str:
        arrow = "->" if self.op is CommOp.SEND else "<-"
        return f"{self.op} {self.what} {self.stage}:{self.microbatch} {arrow} rank {self.peer}"

    def explain(self) -> str:
        """The transfer in words, for error messages."""
        what = self.what.words
        if self.op is CommOp.RECV:
            return (
                f"receiving the {what} of stage {self.stage} microbatch {self.microbatch} from "
                f"rank {self.peer}, which {self.action} needs"
            )
        return (
            f"sending the {what} {self.action} produced to rank {self.peer} "
            f"(stage {self.stage} microbatch {self.microbatch})"
        )


PlanStep = Union[Action, Overlap, Comm]  # noqa: UP007 - a runtime alias, readable in isinstance checks


@dataclass(frozen=True)
class Plan:
    """One rank's steps in order: compute actions and the transfers around them.

    What an executor walks (``for step in plan``): ``derive_plan(schedule, rank)`` adds to
    the rank's compute actions the ``Comm`` each one needs, receives before and sends after.
    It prints as a numbered list, the transfers indented::

        plan of rank 0: 4 actions, 4 comms
        0  0F0
        1      send act 1:0 -> rank 1
        ...
        4      recv grad 0:0 <- rank 1
        5  0B0
    """

    rank: int
    steps: tuple[PlanStep, ...]

    def __iter__(self) -> Iterator[PlanStep]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, index: int) -> PlanStep:
        return self.steps[index]

    @property
    def comms(self) -> list[Comm]:
        return [c for c in self.steps if isinstance(c, Comm)]

    @property
    def actions(self) -> list[Action | Overlap]:
        return [a for a in self.steps if not isinstance(a, Comm)]

    def __str__(self) -> str:
        width = len(str(len(self.steps) - 1)) if self.steps else 1
        lines = [f"plan of rank {self.rank}: {len(self.actions)} actions, {len(self.comms)} comms"]
        for i, step in enumerate(self.steps):
            indent = "    " if isinstance(step, Comm) else ""
            lines.append(f"{i:>{width}}  {indent}{step}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Plan(rank={self.rank}, actions={len(self.actions)}, comms={len(self.comms)})"


def plan_of(items: Sequence[Action | Overlap], stage_to_rank: Sequence[int], rank: int) -> Plan:
    """``rank``'s program ``items`` with the ``Comm`` each one needs around it, for stages
    placed by ``stage_to_rank`` (``derive_plan(schedule, rank)`` is this for a Schedule).

    One pass: before an action, a receive for each input made on another rank (its stage's
    neighbour, from ``Kind.needs``); after it, a send for each rank that consumes what it
    makes."""
    where, n = stage_to_rank, len(stage_to_rank)
    steps: list[PlanStep] = []
    for item in items:
        # an overlapped pair: the receives of both halves, the pair, the sends of both
        for a in item.halves:
            for product, src in a.info.needs_of(a.stage, n):
                if where[src] != rank:
                    steps.append(
                        Comm(CommOp.RECV, product, a.stage, a.microbatch, where[src], str(a))
                    )
        steps.append(item)
        for a in item.halves:
            dst = a.info.consumer(a.stage, n)
            if dst is not None and where[dst] != rank:
                assert a.info.makes is not None, f"{a}: a kind with a consumer makes something"
                steps.append(Comm(CommOp.SEND, a.info.makes, dst, a.microbatch, where[dst], str(a)))
    return Plan(rank, tuple(steps))
