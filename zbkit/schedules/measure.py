"""Read costs back from events: what a measured run says about F, I, W and the wire.

A measured trace and a simulation share one event form ``(rank, stage, kind, microbatch,
start, end)``, so these work on both; on a simulation they give back its own costs.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence

from zbkit.schedules.simulate import Costs, Event

EventKey = tuple[int, str, int]  # (stage, kind, microbatch)


def input_producer(e: Event, by_key: Mapping[EventKey, Event], last_stage: int) -> Event | None:
    """The action whose tensors ``e`` consumes: F of stage s-1 for an F of s; the I (or B) of
    stage s+1 for an I or B of s; None for what reads no other stage's tensors (stage 0's F,
    the last stage's I or B, every W)."""
    if e.kind == "F" and e.stage > 0:
        return by_key.get((e.stage - 1, "F", e.microbatch))
    if e.kind in "IB" and e.stage < last_stage:
        return by_key.get((e.stage + 1, "I", e.microbatch)) or by_key.get(
            (e.stage + 1, "B", e.microbatch)
        )
    return None


def by_key(events: Iterable[Event]) -> dict[EventKey, Event]:
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
    """Per stage: the median F, I and W seen (a B, the unsplit backward, counts half to each)."""
    times: dict[tuple[int, str], list[float]] = {}
    for e in events:
        times.setdefault((e.stage, e.kind), []).append(e.end - e.start)
    med = {key: statistics.median(v) for key, v in times.items()}
    out = []
    for s in range(num_stages):
        if (s, "F") not in med:
            raise ValueError(f"no F of stage {s} in the trace: was it recorded on every rank?")
        if (s, "I") in med:
            i, w = med[s, "I"], med.get((s, "W"), 0.0)
        else:
            i = w = med.get((s, "B"), 0.0) / 2
        out.append(Costs(F=med[s, "F"], I=i, W=w, comm=comm))
    return out
