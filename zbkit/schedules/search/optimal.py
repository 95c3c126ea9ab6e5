"""`solve` and zb-opt: the exact solver (`zbkit.schedules.optimum`) started from zb-auto.

The solver proves the optimum faster from a good schedule: its value caps the goal and its
times start the search. zb-auto lives above the solver (its exact candidate is the solver),
so the warm start is taken here, by the caller, and handed in.
"""

from __future__ import annotations

from collections.abc import Sequence

from zbkit.schedules.core.costs import Costs
from zbkit.schedules.core.recent import Recent
from zbkit.schedules.core.schedule import Schedule
from zbkit.schedules.optimum.exact import OBJECTIVES, Solution, cp_sat, prove, setting
from zbkit.schedules.search.auto import search

__all__ = ["optimum", "solve"]


def solve(
    *,
    pp: int,
    microbatches: int,
    costs: Costs | Sequence[Costs] | None = None,
    memory_limit: float | None = None,
    placement: str = "linear",
    objective: str = "span",
    time_limit: float = 60.0,
    warm_start: bool = True,
) -> Solution:
    """The best in-order schedule for these sizes and costs under `memory_limit`, or the best
    found in `time_limit` seconds with a proven lower bound (`zbkit.schedules.optimum.exact`).
    The search starts from zb-auto's schedule (`warm_start=False`: from nothing, to time a
    proof alone: zb-auto already proves small settings itself)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"solve: objective must be one of {OBJECTIVES}, got {objective!r}")
    cp_sat()  # the extra's one-line error before any work
    where, per, limit = setting(pp, microbatches, costs, memory_limit, placement, "solve")
    warm = _zb_auto(pp, microbatches, per, limit, placement) if warm_start else None
    return prove(where, microbatches, per, limit, placement, objective, time_limit, warm)


def _zb_auto(pp: int, m: int, per: list[Costs], limit: float, placement: str) -> Schedule | None:
    try:
        return search(pp, m, "zb-auto", per, limit, placement).schedule
    except ValueError:  # nothing of zb-auto's fits: the solver starts from nothing
        return None


_RECENT: Recent[Solution] = Recent()  # solutions remembered by their arguments


def optimum(
    pp: int,
    m: int,
    name: str,
    costs: Costs | Sequence[Costs] | None,
    memory_limit: float | None,
    placement: str,
    time_limit: float,
) -> Schedule:
    """`solve`'s schedule named `name` (zb-opt), the last few kept: a proof takes seconds. It
    carries the solver's proof (`Schedule.proof`)."""
    if not isinstance(time_limit, int | float) or isinstance(time_limit, bool) or time_limit <= 0:
        raise ValueError(f"{name}: time_limit must be a number of seconds > 0, got {time_limit!r}")
    where, per, limit = setting(pp, m, costs, memory_limit, placement, name)
    key = (pp, m, tuple(per), limit, placement, float(time_limit))
    found = _RECENT.get(key, lambda: solve(
        pp=pp, microbatches=m, costs=per, memory_limit=limit, placement=placement,
        time_limit=time_limit,
    ))  # fmt: skip
    program = {r: list(actions) for r, actions in found.schedule.program.items()}
    return Schedule(program, list(found.schedule.stage_to_rank), m, name,
                    proof=found.schedule.proof)  # fmt: skip
