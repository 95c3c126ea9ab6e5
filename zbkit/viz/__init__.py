"""Drawings of graphs, schedules and runs: each returns a value that renders itself in Jupyter.

`draw_graph` returns a `graphviz.Digraph`; `plot_schedule` and `plot_memory` return a
matplotlib `Figure` (made without pyplot, so nothing leaks and no `plt.show()` is needed).
Chrome / Perfetto export of a measured run: `zbkit.pipeline.trace.Trace.to_chrome`.
"""

from zbkit.viz.frontier import plot_frontier
from zbkit.viz.graph import draw_graph
from zbkit.viz.schedule_plot import plot_memory, plot_schedule
from zbkit.viz.timeline import Timeline, timeline

__all__ = ["Timeline", "draw_graph", "plot_frontier", "plot_memory", "plot_schedule", "timeline"]
