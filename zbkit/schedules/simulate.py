"""`simulate(schedule, costs)`: when every action runs, the bubble rate and the memory.

Each rank runs its program in order, one action at a time, starting an action as soon as
the rank is free and its inputs exist (plus `comm` when they come from another rank).
Durations: F, I, W, and B = I + W. Memory per rank: F holds one activation, I turns it
into what W needs (`mem_weight`), W frees that, B frees the activation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from zbkit.schedules import _engine
from zbkit.schedules.action import KINDS, Action
from zbkit.schedules.schedule import Schedule, ScheduleError
from zbkit.schedules.validate import validate

__all__ = ["Costs", "Event", "Simulation", "simulate"]


@dataclass(frozen=True, slots=True)
class Costs:
    """Time and memory of one stage on one microbatch (any consistent units)."""

    F: float = 1.0  # forward
    I: float = 1.0  # noqa: E741  backward for the input gradient (the paper's "B")
    W: float = 1.0  # backward for the weight gradient
    comm: float = 0.0  # added to every wait on another rank
    mem_activation: float = 1.0  # held from F until I (M_B in the paper)
    mem_weight: float = 0.0  # held from I until W (M_W in the paper)

    def __post_init__(self) -> None:
        for name in ("F", "I", "W", "comm", "mem_activation", "mem_weight"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < 0:
                raise ValueError(f"Costs.{name} must be a number >= 0, got {value!r}")

    @classmethod
    def parse(cls, text: str) -> Costs:
        """'F,I,W[,comm[,mem_activation[,mem_weight]]]' as typed on the command line,
        e.g. '1,1,1' or '18.5,18.1,9.3,0.6,1,0.37'."""
        try:
            values = [float(x) for x in text.split(",")]
        except ValueError:
            values = []
        if not 3 <= len(values) <= 6:
            raise ValueError(
                "costs must be 3 to 6 numbers 'F,I,W[,comm[,mem_activation[,mem_weight]]]', "
                f"got {text!r}"
            )
        return cls(*values)

    def duration(self, kind: str) -> float:
        return sum(getattr(self, f) for f in KINDS[kind].time)

    def memory(self, kind: str) -> float:
        k = KINDS[kind]
        return k.act * self.mem_activation + k.weight * self.mem_weight


class Event(NamedTuple):
    """One action that ran (or was simulated): what a Gantt chart draws."""

    rank: int
    stage: int
    kind: str
    microbatch: int
    start: float
    end: float


@dataclass
class Simulation:
    schedule: Schedule
    costs: Costs | list[Costs]
    events: list[Event]  # per rank, in program order
    makespan: float  # last end - first start, over all ranks
    bubble_rate: float  # (cost - m*v*(F+I+W)) / cost, cost = the longest rank span
    peak_memory: list[float]  # per rank
    memory: list[list[tuple[float, float]]]  # per rank: (time, held memory) steps
    busy: list[float]  # per rank: time spent computing
    span: list[float]  # per rank: first start to last end
    idle: list[float]  # per rank: span - busy (the bubbles)

    def __repr__(self) -> str:
        return (
            f"Simulation({self.schedule.name!r}, pp={self.schedule.pp}, "
            f"m={self.schedule.microbatches}, makespan={self.makespan:.4g}, "
            f"bubble_rate={self.bubble_rate:.4f}, peak_memory={_fmt(self.peak_memory)})"
        )


def _fmt(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"


def _per_stage(schedule: Schedule, costs: Costs | Sequence[Costs]) -> list[Costs]:
    if isinstance(costs, Costs):
        return [costs] * schedule.num_stages
    costs = list(costs)
    if len(costs) != schedule.num_stages or not all(isinstance(c, Costs) for c in costs):
        raise ValueError(
            f"costs must be one Costs or a list of {schedule.num_stages} (one per stage), "
            f"got {len(costs)} items"
        )
    return costs


def simulate(
    schedule: Schedule, costs: Costs | Sequence[Costs] | None = None, *, check: bool = True
) -> Simulation:
    """Simulate `schedule`; `costs` is one `Costs` for every stage or a list, one per stage.

    `check=False` skips `validate` (for callers that just built or validated the schedule).
    """
    costs = Costs() if costs is None else costs
    per_stage = _per_stage(schedule, costs)
    if check:
        validate(schedule)
    durations = {(s, k): c.duration(k) for s, c in enumerate(per_stage) for k in KINDS}
    try:
        times = _engine.run(schedule, durations, [c.comm for c in per_stage])
    except _engine.Stuck:
        validate(schedule)  # explains the deadlock with the grid
        raise ScheduleError("schedule deadlocks; run validate(schedule) for details") from None
    return _summarize(schedule, costs, per_stage, times)


def _summarize(schedule, costs, per_stage, times) -> Simulation:
    mem = {(s, k): c.memory(k) for s, c in enumerate(per_stage) for k in KINDS}
    new = tuple.__new__
    events, peak, memory, busy, span = [], [], [], [], []
    firsts, lasts = [], []
    for rank in range(schedule.pp):
        actions: list[Action] = schedule.program[rank]
        spans = times[rank]
        if not actions:
            peak.append(0.0), memory.append([]), busy.append(0.0), span.append(0.0)
            continue
        held, top, work = 0.0, 0.0, 0.0
        steps = [(spans[0][0], 0.0)]
        for a, (start, end) in zip(actions, spans, strict=True):
            s, k = a.stage, a.kind
            # tuple.__new__ skips NamedTuple's Python-level __new__: 24k events stay cheap
            events.append(new(Event, (rank, s, k, a.microbatch, start, end)))
            held += mem[s, k]
            if held > top:
                top = held
            steps.append((end, held))  # memory held once the action is done
            work += end - start
        peak.append(top)
        memory.append(steps)
        busy.append(work)
        firsts.append(spans[0][0])
        lasts.append(spans[-1][1])
        span.append(spans[-1][1] - spans[0][0])
    starts, ends = firsts or [0.0], lasts or [0.0]
    # ideal work of the busiest rank: m * sum over its stages of (F + I + W); with one
    # Costs for all stages this is DESIGN.md's m * v * (F + I + W)
    m = schedule.microbatches
    ideal = max(
        m * sum(per_stage[s].F + per_stage[s].I + per_stage[s].W for s in schedule.stages_on(r))
        for r in range(schedule.pp)
    )
    cost = max(span)
    return Simulation(
        schedule=schedule,
        costs=costs,
        events=events,
        makespan=max(ends) - min(starts),
        bubble_rate=(cost - ideal) / cost if cost > 0 else 0.0,
        peak_memory=peak,
        memory=memory,
        busy=busy,
        span=span,
        idle=[s - b for s, b in zip(span, busy, strict=True)],
    )


def bubble_rate(events: Iterable[Event]) -> float:
    """``(cost - work) / cost`` for any events, simulated or measured.

    cost = the longest rank span (first start to last end), work = the busiest rank's busy
    time. For a simulation the busiest rank's busy time is m * sum over its stages of
    (F + I + W), so this is exactly ``Simulation.bubble_rate``; a measured trace gets the
    same formula and so can be compared with its simulation.
    """
    spans: dict[int, list[float]] = {}  # rank -> [first start, last end, busy]
    for e in events:
        lo, hi, busy = spans.get(e.rank, [e.start, e.end, 0.0])
        spans[e.rank] = [min(lo, e.start), max(hi, e.end), busy + e.end - e.start]
    if not spans:
        return 0.0
    cost = max(hi - lo for lo, hi, _ in spans.values())
    work = max(busy for *_, busy in spans.values())
    return (cost - work) / cost if cost > 0 else 0.0
