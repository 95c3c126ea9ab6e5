"""What ran when: one `Event` form for simulations, measured traces and drawings.

A simulation (`simulate`), a real run (`zbkit.pipeline.Trace`) and every drawing share
`Event(rank, stage, kind, microbatch, start, end)`, and the two numbers read off events are
computed here once:

- the bubble rate (the paper's definition): cost = the longest rank span (first start to
  last end), work = the busiest rank's busy time, bubble = (cost - work) / cost;
- the memory held per rank over time, by one rule: an action's change of memory
  (`Costs.memory(kind)`, from the `KINDS` table) lands at its start when it grows the
  memory (a forward's activations pile up while it runs) and at its end when it shrinks
  it (a backward frees as it finishes). A rank runs one action at a time, so the peak is
  the running maximum over its actions in order, whatever the timing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import itemgetter
from typing import NamedTuple

from zbkit.schedules.core.costs import Costs, stage_costs

__all__ = [
    "CommEvent",
    "Event",
    "bubble_of",
    "bubble_rate",
    "memory_deltas",
    "memory_steps",
    "rank_spans",
]


class Event(NamedTuple):
    """One action that ran (or was simulated): what a Gantt chart draws.

    `Simulation.events` and a measured `Trace.events` hold the same form, so the drawings,
    the bubble and `zbkit.schedules.measure` work on either. `label` is the action's text
    (`1I3`); `paired` marks one half of an overlapped pair.
    """

    rank: int
    stage: int
    kind: str
    microbatch: int
    start: float
    end: float
    paired: bool = False  # one half of an overlapped pair (drawn as one box with its other half)

    @property
    def label(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"  # same text as str(Action)


class CommEvent(NamedTuple):
    """Time a rank spent on a transfer of its plan: posting a send, or idle waiting for a
    receive (measured in ``Trace.comm``, modelled in ``Simulation.comm``)."""

    rank: int
    label: str  # e.g. "recv act 2:3 <- rank 1"
    start: float
    end: float


def rank_spans(events: Iterable[Event]) -> dict[int, tuple[float, float, float]]:
    """rank -> (first start, last end, busy time)."""
    spans: dict[int, tuple[float, float, float]] = {}
    for e in events:
        lo, hi, busy = spans.get(e.rank, (e.start, e.end, 0.0))
        spans[e.rank] = (min(lo, e.start), max(hi, e.end), busy + e.end - e.start)
    return spans


def bubble_rate(events: Iterable[Event]) -> float:
    """``(cost - work) / cost`` for any events, simulated or measured.

    cost = the longest rank span (first start to last end), work = the busiest rank's busy
    time. For a simulation the busiest rank's busy time is m * sum over its stages of
    (F + I + W), so this is exactly ``Simulation.bubble_rate``; a measured trace gets the
    same formula and so can be compared with its simulation.
    """
    spans = rank_spans(events)
    if not spans:
        return 0.0
    cost = max(hi - lo for lo, hi, _ in spans.values())
    return bubble_of(cost, max(busy for *_, busy in spans.values()))


def bubble_of(cost: float, work: float) -> float:
    """The bubble rate's one formula, ``(cost - work) / cost`` (0 for an empty span): the
    share of the longest rank span (`cost`) that the busiest rank's `work` leaves idle."""
    return (cost - work) / cost if cost > 0 else 0.0


def memory_deltas(events: Iterable[Event], costs: Costs | Sequence[Costs] | None) -> list[float]:
    """Each event's change of memory held, from its stage's `Costs` (default `Costs()`; one
    `Costs` is a rank's share, split over the stages the events show on each rank)."""
    events = list(events)
    stages = stage_costs(costs, ((e.stage, e.rank) for e in events))  # one Costs: shared
    table: dict[tuple[int, str], float] = {}  # (stage, kind) -> delta, asked once each
    out = []
    for e in events:
        key = (e.stage, e.kind)
        delta = table.get(key)
        if delta is None:
            delta = table[key] = stages[e.stage].memory(e.kind)
        out.append(delta)
    return out


def memory_steps(
    events: Sequence[Event], deltas: Sequence[float], num_ranks: int | None = None
) -> list[list[tuple[float, float]]]:
    """Per rank: (time, memory held from then on) steps, from 0 at the rank's first start.

    `deltas[i]` is what `events[i]` changes (see `memory_deltas`; a measured trace passes
    what its stages really held). Growth lands at an event's start, shrinking at its end.
    """
    ranks = max((e.rank for e in events), default=-1) + 1
    n = max(ranks, num_ranks or 0)
    changes: list[list[tuple[float, float]]] = [[] for _ in range(n)]
    first = [float("inf")] * n
    for e, delta in zip(events, deltas, strict=True):
        rank, start = e[0], e[4]  # by index: Event's fields, or a 6-tuple
        changes[rank].append((start if delta > 0 else e[5], delta))
        if start < first[rank]:
            first[rank] = start
    out = []
    for rank, per_rank in enumerate(changes):
        # stable, so same-time changes keep event order; a rank's events in program order
        # are sorted already (one action at a time), which Timsort checks in one pass
        per_rank.sort(key=_time)
        level, steps = 0.0, [(first[rank], 0.0)] if per_rank else []
        for time, delta in per_rank:
            level += delta
            steps.append((time, level))
        out.append(steps)
    return out


_time = itemgetter(0)
