"""ZB-V and the automatic schedule, both made by the greedy scheduler in `_build_greedy`.

zb-auto tries a few greedy policies (whether a W may delay an arriving I, whether F goes
before a ready I) plus the hand-written ZB-H1/ZB-H2 when they fit the memory limit, and
keeps the one `simulate` finds fastest. So it is never worse than those, and it never
holds more than `memory_limit`.
"""

from __future__ import annotations

from collections.abc import Sequence

from zbkit.schedules import _build_fixed as fixed
from zbkit.schedules._build_greedy import greedy
from zbkit.schedules.schedule import Schedule, ScheduleError
from zbkit.schedules.simulate import Costs, simulate
from zbkit.schedules.validate import validate

_POLICIES = [(fill, hold) for fill in (0.0, 0.5, 1.0) for hold in (0.0, 0.5, 1.0)]


def _costs(costs: Costs | Sequence[Costs] | None, stages: int, name: str) -> list[Costs]:
    if costs is None:
        return [Costs()] * stages
    if isinstance(costs, Costs):
        return [costs] * stages
    costs = list(costs)
    if len(costs) != stages or not all(isinstance(c, Costs) for c in costs):
        raise ValueError(f"{name}: costs must be a Costs or a list of {stages} (one per stage)")
    return costs


def _best(candidates: list[Schedule], costs: list[Costs], limit: float) -> Schedule:
    scored = []
    for schedule in candidates:
        try:
            validate(schedule)
        except ScheduleError:  # a hand-written pattern that does not fit these sizes
            continue
        sim = simulate(schedule, costs, check=False)
        if max(sim.peak_memory) <= limit + 1e-9:
            # the longest rank span decides the step time; then less memory is better
            scored.append((max(sim.span), max(sim.peak_memory), len(scored), schedule))
    return min(scored)[3]


def zb_v(
    pp: int,
    m: int,
    name: str,
    costs: Costs | Sequence[Costs] | None = None,
    memory_limit: float | None = None,
) -> Schedule:
    """ZB-V: stage s and stage 2p-1-s on rank s (a V); 1F1B's peak memory by default."""
    placement = [s if s < pp else 2 * pp - 1 - s for s in range(2 * pp)]
    per_stage = _costs(costs, 2 * pp, name)
    if memory_limit is None:
        # 1F1B's rank 0 holds p microbatches of its whole model part = 2p half-size chunks
        memory_limit = 2 * pp * max(c.mem_activation for c in per_stage)
    # the paper's hand-written V first (it wins ties), then the greedy policies, which do
    # better when the costs are unequal or the memory limit differs
    candidates = [Schedule(fixed.zb_v(pp, m), placement, m, name)]
    candidates += [
        Schedule(greedy(placement, m, per_stage, memory_limit, fill, hold), placement, m, name)
        for fill, hold in _POLICIES
    ]
    return _best(candidates, per_stage, memory_limit)


def zb_auto(
    pp: int,
    m: int,
    name: str,
    costs: Costs | Sequence[Costs] | None = None,
    memory_limit: float | None = None,
) -> Schedule:
    """Automatic zero-bubble schedule under `memory_limit` (default pp * mem_activation)."""
    placement = list(range(pp))
    per_stage = _costs(costs, pp, name)
    if memory_limit is None:
        memory_limit = pp * max(c.mem_activation for c in per_stage)
    if not isinstance(memory_limit, int | float) or memory_limit <= 0:
        raise ValueError(f"{name}: memory_limit must be a number > 0, got {memory_limit!r}")
    candidates = [
        Schedule(greedy(placement, m, per_stage, memory_limit, fill, hold), placement, m, name)
        for fill, hold in _POLICIES
    ]
    for handcrafted in (fixed.zb_h1, fixed.zb_h2):
        candidates.append(Schedule(handcrafted(pp, m), placement, m, name))
    return _best(candidates, per_stage, memory_limit)
