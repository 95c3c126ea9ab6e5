"""What a real pipeline step did: action timings, communication waits, memory held.

``Trace.events`` has the same form as ``Simulation.events`` ``(rank, stage, kind, microbatch,
start, end)``, so one drawing can show a measured run beside its simulation. Times are seconds:
from the step's start in ``LocalPipeline``; wall-clock on a ``ScheduleRunner`` rank (one clock
for all processes of a host), and from 0 again once ``Trace.merge`` joins the ranks.

The memory record counts, after every action, how many microbatches each stage really holds:
between F and I/B (activations) and between I and W (weight-gradient state). Weighted by a
``Costs`` (``mem_activation`` per activation, ``mem_weight`` per pending W) and placed in
time by the one memory rule of ``zbkit.schedules.core.events`` (growth at an action's start,
shrinking at its end), it is the quantity the simulator's memory model gives, so
``trace.memory_for(costs)`` is comparable with ``simulate(schedule, costs).memory``. The
weights are ``trace.costs``: ``Costs()`` unless set, and the repr says so. One ``Costs`` is
a rank's share, split over the stages it holds (``Costs``' rule), so the counts are in
rank-microbatches: a zb-v chunk's microbatch counts 1/2; pending Ws are free.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from os import PathLike
from typing import Any, NamedTuple

from zbkit._display import show
from zbkit.pipeline._profiler import read_profiles
from zbkit.schedules import Costs, Event, bubble_rate, memory_deltas, memory_steps
from zbkit.schedules.core.costs import stage_costs
from zbkit.schedules.core.events import CommEvent


class MemorySample(NamedTuple):
    """What ``stage`` (on ``rank``) holds at ``time``, right after one of its actions."""

    rank: int
    stage: int
    time: float
    activations: int  # microbatches between F and I/B
    weight_state: int  # microbatches between I and W
    activation_bytes: int = 0  # bytes of saved activations of those microbatches


@dataclass
class Trace:
    """Measured events of one or more ranks (``Trace.merge`` joins the ranks' traces)."""

    events: list[Event] = field(default_factory=list)
    comm: list[CommEvent] = field(default_factory=list)
    memory_samples: list[MemorySample] = field(default_factory=list)
    # weights of `memory` / `peak_memory` (None: Costs(), one unit per rank-microbatch)
    costs: Costs | list[Costs] | None = None

    def __repr__(self) -> str:
        ranks = sorted({e.rank for e in self.events})
        units = "" if self.costs is not None else " activations"
        return (
            f"Trace(ranks={ranks}, events={len(self.events)}, "
            f"makespan={self.makespan:.4g} s, peak_memory={self.peak_memory}{units})"
        )

    def _repr_html_(self) -> str:
        """A notebook shows what each rank ran, kinds coloured, under the numbers (viz)."""
        return show(self)

    @classmethod
    def merge(cls, traces: Iterable[Trace | None]) -> Trace:
        """One trace from the per-rank traces (``launch`` returns them in rank order).

        A rank's own trace keeps wall-clock times (so traces of different ranks line up);
        the merged one is shifted so that the run starts at 0.
        """
        out = cls()
        for t in traces:
            if t is not None:
                out.events += t.events
                out.comm += t.comm
                out.memory_samples += t.memory_samples
                out.costs = t.costs if out.costs is None else out.costs
        t0 = min((e.start for e in out.events), default=0.0)
        out.events = sorted(
            (e._replace(start=e.start - t0, end=e.end - t0) for e in out.events),
            key=lambda e: (e.rank, e.start),
        )
        out.comm = [c._replace(start=c.start - t0, end=c.end - t0) for c in out.comm]
        out.memory_samples = [s._replace(time=s.time - t0) for s in out.memory_samples]
        return out

    @classmethod
    def from_profiler(
        cls,
        paths: str | PathLike | Iterable[str | PathLike],
        schedule: Any = None,
        *,
        ranks: list[int] | None = None,
        step: int = -1,
    ) -> Trace:
        """The trace of a run from its torch.profiler Chrome traces, one file per rank.

        Reads torch.distributed.pipelining runs (the runtime schedules' ``PP:0F3`` ranges,
        ScheduleGPipe's ``Forward i``, Schedule1F1B's stage calls with ``with_stack=True``)
        and zbkit runs: every compute action once per rank, in the order it ran, on one clock
        from 0 (seconds), with the GPU span of its kernels where the trace has CUDA activity;
        torch's transfers in ``comm``. Details in ``zbkit.pipeline._profiler``.

        Args:
            paths: a folder of ``.json`` / ``.json.gz`` traces, one file, or a list of files.
            schedule: the run's schedule (a zbkit ``Schedule`` or a torch schedule object),
                placing the stages on ranks: needed for a one-process run's single file
                (``LocalPipeline``), and for ``Forward i`` / stage-call traces of a
                single-stage schedule that does not put stage r on rank r.
            ranks: the pipeline rank of each file, in order (default: the trace's
                ``distributedInfo.rank``, else the file's position).
            step: which ``ProfilerStep`` to read when the trace marks several (default: last).

        Example::

            with torch.profiler.profile() as prof:       # on each rank
                schedule.step(x, target=y)
            prof.export_chrome_trace(f"traces/trace_rank{rank}.json")
            trace = Trace.from_profiler("traces")        # anywhere, later
            viz.plot_schedule(trace)
        """
        per_rank = read_profiles(paths, schedule, ranks=ranks, step=step)
        return cls.merge(cls(events=p.events, comm=p.comm) for p in per_rank)

    @property
    def num_ranks(self) -> int:
        return max((e.rank for e in self.events), default=-1) + 1

    @property
    def makespan(self) -> float:
        """Last end minus first start, over all ranks."""
        if not self.events:
            return 0.0
        return max(e.end for e in self.events) - min(e.start for e in self.events)

    @property
    def bubble_rate(self) -> float:
        """The simulator's formula on the measured events (``zbkit.schedules.bubble_rate``)."""
        return bubble_rate(self.events)

    # ------------------------------------------------------------------ memory
    def memory_for(
        self, costs: Costs | list[Costs] | None = None
    ) -> list[list[tuple[float, float]]]:
        """Per rank: (time, memory held) steps, the measured counts weighted by ``costs``:
        one ``Costs`` or one per stage (default ``self.costs``, else ``Costs()``)."""
        if not (costs is None or isinstance(costs, Costs | list)):
            raise TypeError(
                f"weigh a trace's memory with a Costs (or one per stage), e.g. "
                f"trace.peak_for(Costs(mem_activation=1.0, mem_weight=0.3)), got {costs!r}"
            )
        weights = (self.costs if costs is None else costs) or Costs()  # one, or one per stage
        events: dict[int, list[Event]] = {}
        for e in sorted(self.events, key=lambda e: (e.rank, e.start)):
            events.setdefault(e.rank, []).append(e)
        samples: dict[int, list[MemorySample]] = {}
        for s in sorted(self.memory_samples, key=lambda s: (s.rank, s.time)):
            samples.setdefault(s.rank, []).append(s)
        out: list[list[tuple[float, float]]] = []
        for rank in range(max([*events, *samples], default=-1) + 1):
            mine, record = events.get(rank, []), samples.get(rank, [])
            if not self.memory_samples:  # events alone (e.g. built by hand): the costs' rule
                deltas = memory_deltas(mine, weights)
            elif len(mine) != len(record):  # one sample per action; else say what was recorded
                raise ValueError(
                    f"rank {rank} has {len(mine)} events but {len(record)} memory samples; a "
                    "trace records one of each per action"
                )
            else:  # what the stages really held, weighted
                held: dict[int, float] = {}  # stage -> weighted microbatches held
                deltas, level = [], 0.0
                stages = stage_costs(weights, ((s.stage, rank) for s in record))
                for sample in record:
                    c = stages[sample.stage]  # one Costs: this rank's share, split
                    held[sample.stage] = (
                        sample.activations * c.mem_activation + sample.weight_state * c.mem_weight
                    )
                    deltas.append(sum(held.values()) - level)
                    level += deltas[-1]
            # the same rule as the simulator's: growth at an action's start, shrinking at its end
            out.append(memory_steps(mine, deltas)[rank] if mine else [])
        return out

    @property
    def memory(self) -> list[list[tuple[float, float]]]:
        """Per rank: (time, memory held), weighted by ``self.costs`` (default ``Costs()``)."""
        return self.memory_for()

    def peak_for(self, costs: Costs | list[Costs] | None = None) -> list[float]:
        """Per rank: the most memory held at once, weighted as ``memory_for`` weighs it."""
        steps = self.memory_for(costs)
        return [max((h for _, h in per_rank), default=0.0) for per_rank in steps]

    @property
    def peak_memory(self) -> list[float]:
        """Per rank: the most memory held at once, weighted by ``self.costs``."""
        return self.peak_for()

    @property
    def peak_bytes(self) -> list[int]:
        """Per rank: the most bytes of saved activations held at once (all its stages)."""
        held: dict[int, dict[int, int]] = {}  # rank -> stage -> bytes now
        peak: dict[int, int] = {}
        for s in sorted(self.memory_samples, key=lambda s: (s.rank, s.time)):
            now = held.setdefault(s.rank, {})
            now[s.stage] = s.activation_bytes
            peak[s.rank] = max(peak.get(s.rank, 0), sum(now.values()))
        return [peak.get(r, 0) for r in range(max(peak, default=-1) + 1)]

    # ------------------------------------------------------------------ export
    def to_chrome(self, path: str | PathLike | None = None) -> dict[str, Any]:
        """Chrome-trace JSON (open in https://ui.perfetto.dev); written to ``path`` if given.

        One process per rank; thread 0 holds compute actions, thread 1 communication, and a
        counter track shows the memory held (weighted by ``self.costs``).
        """
        us = 1e6  # Chrome traces count microseconds
        out: list[dict[str, Any]] = []
        for r in range(self.num_ranks):
            out.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}})
            for tid, name in ((0, "compute"), (1, "comm")):
                out.append(
                    {"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": name}}
                )
        for e in self.events:
            out.append(
                {
                    "name": f"{e.stage}{e.kind}{e.microbatch}",
                    "cat": e.kind,
                    "ph": "X",
                    "pid": e.rank,
                    "tid": 0,
                    "ts": e.start * us,
                    "dur": (e.end - e.start) * us,
                    "args": {"stage": e.stage, "microbatch": e.microbatch},
                }
            )
        for c in self.comm:
            out.append(
                {
                    "name": c.label,
                    "cat": "comm",
                    "ph": "X",
                    "pid": c.rank,
                    "tid": 1,
                    "ts": c.start * us,
                    "dur": (c.end - c.start) * us,
                }
            )
        for rank, steps in enumerate(self.memory):
            for time, held in steps:
                out.append(
                    {
                        "name": "memory held",
                        "ph": "C",
                        "pid": rank,
                        "ts": time * us,
                        "args": {"held": held},
                    }
                )
        doc = {"traceEvents": out, "displayTimeUnit": "ms"}
        if path is not None:
            with open(path, "w") as f:
                json.dump(doc, f)
        return doc
