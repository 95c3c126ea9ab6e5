"""The registry and the verdict; the exercises themselves live in ``_nbNN`` modules."""

from __future__ import annotations

import html
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# a checker takes the learner's answer and returns (right?, why): the why names the
# expected value and how it was found, so a wrong answer teaches something too
Checker = Callable[[Any], tuple[bool, str]]

_MODULES = ("_nb01", "_nb02", "_nb03", "_nb04", "_nb05", "_nb06", "_nb07", "_nb08")


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
    for name in _MODULES:
        try:
            importlib.import_module(f"zbkit.exercises.{name}")
        except ModuleNotFoundError as missing:  # a notebook whose exercises are not written yet
            if missing.name != f"zbkit.exercises.{name}":
                raise


def all_exercises() -> dict[str, Exercise]:
    """Every notebook's exercises, by key ("01.1", ...), in key order."""
    if not EXERCISES:
        _load()
    return dict(sorted(EXERCISES.items()))


def check(key: str, answer: Any) -> Verdict:
    """Whether `answer` is right for exercise `key` (e.g. "03.1"), and why.

    `answer=None` (the check cell as shipped) says what is asked instead of judging.
    """
    if not EXERCISES:
        _load()
    if key not in EXERCISES:
        known = ", ".join(sorted(EXERCISES)) or "none"
        raise KeyError(f"no exercise {key!r}; the exercises are: {known}")
    ex = EXERCISES[key]
    if answer is None:
        return Verdict(key, None, f"Set `answer` to {ex.asks}, then run this cell again.")
    right, why = ex.checker(answer)
    return Verdict(key, right, why)
