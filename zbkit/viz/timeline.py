"""Read events out of whatever the user has: a Simulation, a runner's trace, or a plain list.

Simulations (`zbkit.schedules.simulate`) and measured traces (`runner.trace`) share one event
form, `zbkit.schedules.Event(rank, stage, kind, microbatch, start, end)`. The drawings only
need that, so `timeline` turns any of the accepted shapes into a list of `Event` plus the
summary numbers the titles show (the bubble rate by `zbkit.schedules.bubble_rate`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from zbkit.schedules import KINDS, Event, bubble_rate

__all__ = ["Timeline", "raw_events", "timeline"]

_FIELDS = Event._fields[:6]  # rank, stage, kind, microbatch, start, end (paired: optional)


@dataclass(frozen=True, slots=True)
class Timeline:
    """Events shifted so the run starts at 0, with the numbers a title needs."""

    events: list[Event]
    num_ranks: int
    makespan: float
    bubble_rate: float
    peak_memory: list[float] | None  # from the simulation when it has one
    source: Any  # what the user passed, for costs / memory timelines it may carry
    t0: float = 0.0  # the source's time of the first start (subtracted from every event)


def _optional(raw: Any, field: str) -> Any:
    if isinstance(raw, Mapping):
        return raw.get(field, False)
    return getattr(raw, field, False)


def _one_event(raw: Any, index: int) -> Event:
    if isinstance(raw, Event):
        return raw
    if isinstance(raw, Mapping):
        get = raw.__getitem__
    elif all(hasattr(raw, f) for f in _FIELDS):
        get = lambda f: getattr(raw, f)  # noqa: E731 - a dataclass / namedtuple event
    elif isinstance(raw, tuple | list) and len(raw) == len(_FIELDS):
        get = dict(zip(_FIELDS, raw, strict=True)).__getitem__
    else:
        raise TypeError(
            f"event {index} is {type(raw).__name__} {raw!r}; expected an object or dict with "
            f"fields {', '.join(_FIELDS)} (as in Simulation.events or runner.trace)"
        )
    try:
        event = Event(
            rank=int(get("rank")),
            stage=int(get("stage")),
            kind=str(get("kind")),
            microbatch=int(get("microbatch")),
            start=float(get("start")),
            end=float(get("end")),
            paired=bool(_optional(raw, "paired")),
        )
    except KeyError as err:
        raise TypeError(f"event {index} has no field {err}; needs {', '.join(_FIELDS)}") from None
    if event.kind not in KINDS:
        raise ValueError(f"event {index} has kind {event.kind!r}; expected one of {tuple(KINDS)}")
    if event.end < event.start:
        raise ValueError(f"event {index} ({event.label}) ends at {event.end} before its start")
    return event


def raw_events(obj: Any) -> list[Any]:
    """The raw event list of a Simulation / trace object, or `obj` itself if it is a list."""
    events = getattr(obj, "events", obj)
    if callable(events):  # a trace object may expose events() instead of a field
        events = events()
    if isinstance(events, str | bytes) or not isinstance(events, Iterable):
        raise TypeError(
            f"expected a Simulation, a runner trace or a list of events; got {type(obj).__name__}"
        )
    return list(events)


def timeline(obj: Any, *, num_ranks: int | None = None) -> Timeline:
    """Normalise `obj` (Simulation, trace, or list of events) into a `Timeline`.

    Every drawing starts here: the events shifted so the run starts at 0, per rank, with the
    makespan and bubble a title shows. Works without matplotlib (the core install), for
    reading a run's numbers: ``timeline(simulate(schedule)).bubble_rate``.
    """
    events = [_one_event(raw, i) for i, raw in enumerate(raw_events(obj))]
    if not events:
        raise ValueError("no events to draw: the simulation or trace is empty")
    t0 = min(e.start for e in events)
    if t0 != 0.0:  # measured traces carry wall-clock times; draw them from 0
        events = [e._replace(start=e.start - t0, end=e.end - t0) for e in events]
    # sorted so every drawing walks events in one order, whatever order they came in
    events.sort(key=lambda e: (e.rank, e.start, e.end, e.stage, e.kind, e.microbatch))
    ranks = max(e.rank for e in events) + 1
    makespan = getattr(obj, "makespan", None)
    rate = getattr(obj, "bubble_rate", None)
    peak = getattr(obj, "peak_memory", None)
    return Timeline(
        events=events,
        num_ranks=max(ranks, num_ranks or 0, len(peak) if peak is not None else 0),
        makespan=float(makespan) if makespan is not None else max(e.end for e in events),
        # a plain event list: the same formula Simulation and Trace use
        bubble_rate=float(rate) if rate is not None else bubble_rate(events),
        peak_memory=[float(x) for x in peak] if peak is not None else None,
        source=obj,
        t0=t0,
    )
