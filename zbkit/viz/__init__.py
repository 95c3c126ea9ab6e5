"""Drawings of graphs, schedules and runs: each returns a value that renders itself in Jupyter.

`draw_graph` returns a `graphviz.Digraph`; `plot_schedule` and `plot_memory` return a
matplotlib `Figure` (made without pyplot, so nothing leaks and no `plt.show()` is needed).
Chrome / Perfetto export of a measured run: `zbkit.pipeline.trace.Trace.to_chrome`.

The core install (`pip install -e .` from a clone) has graphviz but not matplotlib: `draw_graph` and
`timeline` work there, and the plots are imported on first use, so that without matplotlib
they raise one ImportError naming the extra to install.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from zbkit._display import renders
from zbkit._public import public_dir
from zbkit.viz import _html  # noqa: F401  registers the notebook forms of the data classes
from zbkit.viz.graph import draw_graph
from zbkit.viz.timeline import Timeline, timeline

renders("SplitGradAnalysis", "dot")(draw_graph)  # analysis.to_dot(), by zbkit._display

if TYPE_CHECKING:  # what type checkers and editors see; at run time, __getattr__ below
    from zbkit.viz.frontier import plot_frontier
    from zbkit.viz.memory_plot import plot_memory
    from zbkit.viz.schedule_plot import plot_schedule

# public name -> the module that draws it with matplotlib (the `notebook` extra)
_MATPLOTLIB = {
    "plot_frontier": "zbkit.viz.frontier",
    "plot_memory": "zbkit.viz.memory_plot",
    "plot_schedule": "zbkit.viz.schedule_plot",
}

__all__ = ["Timeline", "draw_graph", "plot_frontier", "plot_memory", "plot_schedule", "timeline"]


def __getattr__(name: str) -> Any:
    if name not in _MATPLOTLIB:
        raise AttributeError(f"module 'zbkit.viz' has no attribute {name!r}")
    try:
        module = importlib.import_module(_MATPLOTLIB[name])
    except ModuleNotFoundError as e:
        if e.name is None or e.name.split(".")[0] != "matplotlib":
            raise
        raise ImportError(
            f"zbkit.viz.{name} needs matplotlib: pip install 'zbkit[notebook]'"
        ) from e
    value = getattr(module, name)
    globals()[name] = value  # cache: the next access skips __getattr__
    return value


def __dir__() -> list[str]:  # dir() and tab completion: __all__ and the loaded submodules
    return public_dir(globals(), __all__)
