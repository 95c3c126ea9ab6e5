"""Steady-state throughput: a schedule over several iterations, against 1F1B on the same model.

One iteration's makespan is what a learner sees first, but training runs iterations back to
back, and whether a schedule's cool-down may overlap the next iteration's warm-up depends on
the optimizer step. With a synchronised step (gradient clipping, a NaN check: every rank
waits for all) the iterations repeat one makespan apart; without it (the Zero Bubble paper's
optimizer post-validation) each rank starts its next iteration as soon as its own program
allows, and the longest rank span, what the bubble rate counts, sets the pace. ZB-H2 gains
over ZB-H1 only in the second case.

The baseline is 1F1B on the same ranks doing the same work: rank r's stage costs what all of
the schedule's stages on rank r cost together (one `Costs` is a rank's share already, so
1F1B gets it as it is; a list, one per stage, is summed per rank).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from zbkit.schedules.builders import build_schedule
from zbkit.schedules.core.costs import Costs, per_stage
from zbkit.schedules.core.schedule import Schedule
from zbkit.schedules.sim.simulate import Simulation, simulate


@dataclass(frozen=True)
class Throughput:
    """Microbatches per unit time in the steady state of `iterations` iterations."""

    synced: float  # every rank waits for all at the optimizer step
    unsynced: float  # each rank goes on when its own program allows (post-validation)
    baseline_synced: float  # 1F1B on the same ranks and work, synchronised
    baseline_unsynced: float  # ... and not
    iterations: int

    def speedup(self, synced: bool = True) -> float:
        """This schedule's throughput over 1F1B's, both with or both without the sync."""
        mine, base = (
            (self.synced, self.baseline_synced)
            if synced
            else (self.unsynced, self.baseline_unsynced)
        )
        return mine / base if base > 0 else 0.0

    def __str__(self) -> str:
        return (
            f"throughput (microbatches per unit time, steady state of {self.iterations} "
            f"iterations): {self.synced:.4g} with the optimizer step synchronised, "
            f"{self.unsynced:.4g} without (post-validation); over 1F1B on the same work: "
            f"{self.speedup(True):.3f}x and {self.speedup(False):.3f}x"
        )


def rank_costs(schedule: Schedule, costs: Costs | Sequence[Costs] | None) -> list[Costs]:
    """Per rank: what all of its stages cost together (1F1B's stage for the same work)."""
    stages = per_stage(costs, schedule.stage_to_rank)
    out = []
    for r in range(schedule.pp):
        mine = [stages[s] for s in schedule.stages_on(r)] or [Costs(0, 0, 0, 0, 0, 0)]
        out.append(
            Costs(
                F=sum(c.F for c in mine),
                I=sum(c.I for c in mine),
                W=sum(c.W for c in mine),
                comm=max(c.comm for c in mine),
                mem_activation=sum(c.mem_activation for c in mine),
                mem_weight=sum(c.mem_weight for c in mine),
            )
        )
    return out


def throughput(
    schedule: Schedule,
    costs: Costs | Sequence[Costs] | None = None,
    iterations: int = 2,
    *,
    simulated: Simulation | None = None,
) -> Throughput:
    """`schedule`'s steady-state throughput with and without the optimizer step's sync,
    next to 1F1B's on the same ranks and work (see the module docstring).

    Synchronised iterations repeat one makespan apart, so one iteration tells their rate;
    without the sync the period between the last two of `iterations` is the steady state's
    (it settles by the second iteration for every built-in schedule; the tests check it).
    `simulated`: one iteration of `schedule` under `costs` already simulated (the CLI and
    the explorer have it), used for the synchronised rate instead of simulating it again.
    """
    if not isinstance(iterations, int) or iterations < 2:
        raise ValueError(f"throughput needs iterations >= 2 for a steady state, got {iterations}")
    base = build_schedule("1f1b", pp=schedule.pp, microbatches=schedule.microbatches)
    base_costs = rank_costs(schedule, costs)

    def rate(s: Schedule, c: Costs | Sequence[Costs] | None, sync: bool) -> float:
        k = 1 if sync else iterations
        return simulate(s, c, iterations=k, optimizer_sync=sync).throughput

    if simulated is not None and simulated.iterations != 1:
        raise ValueError("throughput(simulated=...) takes a simulation of one iteration")
    return Throughput(
        synced=simulated.throughput if simulated is not None else rate(schedule, costs, True),
        unsynced=rate(schedule, costs, False),
        baseline_synced=rate(base, base_costs, True),
        baseline_unsynced=rate(base, base_costs, False),
        iterations=iterations,
    )
