"""`ScheduleExplorer`: change a schedule, pp, m, costs or the memory limit; see the bubbles move.

Every change rebuilds the schedule, simulates it and redraws (about 0.1 s for p = 8, m = 32;
`benchmarks/viz_speed.py` measures it). The picture goes into an `Image` widget, the numbers
into an `HTML` one, and any error (a schedule that cannot be built) into the `Output`.

Only the searches obey the memory limit (and the costs): zb-auto always, and zb-v once a
limit is set (the builder's zb-v with a limit is the fastest V schedule under it for these
costs; without one, the paper's construction). For the fixed schedules the limit is a line
to compare against, and the numbers say so. zb-auto's placement ("linear" or ZB-V's "v")
shows when it is chosen. Built schedules are cached by every argument the builder got.
"""

from __future__ import annotations

import html
from dataclasses import replace
from typing import Any

import ipywidgets as w

from zbkit.schedules import SCHEDULES, Costs, simulate
from zbkit.schedules.builders import PLACEMENTS, build_schedule, explain_auto
from zbkit.schedules.catalog import RECORDS, searchers
from zbkit.schedules.core.costs import MEMORY_UNIT
from zbkit.schedules.formulas import bubble, peak_memory
from zbkit.schedules.optimum.exact import bound_for, gap_line
from zbkit.schedules.throughput import throughput
from zbkit.viz import plot_schedule
from zbkit.widgets._common import Offline, table_html

_DPI = 100  # drawn at the size it is shown (no stretching, so no blur)
_CONTROL_WIDTH, _LABEL_WIDTH = "400px", "130px"  # a slider's track: about 220 px
_WIDTH_IN = 9.5  # figure width in inches: _WIDTH_IN * _DPI pixels, the image's own width


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.3g}" for v in values)


def _controls(
    schedule: str, pp: int, m: int, costs: Costs, memory_limit: float, placement: str
) -> dict[str, Any]:
    """The widgets, by name: the schedule (every registered one), sizes, costs, limit and
    the placement of the schedules that take one."""
    slider = dict(continuous_update=False)
    takers = ", ".join(r.name for r in RECORDS.values() if "placement" in r.options)
    return {
        "schedule": w.Dropdown(options=tuple(SCHEDULES), value=schedule, description="schedule"),
        "pp": w.IntSlider(value=pp, min=1, max=16, description="pp (ranks)", **slider),
        "m": w.IntSlider(value=m, min=1, max=64, description="m (microbatches)", **slider),
        "F": w.FloatSlider(value=costs.F, min=0.1, max=4, step=0.1, description="F", **slider),
        "I": w.FloatSlider(value=costs.I, min=0.1, max=4, step=0.1, description="I", **slider),
        "W": w.FloatSlider(value=costs.W, min=0.0, max=4, step=0.1, description="W", **slider),
        "comm": w.FloatSlider(
            value=costs.comm, min=0, max=2, step=0.05, description="comm", **slider
        ),
        "limit": w.FloatSlider(
            value=memory_limit,
            min=0,
            max=64,
            step=0.5,
            description="memory limit",
            tooltip=f"peak per rank in {MEMORY_UNIT} (1F1B's rank 0 holds pp); 0: no limit",
            **slider,
        ),
        "placement": w.Dropdown(
            options=[(f"{takers}: {p}", p) for p in PLACEMENTS],
            value=placement,
            description="placement",
        ),
    }


class ScheduleExplorer(Offline, w.VBox):
    """Schedule, pp, m, F / I / W / comm costs, a memory limit (and zb-auto's placement)
    -> plot and numbers.

    `simulation` holds the last Simulation, `figure` the last Figure; setting any control's
    `.value` from code redraws, as a slider move does.
    """

    def __init__(
        self,
        schedule: str = "zb-h1",
        pp: int = 4,
        microbatches: int = 8,
        costs: Costs | None = None,
        memory_limit: float = 0.0,
        placement: str = "linear",
    ) -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule {schedule!r} unknown; choose one of {SCHEDULES}")
        costs = costs if costs is not None else Costs(1.0, 1.0, 1.0, comm=0.0)
        self._given = costs  # what the sliders do not set (memory weights, overlap) stays
        self.controls = _controls(schedule, pp, microbatches, costs, memory_limit, placement)
        for name, control in self.controls.items():
            # wide tracks (a 64 px slider made pp jump 4 -> 16 in one drag), labels never cut
            control.layout.width = _CONTROL_WIDTH
            control.style.description_width = _LABEL_WIDTH
            control.add_class(f"zb-ctl-{name}")
            control.observe(lambda _: self.redraw(), names="value")
        # pixel for pixel (a narrower notebook shrinks it, never stretches it)
        self.image = w.Image(
            format="png", layout=w.Layout(width=f"{_WIDTH_IN * _DPI:.0f}px", max_width="100%")
        )
        self.numbers = w.HTML()
        self.out = w.Output()  # unexpected errors land here instead of vanishing
        self.error: Exception | None = None  # the last settings that could not be built
        # (name, pp, m, costs?, limit?, placement?) -> (Schedule, the search's kept candidate)
        self._built: dict[tuple, tuple[Any, Any]] = {}
        self.simulation: Any = None
        self.figure: Any = None
        left = w.VBox(list(self.controls.values())[:4])
        right = w.VBox(list(self.controls.values())[4:])
        super().__init__([w.HBox([left, right]), self.out, self.numbers, self.image])
        self.add_class("zb-schedule-explorer")
        self.redraw()

    def _offline_what(self) -> str:
        c = self.controls
        return f"{c['schedule'].value}, pp={c['pp'].value}, m={c['m'].value}"

    def _offline_png(self) -> bytes | None:
        return self.figure.to_png(dpi=_DPI) if self.figure is not None else None

    def costs(self) -> Costs:
        """The sliders' F, I, W and comm; the memory fields and overlap as given (no sliders)."""
        c = self.controls
        return replace(self._given, F=c["F"].value, I=c["I"].value, W=c["W"].value,
                       comm=c["comm"].value)  # fmt: skip

    def redraw(self) -> None:
        with self.out:
            self.out.clear_output(wait=True)
            c = self.controls
            name, pp, m = c["schedule"].value, c["pp"].value, c["m"].value
            limit = c["limit"].value or None
            costs = self.costs()
            # the placement applies to the schedules that take one (zb-auto): hidden otherwise
            takes = "placement" in RECORDS[name].options
            c["placement"].layout.display = None if takes else "none"
            try:
                schedule, kept = self._schedule(name, pp, m, costs, limit)
            except ValueError as err:  # e.g. m not a multiple of pp: one line, keep the old plot
                self.error = err
                line = html.escape(str(err).splitlines()[0])
                shown = self.simulation.schedule.name if self.simulation is not None else None
                below = f" (below: the last one built, {shown})" if shown else ""
                self.numbers.value = (
                    f"<p style='color:#b00'>cannot build {name}: {line}{html.escape(below)}</p>"
                )
                return
            self.error = None
            self.simulation = simulate(schedule, costs, check=False)
            self.figure = plot_schedule(self.simulation, width=_WIDTH_IN, labels=m * pp <= 128)
            self.image.value = self.figure.to_png(dpi=_DPI, compress_level=1)
            self.numbers.value = self._numbers(name, pp, m, schedule.stages_per_rank, limit, kept)

    def _options(self, name: str, costs: Costs, limit: float | None) -> dict[str, Any]:
        """What a search gets besides pp and m: every control that changes the schedule.

        The fixed schedules get nothing (costs and limit do not change their order), so a
        cost slider re-simulates them without rebuilding. A schedule that searches when
        given a limit (zb-v: the V search) does once the limit is set.
        """
        found = RECORDS[name]
        if not found.searching(limit is not None):
            return {}
        placement = found.placement  # zb-v's V; zb-auto's from its control
        if "placement" in found.options:
            placement = self.controls["placement"].value
        return {"costs": costs, "memory_limit": limit, "placement": placement}

    def _schedule(
        self, name: str, pp: int, m: int, costs: Costs, limit: float | None
    ) -> tuple[Any, Any]:
        """Build, or reuse (a search takes most of a redraw). The cache key is the builder's
        arguments, all of them. Returns the schedule and, for a search, the candidate it
        kept."""
        options = self._options(name, costs, limit)
        key = (name, pp, m, *sorted(options.items()))
        if key not in self._built:
            if len(self._built) >= 64:
                self._built.clear()  # a slider sweep should not grow memory without bound
            if options and RECORDS[name].largest is not None:  # a proof (zb-opt): no candidates
                built = build_schedule(name, pp=pp, microbatches=m, **options)
                self._built[key] = (built, None)
            elif options:  # zb-auto's search: say which candidate it kept
                found = explain_auto(pp=pp, microbatches=m, **options)
                found.schedule.name = name  # zb-v's V search is still zb-v
                self._built[key] = (found.schedule, found.chosen)
            else:
                self._built[key] = (build_schedule(name, pp=pp, microbatches=m), None)
        return self._built[key]

    def _numbers(self, name: str, pp: int, m: int, v: int, limit: float | None, kept: Any) -> str:
        sim, costs = self.simulation, self.costs()
        searched = RECORDS[name].searching(limit is not None)
        rows = _speed_rows(sim, costs)
        if kept is not None:  # a search: which of its candidates won, and why it is there
            rows.append([f"{name} kept", f"{kept.name} ({kept.reason})"])
        rows += _limit_rows(name, limit, searched)
        # how far from the best any schedule of this placement could do in this memory
        rows.append(
            ["how far from optimal", gap_line(max(sim.span), bound_for(sim.schedule, costs, sim))]
        )
        # the closed forms describe the fixed constructions, not what a search found
        cf = None if searched else bubble(name, pp, m, v, costs)
        if cf is not None:
            note = " (ignores comm)" if costs.comm else ""
            rows.append([f"closed form {cf.formula}{note}", f"{cf.rate:.2%}"])
        elif searched:
            rows.append(["closed form", "none: searched for these costs (simulated only)"])
        else:
            rows.append(["closed form", "none for these settings (simulated only)"])
        peak = sim.peak_memory
        over = limit is not None and max(peak) > limit
        unit = f"peak memory per rank ({MEMORY_UNIT})"
        rows.append([unit, _fmt(peak) + ("  > limit!" if over else "")])
        pm = None if searched else peak_memory(name, pp, m, v, costs)
        if pm is not None:
            rows.append([f"closed form {pm[0]}", _fmt(pm[1])])
        return table_html(["", "value"], rows)


def _speed_rows(sim: Any, costs: Costs) -> list[list[str]]:
    """Bubble, makespan, throughput and the speed-up over 1F1B."""
    tp = throughput(sim.schedule, costs, simulated=sim)
    return [
        ["bubble rate", f"{sim.bubble_rate:.2%}"],
        ["makespan", f"{sim.makespan:.4g}"],
        [
            f"throughput ({tp.iterations} iterations, optimizer step synchronised / not)",
            f"{tp.synced:.4g} / {tp.unsynced:.4g} microbatches per unit time",
        ],
        [
            "speed-up over 1F1B on the same work",
            f"{tp.speedup(True):.3f}x / {tp.speedup(False):.3f}x",
        ],
    ]


def _limit_rows(name: str, limit: float | None, searched: bool) -> list[list[str]]:
    """What the memory limit does to this schedule (its record says whether it searches)."""
    found = RECORDS[name]
    if searched:
        return [["memory limit", "steers the search: peak memory stays under it"]]
    if found.searches == "given":  # its construction until a limit is set
        shape = "V" if found.placement == "v" else found.placement
        return [[name, f"the paper's construction; set a memory limit to search {shape} schedules"]]
    if limit is None:
        return []
    return [
        [
            "memory limit",
            f"ignored by {name} (a fixed schedule: its order does not change), only "
            f"compared; {' and '.join(searchers())} build under a limit",
        ]
    ]
