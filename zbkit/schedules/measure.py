"""Read costs back from events: what a measured run says about F, I, W and the wire.

A measured trace and a simulation share one event form ``(rank, stage, kind, microbatch,
start, end)``, so these work on both; on a simulation they give back its own costs.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence

from zbkit.schedules.core.action import KINDS, PARTS, kinds_making
from zbkit.schedules.core.costs import Costs
from zbkit.schedules.core.events import Event

EventKey = tuple[int, str, int]  # (stage, kind, microbatch)


def input_producer(e: Event, by_key: Mapping[EventKey, Event], last_stage: int) -> Event | None:
    """The action whose tensors ``e`` consumes from another stage (``Kind.needs`` with a
    stage offset): F of stage s-1 for an F of s; the I (or B) of stage s+1 for an I or B of
    s; None for what reads no other stage's tensors (stage 0's F, the last stage's I or B,
    every W)."""
    for product, stage in KINDS[e.kind].needs_of(e.stage, last_stage + 1):
        if stage != e.stage:
            for maker in kinds_making(product):
                src = by_key.get((stage, maker.letter, e.microbatch))
                if src is not None:
                    return src
    return None


def by_key(events: Iterable[Event]) -> dict[EventKey, Event]:
    """The events by (stage, kind, microbatch), e.g. ``by_key(trace.events)[(0, "F", 3)]``."""
    return {(e.stage, e.kind, e.microbatch): e for e in events}


def hop_latency(events: Sequence[Event]) -> float:
    """Median time from a producer's end to its consumer's start on another rank, counted
    only where the consumer's rank sat idle waiting for it (else the gap is not the wire's)."""
    keyed = by_key(events)
    last = max((e.stage for e in events), default=0)
    free: dict[Event, float] = {}  # event -> when its rank finished the action before it
    for rank in {e.rank for e in events}:
        mine = sorted((e for e in events if e.rank == rank), key=lambda e: e.start)
        for before, e in zip([None, *mine], mine, strict=False):
            free[e] = before.end if before is not None else float("-inf")
    hops = [
        e.start - src.end
        for e in events
        if (src := input_producer(e, keyed, last)) is not None
        and src.rank != e.rank
        and src.end >= free[e]
    ]
    return max(0.0, statistics.median(hops)) if hops else 0.0


def measured_costs(events: Iterable[Event], num_stages: int, comm: float = 0.0) -> list[Costs]:
    """Per stage: the median time of each part of the work (F, I, W); an action doing several
    parts (B = I + W) counts its time shared equally among them, where no action does the
    part alone."""
    alone: dict[tuple[int, str], list[float]] = {}  # (stage, part) -> times of one-part kinds
    shared: dict[tuple[int, str], list[float]] = {}
    for e in events:
        parts = KINDS[e.kind].parts
        into = alone if len(parts) == 1 else shared
        for part in parts:
            into.setdefault((e.stage, part), []).append((e.end - e.start) / len(parts))
    out = []
    for s in range(num_stages):
        if (s, PARTS[0]) not in alone:
            raise ValueError(f"no F of stage {s} in the trace: was it recorded on every rank?")
        med = {
            p: statistics.median(alone.get((s, p)) or shared.get((s, p)) or [0.0]) for p in PARTS
        }
        out.append(Costs(**med, comm=comm))
    return out
