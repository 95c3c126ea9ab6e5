"""One action type for every schedule: `Action(stage, kind, microbatch)`, text form `1I2`.

Kinds (the paper's "B" is our "I"; our "B" is the unsplit backward, as in
torch.distributed.pipelining):

    F  forward                          activations of the microbatch are kept
    I  backward for the input gradient  what the previous stage waits for
    W  backward for the weight gradient nobody waits for it: it fills bubbles
    B  full backward (I then W at once) the classic 1F1B backward

Everything that differs between kinds lives in the one `KINDS` table below: what an
action waits for, what it makes and which stage consumes it, which units of work it does
(its duration is their `Costs` sum) and how it changes the memory held. The engine, the
validator, the communication plan, the executors, the memory rule and the drawings all
ask the table, so a new kind is one entry here plus one entry in the runtime's dispatch
table (`RUNS` in zbkit/pipeline/_execute.py); docs/architecture.md shows where.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from typing import final

__all__ = [
    "KINDS",
    "PARTS",
    "Action",
    "Kind",
    "Overlap",
    "Product",
    "kinds_making",
    "parse_item",
    "waits_on",
]


class Product(StrEnum):
    """What an action makes that another action waits for (a str, so it prints plainly)."""

    ACT = "act"  # a forward's outputs: the next stage's forward consumes them
    GRAD = "grad"  # an input gradient: the previous stage's backward consumes it

    @property
    def words(self) -> str:
        """What the consumer receives, in messages: "activations" or "output gradients"."""
        return "activations" if self is Product.ACT else "output gradients"


# The units of work a (stage, microbatch) needs, each exactly once, in this order.
PARTS = ("F", "I", "W")


@dataclass(frozen=True, slots=True)
class Kind:
    """One row of `KINDS`: what an action of this kind does, holds, needs and makes."""

    letter: str
    name: str  # what the legend and the messages call it
    parts: tuple[str, ...]  # units of work it does (B = I + W); duration = their Costs sum
    act: int  # change of held activations, in units of Costs.mem_activation
    weight: int  # change of held weight-grad inputs, in units of Costs.mem_weight
    # what it waits for: (product, stage offset); (ACT, -1) = the previous stage's forward
    # output, (ACT, 0) = its own forward ran. Offsets outside the pipeline are dropped.
    needs: tuple[tuple[Product, int], ...]
    makes: Product | None  # what finishing it makes available to others
    to: int  # stage offset of whoever consumes `makes` on another stage (0: same stage only)

    @property
    def does_weight(self) -> bool:
        """Whether it does the W part of the work (W, B): a stage's gradients are final after
        its last such action (FSDP's REDUCE_GRAD, data-parallel averaging wait for it)."""
        return "W" in self.parts

    def needs_of(self, stage: int, num_stages: int) -> list[tuple[Product, int]]:
        """(product, producing stage) this kind waits for at `stage`, inside the pipeline."""
        return [(p, stage + d) for p, d in self.needs if 0 <= stage + d < num_stages]

    def consumer(self, stage: int, num_stages: int) -> int | None:
        """The other stage that consumes what this kind makes at `stage`, if any."""
        if self.makes is None or self.to == 0 or not 0 <= stage + self.to < num_stages:
            return None
        return stage + self.to


_ACT, _GRAD = Product.ACT, Product.GRAD
_FWD = ((_ACT, -1),)  # the previous stage's forward output
_BWD = ((_ACT, 0), (_GRAD, +1))  # its own forward ran; the next stage's input gradient
_WGT = ((_GRAD, 0),)  # its own I ran (what I leaves behind)

KINDS: dict[str, Kind] = {
    #         letter name                   parts      act wt  needs makes  to
    "F": Kind("F", "forward",               ("F",),     +1, 0,  _FWD, _ACT,  +1),
    "I": Kind("I", "input grad",            ("I",),     -1, +1, _BWD, _GRAD, -1),
    "W": Kind("W", "weight grad",           ("W",),      0, -1, _WGT, None,   0),
    "B": Kind("B", "full backward (I+W)",   ("I", "W"), -1, 0,  _BWD, _GRAD, -1),
}  # fmt: skip


def kinds_making(product: Product) -> list[Kind]:
    """The kinds whose finishing makes `product` (for ACT: F; for GRAD: I and B)."""
    return [k for k in KINDS.values() if k.makes == product]


# ---- the readiness rule: when an action may start ------------------------------------------
# `Kind.needs_of` says which (product, stage) an action waits for, the same microbatch's;
# the simulator's engine, the search's timeline, the exact model's edges and the runtime's
# mailboxes all ask it (directly, or through `waits_on` where actions are named by kind).
@cache
def waits_on(
    stage: int, kind: str, num_stages: int, kinds: tuple[str, ...] = PARTS
) -> tuple[tuple[int, str], ...]:
    """(stage, kind) of the actions `kind` at `stage` waits for (same microbatch), as the
    `KINDS` table says; each product is taken from the first of `kinds` that makes it."""
    maker = {p: next(k.letter for k in kinds_making(p) if k.letter in kinds) for p in Product}
    return tuple((s, maker[p]) for p, s in KINDS[kind].needs_of(stage, num_stages))


_PATTERN = re.compile(r"^\s*(\d+)\s*([A-Za-z]+)\s*(\d+)\s*$")


@final  # `type(a) is Action` tells a pair from an action in the hot loops
@dataclass(frozen=True, slots=True, order=True)
class Action:
    """A compute action: `kind` of `stage` on `microbatch` (all indices 0-based).

    The one action type of every schedule: a rank's program is a list of them (and of
    `Overlap` pairs). `kind` is a letter of `KINDS` (F forward, I input gradient, W weight
    gradient, B both), which says what the action needs, makes and holds. It prints as
    stage, kind, microbatch: `1I2` is stage 1's input gradient of microbatch 2.

    Example::

        from zbkit.schedules import KINDS, Action

        a = Action.parse("1I2")
        assert a == Action(stage=1, kind="I", microbatch=2) and str(a) == "1I2"
        assert KINDS[a.kind].name == "input grad"
    """

    stage: int
    kind: str
    microbatch: int

    def __post_init__(self) -> None:
        # the common case in one test (builders make ~10^5 actions for a big slider setting)
        if (
            type(self.stage) is int
            and type(self.microbatch) is int
            and self.stage >= 0
            and self.microbatch >= 0
            and self.kind in KINDS
        ):
            return
        if self.kind not in KINDS:
            names = ", ".join(f"{k.letter} {k.name}" for k in KINDS.values())
            raise ValueError(
                f"unknown action kind {self.kind!r} in {self.stage}{self.kind}{self.microbatch}: "
                f"use one of {', '.join(KINDS)} ({names})"
            )
        if not isinstance(self.stage, int) or not isinstance(self.microbatch, int):
            raise TypeError(
                f"stage and microbatch must be ints, got {self.stage!r} and {self.microbatch!r}"
            )
        if isinstance(self.stage, bool) or isinstance(self.microbatch, bool):
            raise TypeError(f"stage and microbatch must be ints, not bools: {self!r}")
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

    @staticmethod
    def trusted(stage: int, kind: str, microbatch: int) -> Action:
        """An Action without the argument checks, for builders that make ~10^5 of them
        (twice as fast); what they build is checked whole (`check_counts`, `validate`)."""
        a = _new(Action)
        _set_stage(a, stage)
        _set_kind(a, kind)
        _set_microbatch(a, microbatch)
        return a

    @property
    def halves(self) -> tuple[Action]:
        """The actions this program item runs: itself (an `Overlap` has two)."""
        return (self,)

    @classmethod
    def parse(cls, text: str) -> Action:
        """`Action.parse("1I2") == Action(1, "I", 2)`; the inverse of `str`."""
        match = _PATTERN.match(text) if isinstance(text, str) else None
        if match is None:
            raise ValueError(
                f"cannot read {_clip(text)} as an action: write STAGE KIND MICROBATCH, e.g. '0F3' "
                "or '1I2'"
            )
        stage, kind, microbatch = match.groups()
        return cls(int(stage), kind.upper(), int(microbatch))


def _clip(text: object, most: int = 40) -> str:
    """repr of `text`, cut to `most` characters: a message stays one short line."""
    shown = repr(text)
    return shown if len(shown) <= most else shown[:most] + "...'"


# Action.trusted sets the slots directly (a frozen dataclass's __init__ and checks are slow)
_new = object.__new__
_set_stage = Action.__dict__["stage"].__set__
_set_kind = Action.__dict__["kind"].__set__
_set_microbatch = Action.__dict__["microbatch"].__set__


@final
@dataclass(frozen=True, slots=True)
class Overlap:
    """torch's OVERLAP_F_B: a forward and a backward (B or I) of another microbatch, issued
    together on one rank as one program item (DualPipe overlaps one's communication with
    the other's compute). Both halves must be ready when the pair starts: neither may wait
    for the other. Text forms: `0F1+1B0` (zbkit) and `(0F1;1B0)OVERLAP_F_B` (torch's CSV).
    """

    forward: Action
    backward: Action

    def __post_init__(self) -> None:
        if not isinstance(self.forward, Action) or not isinstance(self.backward, Action):
            raise TypeError(
                f"an Overlap pairs two Actions, got {self.forward!r}, {self.backward!r}"
            )
        # from the table: the forward half makes activations, the backward an input gradient
        if self.forward.info.makes is not Product.ACT or self.backward.info.makes is not _GRAD:
            paired = " or ".join(k.letter for k in kinds_making(_GRAD))
            raise ValueError(
                f"an overlapped pair is a forward then a backward ({paired}), "
                f"got {self.forward} and {self.backward}"
            )

    @property
    def halves(self) -> tuple[Action, Action]:
        return (self.forward, self.backward)

    def __str__(self) -> str:
        return f"{self.forward}+{self.backward}"

    def __repr__(self) -> str:
        return f"Overlap({self.forward!r}, {self.backward!r})"

    def torch_form(self) -> str:
        return f"({self.forward};{self.backward})OVERLAP_F_B"


def parse_item(text: str) -> Action | Overlap:
    """One program item from text: '0F3', or an overlapped pair '0F1+1B0' or
    '(0F1;1B0)OVERLAP_F_B' (torch's form)."""
    if not isinstance(text, str):
        raise TypeError(f"an action is written as text like '0F3', got {text!r}")
    body = text.strip()
    if body.startswith("("):
        if ")" not in body:
            raise ValueError(
                f"{_clip(body)} has no closing ')': write an overlapped pair as "
                "(0F1;0B0)OVERLAP_F_B"
            )
        inner, _, tail = body[1:].partition(")")
        if tail.strip().upper() != "OVERLAP_F_B":
            raise ValueError(
                f"{_clip(body)}: the only grouped action is (F;B)OVERLAP_F_B, got {_clip(tail)}"
            )
        halves = inner.split(";")
    elif "+" in body:
        halves = body.split("+")
    else:
        return Action.parse(body)
    if len(halves) != 2:
        raise ValueError(
            f"{_clip(body)}: an overlapped pair has two halves, a forward and a backward"
        )
    return Overlap(Action.parse(halves[0]), Action.parse(halves[1]))
