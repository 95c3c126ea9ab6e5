"""Activation memory per rank as a step function of time, from events and memory costs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zbkit.viz._events import Event


def memory_delta(event: Event, costs: Any) -> float:
    """DESIGN's rule: F +act; I +(weight - act); W -weight; B -act."""
    if isinstance(costs, Sequence):  # one Costs per stage
        costs = costs[event.stage]
    act = float(getattr(costs, "mem_activation", 1.0))
    weight = float(getattr(costs, "mem_weight", 0.0))
    return {"F": act, "I": weight - act, "W": -weight, "B": -act}[event.kind]


def memory_steps(
    events: list[Event], costs: Any, num_ranks: int
) -> dict[int, tuple[list[float], list[float]]]:
    """rank -> (times, memory after each time), starting at (0, 0).

    A forward's activations grow while it runs, so its delta lands at its start; the backward
    passes free memory as they finish, so theirs land at their end. A rank runs one action at a
    time, so the peak equals the running maximum over the rank's actions in order, whatever the
    timing.
    """
    steps: dict[int, tuple[list[float], list[float]]] = {}
    for rank in range(num_ranks):
        changes = []
        for e in events:
            if e.rank == rank:
                delta = memory_delta(e, costs)
                changes.append((e.start if e.kind == "F" else e.end, delta))
        changes.sort(key=lambda c: c[0])  # stable: same-time changes keep event order
        times, values, level = [0.0], [0.0], 0.0
        for time, delta in changes:
            level += delta
            times.append(time)
            values.append(level)
        steps[rank] = (times, values)
    return steps
