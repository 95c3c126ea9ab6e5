"""Pipeline schedules as data: build, validate, simulate, print (pure Python, no torch).

>>> from zbkit.schedules import build_schedule, simulate, Costs
>>> s = build_schedule("zb-h1", pp=4, microbatches=8)
>>> print(s)                      # rank-by-step grid
>>> simulate(s, Costs(F=1, I=1, W=1)).bubble_rate
"""

from zbkit.schedules.action import Action
from zbkit.schedules.builders import SCHEDULES, build_schedule
from zbkit.schedules.schedule import Schedule, ScheduleError
from zbkit.schedules.simulate import Costs, Event, Simulation, bubble_rate, simulate
from zbkit.schedules.validate import validate

__all__ = [
    "SCHEDULES",
    "Action",
    "Costs",
    "Event",
    "Schedule",
    "ScheduleError",
    "Simulation",
    "bubble_rate",
    "build_schedule",
    "simulate",
    "validate",
]
