"""The demo's numbers from measured traces, and the tables it prints.

A measured trace and a simulation have the same events ``(rank, stage, kind, microbatch,
start, end)``, so everything here reads both the same way. A comparison of schedules uses one
cost set: each block's F, I and W measured once (``zbkit.schedules.measure``), summed per
stage of each schedule (``stage_costs``), and one hop latency pooled over every run
(``compare``); so the simulated speed-ups compare like with like, and so do the measured ones
set beside them (``speedup_rows``). The HTML report (``_html``) shows the same rows.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import torch

from zbkit.pipeline import Trace
from zbkit.schedules import Costs, Schedule, Simulation, bubble_rate, simulate
from zbkit.schedules.core.action import PARTS
from zbkit.schedules.core.costs import MEMORY_UNIT
from zbkit.schedules.measure import hop_latency, measured_costs


def grad_difference(per_rank: Sequence[dict], expected: Mapping[str, torch.Tensor | None]) -> float:
    """Largest |pipeline - one process| over every parameter; inf if one is missing or extra.

    ``per_rank``: each rank's ``{parameter name: grad or None}`` for the stages it holds.
    """
    worst, seen = 0.0, set()
    for grads in per_rank:
        for name, got in grads.items():
            seen.add(name)
            want = expected.get(name)
            if (got is None) != (want is None):
                return float("inf")
            if got is not None:
                worst = max(worst, (got - want).abs().max().item())
    return worst if seen == set(expected) else float("inf")


# ---------------------------------------------------------------------- one cost set
def stage_costs(
    block_costs: Sequence[Costs],
    spans: Sequence[tuple[int, int]],
    scale: float = 1.0,
    ranks: int | None = None,
) -> list[Costs]:
    """Per stage: the sum of its blocks' F, I and W (``spans``: blocks ``(first, last)`` per
    stage), times ``scale``. Every schedule of a comparison gets its stages' costs from the
    same measured blocks, so a 1f1b stage of two blocks costs what two zb-v chunks cost.
    Given ``ranks``, a stage's ``mem_activation`` is its share of a rank's blocks, so memory
    counts rank-microbatches (a zb-v chunk of half a rank's blocks holds 1/2), as everywhere."""
    per_rank = (spans[-1][1] - spans[0][0]) / ranks if ranks else None
    out = []
    for first, last in spans:
        mine = block_costs[first:last]
        parts = {p: scale * sum(getattr(c, p) for c in mine) for p in PARTS}
        share = (last - first) / per_rank if per_rank else 1.0
        out.append(Costs(**parts, mem_activation=share))
    return out


# ---------------------------------------------------------------------- one schedule's numbers
@dataclass
class Run:
    """What one schedule did on the ranks, beside its simulation with the comparison's costs."""

    name: str
    schedule: Schedule
    step: float  # seconds: median over rounds of the slowest rank's step
    trace: Trace  # the round with the median makespan, every rank merged
    sim: Simulation  # the schedule simulated with the comparison's costs and hop
    grad_diff: float | None = None  # largest |pipeline - one process| (real stages only)

    @property
    def bubble(self) -> float:
        return bubble_rate(self.trace.events)

    unit = MEMORY_UNIT  # what the memory counts count: a microbatch of a rank's blocks

    @property
    def peaks(self) -> list[float]:
        """Per rank, the measured peak weighed as the simulation weighs it (its costs)."""
        return self.trace.peak_for(self.sim.costs)


def compare(
    schedules: dict[str, Schedule],
    runs: Mapping[str, Sequence[dict]],
    costs: dict[str, list[Costs]],
    expected: Mapping[str, torch.Tensor | None] | None = None,
) -> tuple[list[Run], float]:
    """Every schedule's run beside its simulation with ``costs[name]`` (one measured cost set
    for all) and one hop latency: the median over every schedule's measured rounds.

    ``runs[name]``: every rank's ``{"times", "traces", "grads"?}`` (traces on rank 0, one per
    round). Returns the runs and the hop latency (seconds).
    """
    hops = [hop_latency(t.events) for per_rank in runs.values() for t in per_rank[0]["traces"]]
    comm = statistics.median(hops) if hops else 0.0
    out = []
    for name, per_rank in runs.items():
        traces: list[Trace] = per_rank[0]["traces"]
        rounds = zip(*(r["times"] for r in per_rank), strict=True)  # per round: every rank
        step = statistics.median(max(times) for times in rounds)
        spans = [t.makespan for t in traces]
        typical = traces[spans.index(sorted(spans)[len(spans) // 2])]
        sim = simulate(schedules[name], [replace(c, comm=comm) for c in costs[name]])
        diff = None
        if expected is not None:
            diff = grad_difference([r["grads"] for r in per_rank], expected)
        out.append(Run(name, schedules[name], step, typical, sim, diff))
    return out, comm


def slowdown(runs: Sequence[Run], costs: dict[str, list[Costs]]) -> float:
    """How much longer the runs' actions took than the costs say, median over schedules: the
    sum over stages of measured median F + I + W over that of ``costs``."""
    ratios = []
    for r in runs:
        measured = measured_costs(r.trace.events, r.schedule.num_stages)
        work = sum(c.F + c.I + c.W for c in costs[r.name])
        ratios.append(sum(c.F + c.I + c.W for c in measured) / work if work else 1.0)
    return statistics.median(ratios)


# ---------------------------------------------------------------------- the tables
SPEEDUP_HEADER = ("schedule", "step ms", "sim ms", "speed-up run", "speed-up sim", "run / sim",
                  "bubble run", "bubble sim")  # fmt: skip
REAL_HEADER = ("schedule", "step ms", "sim ms", "bubble run", "bubble sim", "peak held run | sim",
               "held in", "peak act. bytes", "max grad diff")  # fmt: skip


def format_counts(xs: Iterable[float]) -> str:
    """Per rank, activations held: '2 1'."""
    return " ".join(f"{x:g}" for x in xs)


def format_bytes(values: Sequence[int]) -> str:
    """Per rank, one unit for all: '1.21 0.93 0.61 0.30 MiB'."""
    unit, div = ("MiB", 2**20) if max(values, default=0) >= 2**20 else ("KiB", 2**10)
    return " ".join(f"{v / div:.{2 if unit == 'MiB' else 1}f}" for v in values) + f" {unit}"


def speedup_rows(runs: Sequence[Run], baseline: str) -> list[list[str]]:
    """Step time and speed-up over ``baseline``, measured and simulated with the same costs,
    and their ratio (1.00: the run gains exactly what the simulation says)."""
    base = next(r for r in runs if r.name == baseline)
    rows = []
    for r in runs:
        run, sim = base.step / r.step, base.sim.makespan / r.sim.makespan
        rows.append([r.name, f"{r.step * 1e3:.1f}", f"{r.sim.makespan * 1e3:.1f}",
                     f"{run:.2f}x", f"{sim:.2f}x", f"{run / sim:.2f}",
                     f"{r.bubble:.1%}", f"{r.sim.bubble_rate:.1%}"])  # fmt: skip
    return rows


def real_rows(runs: Sequence[Run]) -> list[list[str]]:
    """Step time, bubbles, memory (counts in the schedule's units, and bytes), gradients."""
    return [
        [
            r.name,
            f"{r.step * 1e3:.1f}",
            f"{r.sim.makespan * 1e3:.1f}",
            f"{r.bubble:.1%}",
            f"{r.sim.bubble_rate:.1%}",
            f"{format_counts(r.peaks)} | {format_counts(r.sim.peak_memory)}",
            r.unit,
            format_bytes(r.trace.peak_bytes),
            f"{r.grad_diff:.2e}",
        ]  # fmt: skip
        for r in runs
    ]


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Aligned plain-text table: the first column left, the numbers right."""
    table = [header, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        )
        for r in table
    )


class Progress:
    """A text progress bar on stderr: redrawn in place on a terminal, one line per step else."""

    def __init__(self, total: int, width: int = 24) -> None:
        self.total, self.done, self.width = total, 0, width
        self.tty = sys.stderr.isatty()
        self.t0 = time.perf_counter()

    def step(self, what: str) -> None:
        self.done += 1
        filled = self.width * self.done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        line = f"[{bar}] {self.done}/{self.total} {what} ({time.perf_counter() - self.t0:.1f} s)"
        end = "\n" if not self.tty or self.done == self.total else ""
        print(("\r\033[K" if self.tty else "") + line, end=end, file=sys.stderr, flush=True)
