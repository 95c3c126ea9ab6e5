"""The registry, the verdict, and what every notebook's checkers share (how an answer is
read: a count, a number, names, a schedule's name; the block notebooks 01 and 02 analyse).
The exercises themselves live in ``_nbNN`` modules."""

from __future__ import annotations

import html
import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from zbkit.splitgrad import SplitGradAnalysis

# a checker takes the learner's answer and returns (right?, why): the why names the
# expected value and how it was found, so a wrong answer teaches something too
Checker = Callable[[Any], tuple[bool, str]]

_MODULES = ("_nb01", "_nb02", "_nb03", "_nb04", "_nb05", "_nb06", "_nb07", "_nb08", "_nb09")


@dataclass(frozen=True)
class Exercise:
    """One registered exercise: its key, what it asks, and the checker that works out the
    answer with zbkit itself (``exercise(key, asks)`` registers one)."""

    key: str  # "03.1": notebook 03, exercise 1
    asks: str  # what the answer is, in one line (shown when the answer is missing)
    checker: Checker


@dataclass(frozen=True)
class Verdict:
    """What `check` says: shown as one coloured line in a notebook, plain text elsewhere."""

    key: str
    right: bool | None  # None: no answer given yet
    why: str

    def __bool__(self) -> bool:
        return bool(self.right)

    def __repr__(self) -> str:
        mark = {True: "right", False: "wrong", None: "not answered yet"}[self.right]
        return f"exercise {self.key}: {mark}. {self.why}"

    def _repr_html_(self) -> str:
        colour = {True: "#1b7f3b", False: "#b3261e", None: "#6b6b6b"}[self.right]
        return f'<div style="color:{colour}">{html.escape(repr(self))}</div>'


EXERCISES: dict[str, Exercise] = {}


def exercise(key: str, asks: str) -> Callable[[Checker], Checker]:
    """Register `checker` as exercise `key` ("NN.k"); `asks` says what answer it wants."""

    def register(checker: Checker) -> Checker:
        if key in EXERCISES:
            raise ValueError(f"exercise {key} is registered twice")
        EXERCISES[key] = Exercise(key, asks, checker)
        return checker

    return register


def _load() -> None:
    """Import every notebook's module (each registers its exercises once; an import done
    before, of one alone, as `from zbkit.exercises._nb09 import ...`, is no reason to skip
    the others)."""
    for name in _MODULES:
        try:
            importlib.import_module(f"zbkit.exercises.{name}")
        except ModuleNotFoundError as missing:  # a notebook whose exercises are not written yet
            if missing.name != f"zbkit.exercises.{name}":
                raise


def all_exercises() -> dict[str, Exercise]:
    """Every notebook's exercises, by key ("01.1", ...), in key order."""
    _load()
    return dict(sorted(EXERCISES.items()))


def check(key: str, answer: Any) -> Verdict:
    """Whether `answer` is right for exercise `key` (e.g. "03.1"), and why.

    `answer=None` (the check cell as shipped) says what is asked instead of judging.
    """
    _load()
    if key not in EXERCISES:
        known = ", ".join(sorted(EXERCISES)) or "none"
        raise KeyError(f"no exercise {key!r}; the exercises are: {known}")
    ex = EXERCISES[key]
    if answer is None:
        return Verdict(key, None, f"Set `answer` to {ex.asks}, then run this cell again.")
    right, why = ex.checker(answer)
    return Verdict(key, right, why)


# ----------------------------------------------------------------- reading an answer


def is_count(answer: Any) -> bool:
    """A whole number: an int, not a bool (True is an int to Python, not to a learner)."""
    return isinstance(answer, int) and not isinstance(answer, bool)


def is_number(answer: Any) -> bool:
    """A finite int or float, not a bool: a time, a rate or a size (nan and inf are none)."""
    return (
        isinstance(answer, int | float) and not isinstance(answer, bool) and math.isfinite(answer)
    )


def as_names(answer: Any) -> set[str] | None:
    """A set, list or tuple of strings (or one string) as lower-case names; None if not."""
    items = [answer] if isinstance(answer, str) else answer
    if not isinstance(items, set | frozenset | list | tuple):
        return None
    if not all(isinstance(s, str) for s in items):
        return None
    return {s.strip().lower() for s in items}


def schedule_name(answer: Any, choices: Sequence[str], which: str) -> tuple[str | None, str]:
    """(the answer as one of `choices`, "") or (None, why not): names are read loosely."""
    if not isinstance(answer, str):
        return None, f"give a schedule's name such as 'zb-h1', got {answer!r}"
    name = answer.strip().lower()
    if name not in choices:
        return None, f"{answer!r} is not one of {which}: {', '.join(choices)}"
    return name, ""


# ----------------------------------------------------------------- notebooks 01 and 02's block


def block_analysis() -> tuple[nn.Module, SplitGradAnalysis]:
    """Notebooks 01 and 02's transformer block and its analysis (the learner's random stream
    left as it was)."""
    # torch only when a checker builds the block: `import zbkit.exercises` stays pure Python
    import torch

    from zbkit.models import TransformerBlock  # torch too, for the same reason
    from zbkit.splitgrad import analyze  # torch too, for the same reason

    with torch.random.fork_rng(devices=[]):
        block = TransformerBlock(dim=16, heads=2)
        h = torch.randn(2, 5, 16, requires_grad=True)  # (batch, tokens, dim)
        return block, analyze(block(h), h, block)
