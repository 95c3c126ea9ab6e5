"""`Costs`: what one rank's share of the model takes, in time and in memory, per microbatch.

One rule makes schedules comparable: a single `Costs` is one rank's share of the model (1/p of
it) for one microbatch. A schedule that puts v stages (chunks) on a rank gives each of them 1/v
of that share, so ZB-V (two chunks per rank) and ZB-H1 (one) do the same work on the same
model. A list of `Costs` is per stage, taken as it is (what `measure` returns from a real run).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from zbkit.schedules.core.action import KINDS

__all__ = [
    "MEMORY_UNIT",
    "TOL",
    "Costs",
    "beyond",
    "cost_table",
    "keyed_costs",
    "running_peak",
    "one_f_one_b_peak",
    "per_stage",
    "stage_costs",
]

# the one tolerance: times and memory closer than this (relative to 1, or to their size where
# `beyond` says) are equal; sums of the same costs in another order differ by about 1e-15
TOL = 1e-9

# the unit of every simulated memory number (peaks, limits, axes), whatever the schedule:
# one microbatch's activations on one rank's share of the model (x Costs.mem_activation)
MEMORY_UNIT = "rank-microbatches"


@dataclass(frozen=True, slots=True)
class Costs:
    """Time and memory of one rank's share of the model on one microbatch (any consistent
    units): its forward F, input-gradient I and weight-gradient W, and the activations it holds.

    A schedule with v stages (chunks) per rank gives each stage `share(v)`: 1/v of the times
    and of the memory, so one `Costs` compares every schedule on the same model (ZB-V's two
    half-size chunks against ZB-H1's one). Memory is then counted in units of one rank's
    activations for one microbatch everywhere: 1F1B's rank 0 peaks at p of them, ZB-V too.
    `comm` (one hop between ranks) and `overlap` are not divided: a chunk sends as large an
    activation as a whole stage does. A list of `Costs`, one per stage, is taken as it is.

    Example::

        from zbkit.schedules import Costs, build_schedule, simulate

        costs = Costs(F=1, I=1, W=1)  # or measured: Costs.parse("18.5,18.1,9.3,0.6")
        for name in ("1f1b", "zb-h1", "zb-v"):
            sim = simulate(build_schedule(name, pp=4, microbatches=8), costs)
            print(name, round(sim.bubble_rate, 3), max(sim.peak_memory))
        # 1f1b 0.273 4.0, zb-h1 0.111 4.0, zb-v 0.0 4.0: less bubble, the same peak (p)
        assert costs.share(2) == Costs(F=0.5, I=0.5, W=0.5, mem_activation=0.5)
    """

    F: float = 1.0  #: forward
    #: backward for the input gradient (the paper's "B")
    I: float = 1.0  # noqa: E741
    W: float = 1.0  #: backward for the weight gradient
    comm: float = 0.0  #: added to every wait on another rank
    mem_activation: float = 1.0  #: held from F until I (M_B in the paper)
    mem_weight: float = 0.0  #: held from I until W (M_W in the paper)
    #: time saved when this stage's forward runs overlapped with a backward (torch's
    #: OVERLAP_F_B, DualPipe's pairs: one's communication hidden behind the other's compute);
    #: the pair takes F + the backward's time - overlap, never less than its longer half
    overlap: float = 0.0

    def __post_init__(self) -> None:
        for name in ("F", "I", "W", "comm", "mem_activation", "mem_weight", "overlap"):
            value = getattr(self, name)
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if not ok or not math.isfinite(value) or value < 0:
                raise ValueError(f"Costs.{name} must be a finite number >= 0, got {value!r}")

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

    def share(self, v: int) -> Costs:
        """One of v equal stages on a rank: times and memory divided by v (comm, overlap kept)."""
        if v == 1:
            return self
        return Costs(self.F / v, self.I / v, self.W / v, self.comm,
                     self.mem_activation / v, self.mem_weight / v, self.overlap)  # fmt: skip

    def duration(self, kind: str) -> float:
        """How long an action of `kind` takes: the sum of its parts (B = I + W)."""
        return sum(getattr(self, part) for part in KINDS[kind].parts)

    def memory(self, kind: str) -> float:
        """How an action of `kind` changes the memory held (F +act, I +weight-act, ...)."""
        k = KINDS[kind]
        return k.act * self.mem_activation + k.weight * self.mem_weight


def per_stage(
    costs: Costs | Sequence[Costs] | None, stage_to_rank: Sequence[int], who: str = ""
) -> list[Costs]:
    """One `Costs` per stage: from one `Costs` (a rank's share, split evenly over the stages
    each rank holds), a list (one per stage, as it is) or None (`Costs()`, likewise split)."""
    num_stages = len(stage_to_rank)
    if costs is None or isinstance(costs, Costs):
        whole = Costs() if costs is None else costs
        held = Counter(stage_to_rank)  # stages per rank
        return [whole.share(held[r]) for r in stage_to_rank]
    prefix = f"{who}: " if who else ""
    if isinstance(costs, str) or not isinstance(costs, Sequence):
        hint = f" (Costs.parse({costs!r}) reads that form)" if isinstance(costs, str) else ""
        raise ValueError(
            f"{prefix}costs must be one Costs or a list of {num_stages} (one per stage), got "
            f"{type(costs).__name__} {costs!r}{hint}"
        )
    costs = list(costs)
    if len(costs) != num_stages or not all(isinstance(c, Costs) for c in costs):
        raise ValueError(
            f"{prefix}costs must be one Costs or a list of {num_stages} (one per stage), "
            f"got {len(costs)} items"
        )
    return costs


def one_f_one_b_peak(stage_to_rank: Sequence[int], costs: Sequence[Costs]) -> float:
    """What 1F1B's rank 0 holds: p microbatches of the largest rank share of activations
    (zb-auto's and `solve`'s default memory limit); `costs` one per stage."""
    held = [0.0] * (max(stage_to_rank) + 1)
    for s, r in enumerate(stage_to_rank):
        held[r] += costs[s].mem_activation
    return len(held) * max(held)


def least_peak(stage_to_rank: Sequence[int], costs: Sequence[Costs]) -> float:
    """The least any order holds: some rank holds one microbatch's activations of all its
    stages at once (the V's first chunk until the second chunk's I has run); `costs` one per
    stage."""
    held = [0.0] * (max(stage_to_rank) + 1)
    for s, r in enumerate(stage_to_rank):
        held[r] += costs[s].memory("F")
    return max(held)


def stage_costs(
    costs: Costs | Sequence[Costs] | None, placed: Iterable[tuple[int, int]]
) -> dict[int, Costs]:
    """Each stage's `Costs` from (stage, rank) pairs seen (a trace's or a drawing's events),
    by `per_stage`'s rule: one `Costs` is a rank's share, split over the stages it holds."""
    where = dict(placed)  # stage -> rank
    if costs is not None and not isinstance(costs, Costs):
        return {s: costs[s] for s in where}
    whole = Costs() if costs is None else costs
    held = Counter(where.values())
    return {s: whole.share(held[r]) for s, r in where.items()}


# ---- the one cost table and the one tolerance, as every walk reads them -----------------
def beyond(bound: float) -> float:
    """`bound` plus the tolerance, relative to its size: a span up to it is not slower."""
    return bound + TOL * max(1.0, abs(bound)) if bound < math.inf else bound


def cost_table(
    costs: Sequence[Costs], kinds: Iterable[str] = KINDS
) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """Per stage and kind: duration and memory change, from `Costs` (looked up ~10^4 times
    per schedule, so read once)."""
    kinds = tuple(kinds)
    return (
        [{k: c.duration(k) for k in kinds} for c in costs],
        [{k: c.memory(k) for k in kinds} for c in costs],
    )


def keyed_costs(
    costs: Sequence[Costs],
) -> tuple[dict[tuple[int, str], float], dict[tuple[int, str], float]]:
    """(durations, memory changes) keyed by (stage, kind) for every kind of `KINDS`: what the
    engine (`engine.run`) and the memory checks of a finished program read."""
    dur, mem = cost_table(costs)
    return (
        {(s, k): d for s, row in enumerate(dur) for k, d in row.items()},
        {(s, k): d for s, row in enumerate(mem) for k, d in row.items()},
    )


def running_peak(deltas: Iterable[float]) -> float:
    """The most a rank holds (at least 0) running its memory changes in order: one action
    at a time, so the running maximum is the peak, whatever the timing."""
    return max(0.0, max(accumulate(deltas), default=0.0))
