"""One action type for every schedule: `Action(stage, kind, microbatch)`, text form `1I2`.

Kinds (the paper's "B" is our "I"; our "B" is the unsplit backward, as in
torch.distributed.pipelining):

    F  forward                          activations of the microbatch are kept
    I  backward for the input gradient  what the previous stage waits for
    W  backward for the weight gradient nobody waits for it: it fills bubbles
    B  full backward (I then W at once) the classic 1F1B backward

Everything that differs between kinds lives in the one `KINDS` table below, so the
simulator, the validator and the builders never branch on kind letters by hand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["KINDS", "Action", "Kind"]


@dataclass(frozen=True, slots=True)
class Kind:
    letter: str
    name: str
    time: tuple[str, ...]  # Costs fields whose sum is the duration (B = I + W)
    act: int  # change of held activations, in units of Costs.mem_activation
    weight: int  # change of held weight-grad inputs, in units of Costs.mem_weight
    done_key: str  # what finishing it makes available to others ("F", "X" = input grad, "W")


KINDS: dict[str, Kind] = {
    "F": Kind("F", "forward", ("F",), +1, 0, "F"),
    "I": Kind("I", "backward-input", ("I",), -1, +1, "X"),
    "W": Kind("W", "backward-weight", ("W",), 0, -1, "W"),
    "B": Kind("B", "full backward", ("I", "W"), -1, 0, "X"),
}

_PATTERN = re.compile(r"^\s*(\d+)\s*([A-Za-z]+)\s*(\d+)\s*$")


@dataclass(frozen=True, slots=True, order=True)
class Action:
    """A compute action: `kind` of `stage` on `microbatch` (all indices 0-based)."""

    stage: int
    kind: str
    microbatch: int

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"unknown action kind {self.kind!r} in {self.stage}{self.kind}{self.microbatch}: "
                f"use one of {', '.join(KINDS)} (F forward, I input grad, W weight grad, "
                "B full backward)"
            )
        if not isinstance(self.stage, int) or not isinstance(self.microbatch, int):
            raise TypeError(
                f"stage and microbatch must be ints, got {self.stage!r} and {self.microbatch!r}"
            )
        if self.stage < 0 or self.microbatch < 0:
            raise ValueError(
                f"stage and microbatch must be >= 0, got stage={self.stage}, "
                f"microbatch={self.microbatch}"
            )

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    def __repr__(self) -> str:
        return f"Action({self.stage}, {self.kind!r}, {self.microbatch})"

    @property
    def info(self) -> Kind:
        return KINDS[self.kind]

    @classmethod
    def parse(cls, text: str) -> Action:
        """`Action.parse("1I2") == Action(1, "I", 2)`; the inverse of `str`."""
        match = _PATTERN.match(text) if isinstance(text, str) else None
        if match is None:
            raise ValueError(
                f"cannot read {text!r} as an action: write STAGE KIND MICROBATCH, e.g. '0F3' "
                "or '1I2'"
            )
        stage, kind, microbatch = match.groups()
        return cls(int(stage), kind.upper(), int(microbatch))
