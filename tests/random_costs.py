"""Random per-stage costs for the tests that check a bound against an oracle on many settings
(the search's candidates, the solver's proofs)."""

from __future__ import annotations

import random

from zbkit.schedules import Costs


def random_costs(rng: random.Random, stages: int, uneven: bool) -> list[Costs]:
    """One rank's share drawn at random (comm and mem_weight zero half the time), for every
    stage; `uneven`: the last stage slower (F=2, I=2.5, W=1)."""
    one = Costs(F=rng.uniform(0.5, 2), I=rng.uniform(0.5, 2), W=rng.uniform(0.2, 1.5),
                comm=rng.choice([0.0, rng.uniform(0, 0.3)]), mem_activation=1.0,
                mem_weight=rng.choice([0.0, rng.uniform(0, 0.6)]))  # fmt: skip
    return [one] * (stages - 1) + [Costs(F=2.0, I=2.5, W=1.0) if uneven else one]


def random_setting(
    rng: random.Random, ranks: tuple[int, int], microbatches: tuple[int, int], uneven: bool
) -> tuple[str, int, int, list[Costs]]:
    """A placement, p and m in the given ranges (inclusive), and per-stage costs for them."""
    placement = rng.choice(["linear", "v"])
    p, m = rng.randint(*ranks), rng.randint(*microbatches)
    stages = 2 * p if placement == "v" else p
    return placement, p, m, random_costs(rng, stages, uneven)
