"""Widgets for notebooks, built on `zbkit.viz`; each callback writes into an `Output`.

Every widget is an `ipywidgets.VBox`: display it, or drive it from code (the tests do).
"""

from zbkit.widgets.explorer import ParamGroupExplorer
from zbkit.widgets.run_viewer import RunViewer
from zbkit.widgets.schedule_explorer import ScheduleExplorer
from zbkit.widgets.stepper import SplitBackwardStepper

__all__ = ["ParamGroupExplorer", "RunViewer", "ScheduleExplorer", "SplitBackwardStepper"]
