"""`simulate(schedule, costs)`: when every action runs, the bubble rate and the memory.

Each rank runs its program in order, one action at a time, starting an action as soon as
the rank is free and its inputs exist (plus `comm` when they come from another rank).
Durations: F, I, W, and B = I + W. Memory per rank: F holds one activation, I turns it
into what W needs (`mem_weight`), W frees that, B frees the activation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from zbkit._display import show
from zbkit.schedules.core.action import PARTS, Action, Overlap
from zbkit.schedules.core.costs import Costs, keyed_costs, per_stage, running_peak
from zbkit.schedules.core.events import (
    CommEvent,
    Event,
    bubble_of,
    memory_steps,
)
from zbkit.schedules.core.plan import Comm, CommOp
from zbkit.schedules.core.schedule import Schedule, ScheduleError, derive_plan, expect_schedule
from zbkit.schedules.sim import engine
from zbkit.schedules.sim.validate import check_actions, deadlock_error, validate

__all__ = ["Simulation", "simulate"]


@dataclass
class Simulation:
    """When every action of `schedule` runs under `costs`, and what that adds up to.

    The numbers (makespan, bubble, peaks, per-rank busy/span/idle, each action's memory
    `deltas`) are computed by `simulate`; the per-action `events` and the `memory` steps
    are made from the same timing when first read (a slider over a large schedule reads the
    numbers only: at pp=64, m=512 the 196,608 events cost as much as the timing itself).
    """

    schedule: Schedule
    costs: Costs | list[Costs]
    makespan: float  # last end - first start, over all ranks
    bubble_rate: float  # (cost - m*(F+I+W)) / cost, cost = the longest rank span
    peak_memory: list[float]  # per rank
    busy: list[float]  # per rank: time spent computing
    span: list[float]  # per rank: first start to last end
    idle: list[float]  # per rank: span - busy (the bubbles)
    # per rank, the program items as simulated (a copy: the schedule may be edited later)
    # and (start, end) of each (the engine's timing), and the costs per stage: what
    # `events` is made from
    items: dict[int, list[Action | Overlap]] = field(default_factory=dict, repr=False)
    times: dict[int, list[tuple[float, float]]] = field(default_factory=dict, repr=False)
    per_stage: list[Costs] = field(default_factory=list, repr=False)
    deltas: list[float] = field(default_factory=list, repr=False)  # each event's memory change
    iterations: int = 1  # training iterations simulated back to back (`schedule`: all of them)
    optimizer_sync: bool = True  # whether all ranks synchronise between iterations
    period: float = 0.0  # the steady state's time per iteration (one iteration: the makespan)
    _events: list[Event] | None = field(default=None, repr=False, compare=False)
    _memory: list | None = field(default=None, repr=False, compare=False)

    @property
    def throughput(self) -> float:
        """Microbatches per unit time in the steady state: m / `period`, the time between
        consecutive iterations (not diluted by the first iteration's warm-up)."""
        m = self.schedule.microbatches // self.iterations
        return m / self.period if self.period > 0 else 0.0

    @property
    def events(self) -> list[Event]:
        """Every action's `Event`, per rank in program order (an overlapped pair: two)."""
        if self._events is None:
            self._events = _events(self.items, self.times, self.per_stage)
        return self._events

    @property
    def memory(self) -> list[list[tuple[float, float]]]:
        """Per rank: (time, held memory) steps (`memory_steps`), made when first asked: a
        slider needs only the peaks, which come from one pass (the same running maximum)."""
        if self._memory is None:
            self._memory = memory_steps(self.events, self.deltas, self.schedule.pp)
        return self._memory

    @property
    def comm(self) -> list[CommEvent]:
        """The modelled waits on receives, in ``Trace.comm``'s form: for each action of a
        rank's plan (``derive_plan``) that receives from another rank, the time the rank sat
        idle before it (from its previous action's end, or 0). Computed when asked."""
        per_rank: dict[int, list[Event]] = {}
        for e in self.events:
            per_rank.setdefault(e.rank, []).append(e)  # program order per rank
        out: list[CommEvent] = []
        for rank, events in sorted(per_rank.items()):
            free, index, waiting = 0.0, 0, []
            for step in derive_plan(self.schedule, rank):
                if isinstance(step, Comm):
                    if step.op is CommOp.RECV:
                        waiting.append(str(step))
                    continue
                first, last = events[index], events[index + len(step.halves) - 1]
                index += len(step.halves)  # an overlapped pair has two events
                if waiting and first.start > free:
                    out.append(CommEvent(rank, " + ".join(waiting), free, first.start))
                waiting, free = [], last.end
        return out

    def __repr__(self) -> str:
        return (
            f"Simulation({self.schedule.name!r}, pp={self.schedule.pp}, "
            f"m={self.schedule.microbatches}, makespan={self.makespan:.4g}, "
            f"bubble_rate={self.bubble_rate:.4f}, peak_memory={_fmt(self.peak_memory)})"
        )

    def _repr_html_(self) -> str:
        """A notebook shows the grid, kinds coloured, under the numbers (drawn by viz)."""
        return show(self)


def _fmt(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"


def simulate(
    schedule: Schedule,
    costs: Costs | Sequence[Costs] | None = None,
    *,
    check: bool = True,
    iterations: int = 1,
    optimizer_sync: bool = True,
) -> Simulation:
    """Simulate `schedule`; `costs` is one `Costs` (a rank's share of the model, split evenly
    over the stages each rank holds: every schedule runs the same model) or a list, one per
    stage, taken as it is.

    `check=False` skips `validate` (for callers that just built or validated the schedule).
    `iterations=k` runs k training iterations back to back (iteration i's microbatches are
    numbered i*m .. i*m+m-1). With `optimizer_sync=True` every rank waits until all ranks
    finished an iteration before it starts the next (the optimizer step's synchronisation:
    gradient clipping, a NaN check), so iterations repeat one makespan apart; with `False`
    each rank starts its next iteration as soon as its own program allows (the Zero Bubble
    paper's optimizer post-validation), and one iteration's cool-down overlaps the next one's
    warm-up. `Simulation.throughput` is the steady state's microbatches per unit time.
    """
    expect_schedule(schedule, "simulate")
    if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 1:
        raise ValueError(f"simulate: iterations must be an int >= 1, got {iterations!r}")
    costs = Costs() if costs is None else costs
    per_stage_costs = per_stage(costs, schedule.stage_to_rank)
    if check:  # what validate checks; the deadlock check is the walk below
        check_actions(schedule)
    durations = keyed_costs(per_stage_costs)[0]
    ran = repeated(schedule, iterations) if iterations > 1 and not optimizer_sync else schedule
    try:
        comm = [c.comm for c in per_stage_costs]
        times = engine.run(ran, durations, comm, [c.overlap for c in per_stage_costs])
    except engine.Stuck as stuck:
        if check:  # the validator's message: who waits on whom, with the grid
            raise deadlock_error(schedule, stuck) from None
        validate(schedule)  # explains the deadlock (or another fault) with the grid
        raise ScheduleError("schedule deadlocks; run validate(schedule) for details") from None
    if iterations > 1 and optimizer_sync:  # every iteration starts from the same state:
        ran = repeated(schedule, iterations)  # the first one's timing, a makespan apart
        times = _shifted(times, iterations)
    sim = _summarize(ran, costs, per_stage_costs, times)
    sim.iterations, sim.optimizer_sync = iterations, optimizer_sync
    # one iteration's period is its makespan; otherwise the last two iterations' ends apart
    sim.period = sim.makespan if iterations == 1 else _period(schedule, times, iterations)
    return sim


def repeated(schedule: Schedule, iterations: int) -> Schedule:
    """`schedule`'s program `iterations` times in a row on every rank, iteration i's
    microbatches renumbered i*m .. i*m+m-1 (what `simulate(iterations=k)` runs)."""
    m = schedule.microbatches

    def moved(item: Action | Overlap, shift: int) -> Action | Overlap:
        if type(item) is Action:
            return Action.trusted(item.stage, item.kind, item.microbatch + shift)
        f, b = (moved(h, shift) for h in item.halves)
        return Overlap(cast(Action, f), cast(Action, b))

    program = {
        r: [moved(a, i * m) for i in range(iterations) for a in items]
        for r, items in schedule.program.items()
    }
    return Schedule(program, list(schedule.stage_to_rank), m * iterations, schedule.name)


def _shifted(
    times: dict[int, list[tuple[float, float]]], iterations: int
) -> dict[int, list[tuple[float, float]]]:
    """One iteration's times repeated, each copy one makespan after the one before."""
    spans = [t for row in times.values() for t in row]
    t0 = min((s for s, _ in spans), default=0.0)
    length = max((e for _, e in spans), default=0.0) - t0
    return {
        r: [(s + i * length, e + i * length) for i in range(iterations) for s, e in row]
        for r, row in times.items()
    }


def _period(schedule: Schedule, times: dict[int, list[tuple[float, float]]], k: int) -> float:
    """The steady state's time per iteration, k >= 2: between the ends of the last two
    iterations (an iteration ends when its last rank does)."""

    def end(i: int) -> float:  # when iteration i's last action ends, over the ranks
        return max(row[(i + 1) * len(schedule.program[r]) - 1][1]
                   for r, row in times.items() if row)  # fmt: skip

    return end(k - 1) - end(k - 2)


def _halves(r: int, pair: Overlap, start: float, end: float, costs: list[Costs]) -> list[Event]:
    """An overlapped pair's two events: its span cut in proportion to the halves' times."""
    f, b = pair.halves
    tf, tb = costs[f.stage].duration(f.kind), costs[b.stage].duration(b.kind)
    mid = start + (end - start) * (tf / (tf + tb) if tf + tb > 0 else 0.5)
    return [Event(r, f.stage, "F", f.microbatch, start, mid, True),
            Event(r, b.stage, b.kind, b.microbatch, mid, end, True)]  # fmt: skip


def _changes(items: Sequence[Action | Overlap], change: dict) -> list[float]:
    """A rank's memory changes in program order, an overlapped pair's two halves each."""
    if all(type(a) is Action for a in items):  # the common case: one change per item
        return [change[a.stage, a.kind] for a in cast(Sequence[Action], items)]
    return [change[h.stage, h.kind] for a in items for h in a.halves]


def _events(
    programs: dict[int, list[Action | Overlap]],
    times: dict[int, list[tuple[float, float]]],
    per_stage_costs: list[Costs],
) -> list[Event]:
    """The events per rank in program order, from the engine's times."""
    new = tuple.__new__
    events: list[Event] = []
    for rank, items in programs.items():
        spans = times[rank]
        if all(type(a) is Action for a in items):  # the common case: one event per item
            # tuple.__new__ skips NamedTuple's Python-level __new__: 100k events stay cheap
            events += [
                new(Event, (rank, a.stage, a.kind, a.microbatch, start, end, False))
                for a, (start, end) in zip(cast(list[Action], items), spans, strict=True)
            ]
        else:  # overlapped pairs: two events each, in order
            for a, (start, end) in zip(items, spans, strict=True):
                if type(a) is Action:
                    events.append(Event(rank, a.stage, a.kind, a.microbatch, start, end))
                else:
                    events += _halves(rank, a, start, end, per_stage_costs)
    return events


def _summarize(schedule, costs, per_stage_costs, times) -> Simulation:
    starts, ends, busy = [], [], []
    # each (stage, kind)'s memory change (`Costs.memory`, the one memory rule), asked once
    change = keyed_costs(per_stage_costs)[1]
    peak: list[float] = []
    deltas: list[float] = []
    items = {r: list(schedule.program.get(r, ())) for r in range(schedule.pp)}
    for rank in range(schedule.pp):
        spans = times[rank]
        # one action at a time in program order: the peak is the running maximum of the
        # changes in that order (what memory_steps' levels reach, without sorting them)
        mine = _changes(items[rank], change)
        deltas += mine
        peak.append(running_peak(mine))
        # its span is first start to last end (the numbers rank_spans gives for any events)
        starts.append(spans[0][0] if spans else 0.0)
        ends.append(spans[-1][1] if spans else 0.0)
        busy.append(sum(end - start for start, end in spans))
    span = [e - s for s, e in zip(starts, ends, strict=True)]
    # ideal work of the busiest rank: m * sum over its stages of (F + I + W); with one
    # Costs (a rank's share, split over its stages) this is m * (F + I + W)
    work = [0.0] * schedule.pp  # one pass over the stages (stages_on per rank is O(p^2))
    for s, r in enumerate(schedule.stage_to_rank):
        work[r] += sum(getattr(per_stage_costs[s], p) for p in PARTS)
    # overlapped pairs save time: then the busiest rank's busy time is the work
    ideal = min(schedule.microbatches * max(work), max(busy))
    cost = max(span)
    ran = [r for r in range(schedule.pp) if times[r]] or [0]
    return Simulation(
        schedule=schedule,
        costs=costs,
        makespan=max(ends[r] for r in ran) - min(starts[r] for r in ran),
        bubble_rate=bubble_of(cost, ideal),
        peak_memory=peak,
        busy=busy,
        span=span,
        idle=[s - b for s, b in zip(span, busy, strict=True)],
        items=items,
        times=times,
        per_stage=list(per_stage_costs),
        deltas=deltas,
    )
