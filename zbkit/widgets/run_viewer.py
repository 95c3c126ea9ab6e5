"""`RunViewer`: a measured pipeline run beside its simulation, one rank or all."""

from __future__ import annotations

import statistics
from typing import Any

import ipywidgets as w
from matplotlib.backends.backend_agg import FigureCanvasAgg

from zbkit.schedules.core.events import rank_spans
from zbkit.schedules.throughput import rank_costs
from zbkit.viz import plot_schedule, timeline
from zbkit.widgets._common import Offline, table_html

_DPI, _WIDTH_IN = 100, 9.5  # drawn at the size it is shown, as ScheduleExplorer
_ROW_IN, _MIN_AXES_IN = 0.42, 0.9  # a rank's row; the boxes of one rank alone stay this tall
_BOTTOM_IN, _GAP_PX = 0.55, 6  # ticks and the axis label; between axes, legend and title


def _sim_costs(simulation: Any) -> str:
    """'F 0.01, I 0.01, W 0.01, hop 0.00053': the costs the simulation ran with, per rank
    (all of a rank's stages together, `Costs`' unit; their medians when ranks differ), so
    its numbers say what they are."""
    ranks = rank_costs(simulation.schedule, simulation.per_stage)
    parts = {p: statistics.median(getattr(c, p) for c in ranks) for p in ("F", "I", "W", "comm")}
    same = all(c == ranks[0] for c in ranks)
    text = ", ".join(f"{'hop' if p == 'comm' else p} {v:.3g}" for p, v in parts.items())
    return text if same else f"{text} (medians over ranks)"


def _lay_out(fig: Any) -> None:
    """Title, then legend, then the rows, each clear of the next; one rank alone kept tall.

    `plot_schedule` puts its left title and its legend side by side above the axes: wide
    numbers run into a wide legend, and a single row is a thin strip. Here the figure's
    height is set from what it holds: the rows (at least `_MIN_AXES_IN`), the legend's and
    the title's own heights measured by the renderer, the title lifted above the legend.
    """
    ax = fig.axes[0]
    renderer = FigureCanvasAgg(fig).get_renderer()
    legend = ax.get_legend()
    legend_px = legend.get_window_extent(renderer).height if legend is not None else 0.0
    pad_pt = (legend_px + _GAP_PX) * 72 / fig.dpi  # points above the axes
    title = ax.set_title(ax.get_title(loc="left"), loc="left", fontsize=9, pad=pad_pt, va="bottom")
    title_px = title.get_window_extent(renderer).height
    axes_in = max(_ROW_IN * len(ax.get_yticks()), _MIN_AXES_IN)
    top_in = (legend_px + title_px + 3 * _GAP_PX) / fig.dpi
    height = _BOTTOM_IN + axes_in + top_in
    fig.set_size_inches(fig.get_figwidth(), height)
    left, _, axes_w, _ = ax.get_position().bounds
    ax.set_position((left, _BOTTOM_IN / height, axes_w, axes_in / height))


def _idle(span: float, busy: float) -> float:
    """span - busy without float noise: summed durations differ from first-to-last times
    in the last bits (-1.11e-16 idle is 0)."""
    idle = span - busy
    return 0.0 if abs(idle) <= 1e-9 * max(span, 1.0) else idle


class RunViewer(Offline, w.VBox):
    """Show `trace` (runner.trace, or a list of events), with `simulation` aligned under it.

    A rank selector picks one rank or all; with a simulation, a toggle switches between two
    rows per rank and the simulated boxes outlined over the measured ones. `show(rank)` does
    from code what the selector does.
    """

    def __init__(self, trace: Any, simulation: Any = None, *, unit: str = "time") -> None:
        self.trace = trace
        self.simulation = simulation
        self.unit = unit
        self.run = timeline(trace)  # validates the events now, with a clear error
        self.sim = timeline(simulation) if simulation is not None else None
        ranks = max(self.run.num_ranks, self.sim.num_ranks if self.sim else 0)
        self.rank = w.Dropdown(
            options=[("all ranks", -1)] + [(f"rank {r}", r) for r in range(ranks)],
            value=-1,
            description="show",
        )
        self.rank.add_class("zb-rank-select")
        self.compare = w.ToggleButtons(options=["rows", "overlay"], value="rows")
        self.compare.layout.display = None if simulation is not None else "none"
        self.image = w.Image(
            format="png", layout=w.Layout(width=f"{_WIDTH_IN * _DPI:.0f}px", max_width="100%")
        )
        self.numbers = w.HTML()
        self.out = w.Output()
        self.figure: Any = None
        for control in (self.rank, self.compare):
            control.observe(lambda _: self.redraw(), names="value")
        super().__init__([w.HBox([self.rank, self.compare]), self.out, self.image, self.numbers])
        self.add_class("zb-run-viewer")
        self.redraw()

    def _offline_what(self) -> str:
        return f"{len(self.run.events)} actions on {self.run.num_ranks} ranks"

    def _offline_png(self) -> bytes | None:
        return self.figure.to_png(dpi=_DPI) if self.figure is not None else None

    def show(self, rank: int) -> None:
        """Show one rank (or -1 for all)."""
        valid = [v for _, v in self.rank.options]
        if rank not in valid:
            raise ValueError(f"rank {rank} is not in this run; choose one of {valid}")
        self.rank.value = rank

    def redraw(self) -> None:
        with self.out:
            self.out.clear_output(wait=True)
            ranks = None if self.rank.value == -1 else [self.rank.value]
            self.figure = plot_schedule(
                self.trace,
                simulation=self.simulation,
                compare=self.compare.value,
                ranks=ranks,
                title=self._title(ranks),
                unit=self.unit,
                width=_WIDTH_IN,
            )
            _lay_out(self.figure)
            self.image.value = self.figure.to_png(dpi=_DPI, compress_level=1)
            self.numbers.value = self._numbers(ranks)

    def _title(self, ranks: list[int] | None) -> str:
        shown = "all ranks" if ranks is None else f"rank {ranks[0]}"
        what = "measured run" if self.sim is None else "measured run over its simulation"
        if self.sim is not None and hasattr(self.simulation, "per_stage"):
            what += f" ({_sim_costs(self.simulation)})"
        return f"{shown}: {what}"

    def _numbers(self, ranks: list[int] | None) -> str:
        run = rank_spans(self.run.events)
        sim = rank_spans(self.sim.events) if self.sim else {}
        shown = ranks if ranks is not None else sorted(set(run) | set(sim))
        header = ["rank", "run: busy", "run: idle"]
        if self.sim:
            header += ["sim: busy", "sim: idle"]
        rows = []
        for r in shown:
            row: list[int | str] = [r]
            for spans in (run, sim) if self.sim else (run,):
                lo, hi, busy = spans.get(r, (0.0, 0.0, 0.0))
                row += [f"{busy:.4g}", f"{_idle(hi - lo, busy):.4g}"]
            rows.append(row)
        head = f"<p>run: makespan {self.run.makespan:.4g}, bubble {self.run.bubble_rate:.1%}"
        if self.sim:
            head += f"; sim: makespan {self.sim.makespan:.4g}, bubble {self.sim.bubble_rate:.1%}"
            if hasattr(self.simulation, "per_stage"):  # a Simulation, not a bare event list
                head += f" (simulated with {_sim_costs(self.simulation)})"
        return head + "</p>" + table_html(header, rows)
