"""Pipeline schedules as data: build, validate, simulate, print (pure Python, no torch).

>>> from zbkit.schedules import build_schedule, simulate, Costs
>>> s = build_schedule("zb-h1", pp=4, microbatches=8)
>>> print(s)                      # rank-by-step grid
>>> simulate(s, Costs(F=1, I=1, W=1)).bubble_rate

The layers and where to add a schedule or an action kind: docs/architecture.md.
"""

from zbkit._public import public_dir
from zbkit.schedules.builders import SCHEDULES, build_schedule, explain_auto
from zbkit.schedules.core.action import KINDS, Action, Kind, Overlap, Product
from zbkit.schedules.core.costs import Costs
from zbkit.schedules.core.events import CommEvent, Event, bubble_rate, memory_deltas, memory_steps
from zbkit.schedules.core.plan import Comm, CommOp, Plan
from zbkit.schedules.core.schedule import Schedule, ScheduleError, derive_plan
from zbkit.schedules.from_torch import TorchComparison, compare_with_torch
from zbkit.schedules.optimum.exact import Solution, lower_bound, lower_bound_parts
from zbkit.schedules.search.optimal import solve
from zbkit.schedules.sim.simulate import Simulation, simulate
from zbkit.schedules.sim.validate import validate

__all__ = [
    "KINDS",
    "SCHEDULES",
    "Action",
    "Comm",
    "CommEvent",
    "CommOp",
    "Costs",
    "Event",
    "Kind",
    "Overlap",
    "Plan",
    "Product",
    "Schedule",
    "ScheduleError",
    "Simulation",
    "Solution",
    "TorchComparison",
    "bubble_rate",
    "build_schedule",
    "compare_with_torch",
    "derive_plan",
    "explain_auto",
    "lower_bound",
    "lower_bound_parts",
    "memory_deltas",
    "memory_steps",
    "simulate",
    "solve",
    "validate",
]


def __dir__() -> list[str]:  # dir() and tab completion: __all__ and the loaded submodules
    return public_dir(globals(), __all__)
