"""Widgets for notebooks, built on `zbkit.viz`; each callback writes into an `Output`.

Every widget is an `ipywidgets.VBox`: display it, or drive it from code (the tests do).
They need the notebook stack: `pip install 'zbkit[notebook]'`.
"""

try:  # the core install (no extras) has none of these: say which extra brings them
    import IPython  # noqa: F401
    import ipywidgets  # noqa: F401
    import matplotlib  # noqa: F401
except ModuleNotFoundError as e:
    raise ImportError(f"zbkit.widgets needs {e.name}: pip install 'zbkit[notebook]'") from e

from zbkit._public import public_dir  # noqa: E402
from zbkit.widgets.explorer import ParamGroupExplorer  # noqa: E402
from zbkit.widgets.run_viewer import RunViewer  # noqa: E402
from zbkit.widgets.schedule_explorer import ScheduleExplorer  # noqa: E402
from zbkit.widgets.stepper import SplitBackwardStepper  # noqa: E402

__all__ = ["ParamGroupExplorer", "RunViewer", "ScheduleExplorer", "SplitBackwardStepper"]


def __dir__() -> list[str]:  # dir() and tab completion: __all__ and the loaded submodules
    return public_dir(globals(), __all__)
