"""`Costs`: what one stage's actions take, in time and in memory, per microbatch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from zbkit.schedules.action import KINDS

__all__ = ["Costs", "per_stage"]


@dataclass(frozen=True, slots=True)
class Costs:
    """Time and memory of one stage on one microbatch (any consistent units)."""

    F: float = 1.0  # forward
    I: float = 1.0  # noqa: E741  backward for the input gradient (the paper's "B")
    W: float = 1.0  # backward for the weight gradient
    comm: float = 0.0  # added to every wait on another rank
    mem_activation: float = 1.0  # held from F until I (M_B in the paper)
    mem_weight: float = 0.0  # held from I until W (M_W in the paper)
    # time saved when this stage's forward runs overlapped with a backward (torch's
    # OVERLAP_F_B, DualPipe's pairs: one's communication hidden behind the other's compute);
    # the pair takes F + the backward's time - overlap, never less than its longer half
    overlap: float = 0.0

    def __post_init__(self) -> None:
        for name in ("F", "I", "W", "comm", "mem_activation", "mem_weight", "overlap"):
            value = getattr(self, name)
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if not ok or not math.isfinite(value) or value < 0:
                raise ValueError(f"Costs.{name} must be a finite number >= 0, got {value!r}")

    @classmethod
    def parse(cls, text: str) -> Costs:
        """'F,I,W[,comm[,mem_activation[,mem_weight]]]' as typed on the command line,
        e.g. '1,1,1' or '18.5,18.1,9.3,0.6,1,0.37'."""
        try:
            values = [float(x) for x in text.split(",")]
        except ValueError:
            values = []
        if not 3 <= len(values) <= 6:
            raise ValueError(
                "costs must be 3 to 6 numbers 'F,I,W[,comm[,mem_activation[,mem_weight]]]', "
                f"got {text!r}"
            )
        return cls(*values)

    def duration(self, kind: str) -> float:
        """How long an action of `kind` takes: the sum of its parts (B = I + W)."""
        return sum(getattr(self, part) for part in KINDS[kind].parts)

    def memory(self, kind: str) -> float:
        """How an action of `kind` changes the memory held (F +act, I +weight-act, ...)."""
        k = KINDS[kind]
        return k.act * self.mem_activation + k.weight * self.mem_weight


def per_stage(costs: Costs | Sequence[Costs] | None, num_stages: int, who: str = "") -> list[Costs]:
    """One `Costs` per stage from one `Costs` (all stages alike), a list, or None (defaults)."""
    if costs is None:
        return [Costs()] * num_stages
    if isinstance(costs, Costs):
        return [costs] * num_stages
    prefix = f"{who}: " if who else ""
    if isinstance(costs, str) or not isinstance(costs, Sequence):
        hint = f" (Costs.parse({costs!r}) reads that form)" if isinstance(costs, str) else ""
        raise ValueError(
            f"{prefix}costs must be one Costs or a list of {num_stages} (one per stage), got "
            f"{type(costs).__name__} {costs!r}{hint}"
        )
    costs = list(costs)
    if len(costs) != num_stages or not all(isinstance(c, Costs) for c in costs):
        raise ValueError(
            f"{prefix}costs must be one Costs or a list of {num_stages} (one per stage), "
            f"got {len(costs)} items"
        )
    return costs
