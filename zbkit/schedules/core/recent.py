"""The last few answers to a slow question, by its arguments: zb-auto's searches and the
exact solver's proofs are asked again as a slider moves back, and answered at once."""

from __future__ import annotations

from collections.abc import Callable, ItemsView
from typing import Generic, TypeVar

V = TypeVar("V")


class Recent(Generic[V]):
    """At most `size` answers; the one asked for least recently is forgotten first."""

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self._kept: dict[tuple, V] = {}

    def get(self, key: tuple, make: Callable[[], V]) -> V:
        """The answer kept for `key`, or `make()`'s, kept (now the newest either way)."""
        kept = self._kept
        found = kept.pop(key) if key in kept else make()
        kept[key] = found
        while len(kept) > self.size:
            kept.pop(next(iter(kept)))  # the oldest
        return found

    def items(self) -> ItemsView[tuple, V]:
        return self._kept.items()
