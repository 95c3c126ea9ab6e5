"""ParamGroupExplorer, ScheduleExplorer and RunViewer driven from Python.

Oracles: the analysis' groups and the forward's tensor shapes; `simulate` itself and the
closed-form bubble / memory of the paper; a real LocalPipeline trace against its simulation.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from zbkit.pipeline import LocalPipeline
from zbkit.schedules import Costs, Event, build_schedule, simulate
from zbkit.schedules.builders import explain_auto
from zbkit.schedules.catalog import RECORDS
from zbkit.schedules.core.events import rank_spans
from zbkit.splitgrad import analyze
from zbkit.viz import plot_memory
from zbkit.widgets import ParamGroupExplorer, RunViewer, ScheduleExplorer


def _mlp_analysis():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    x = torch.randn(5, 4, requires_grad=True)
    return model, analyze(model(x), [x], model)


def test_group_explorer_lists_the_chosen_group_and_highlights_it():
    model, analysis = _mlp_analysis()
    e = ParamGroupExplorer(analysis)
    assert e.dropdown.value == -1 and "2 groups" in e.details.value
    bodies = re.findall(r"subgraph cluster_group\d \{(.*?)\}", e.graph.source, re.S)
    assert len(bodies) == 2 and all("penwidth=1 " in b for b in bodies)  # none chosen yet
    e.select(0)  # the group holding 0.weight and 0.bias: the first Linear
    info = analysis.groups[0]
    assert info.param_names == ["0.weight", "0.bias"]
    for name, _ in model.named_parameters():
        shown = f"<td style='padding:0 8px'>{name}</td>" in e.details.value
        assert shown == name.startswith("0.")
    assert "(8, 4)" in e.details.value and "(8)" in e.details.value
    # counted in words: one split point is "1 split point", not "1 split points"
    assert "2 parameters, W starts at 1 split point;" in e.details.value
    # W of the first Linear starts where its output (5, 8) enters the input closure
    assert re.search(r"Addmm\w*#\d+</td><td[^>]*>\(5, 8\) \(expected\)", e.details.value)
    chosen = re.search(r"subgraph cluster_group0 \{(.*?)\}", e.graph.source, re.S).group(1)
    assert "penwidth=2 " in chosen
    e.dropdown.value = 1  # the dropdown does what select does
    assert "2.weight" in e.details.value and "0.weight" not in e.details.value
    with pytest.raises(ValueError, match="group 7 does not exist"):
        e.select(7)
    with pytest.raises(TypeError, match="SplitGradAnalysis"):
        ParamGroupExplorer(model)


def _number(html: str, row: str) -> str:
    return re.search(re.escape(row) + r"[^<]*</td><td[^>]*>([^<]*)<", html).group(1)


def test_schedule_explorer_numbers_are_the_simulation_and_the_closed_form():
    e = ScheduleExplorer("1f1b", pp=4, microbatches=8)
    sim = simulate(build_schedule("1f1b", pp=4, microbatches=8), Costs(1, 1, 1))
    assert _number(e.numbers.value, "bubble rate") == f"{sim.bubble_rate:.2%}"
    # closed form (p-1)(F+I+W) / ((p-1)(F+I+W) + m(F+I+W)) = 3 / 11
    assert _number(e.numbers.value, "closed form (p-1)(F+I+W)") == f"{3 / 11:.2%}"
    assert _number(e.numbers.value, "peak memory per rank") == "4, 3, 2, 1"
    first_png = bytes(e.image.value)
    assert first_png.startswith(b"\x89PNG")

    e.controls["pp"].value, e.controls["m"].value = 8, 32
    e.controls["schedule"].value = "zb-h1"
    e.controls["W"].value = 0.5  # ZB-H1's bubble (p-1)(F+I-W) = 7 * 1.5 = 10.5
    s = e.simulation
    assert (s.schedule.name, s.schedule.pp, s.schedule.microbatches) == ("zb-h1", 8, 32)
    assert s.bubble_rate == pytest.approx(10.5 / (10.5 + 32 * 2.5))
    assert _number(e.numbers.value, "closed form (p-1)(F+I-W)") == f"{s.bubble_rate:.2%}"
    assert bytes(e.image.value) != first_png

    e.controls["limit"].value = 5  # 1F1B-like peak on rank 0 is min(p, m) = 8 > 5
    assert "&gt; limit!" in e.numbers.value or "> limit!" in e.numbers.value
    e.controls["schedule"].value = "zb-auto"  # now the limit steers the builder
    assert max(e.simulation.peak_memory) <= 5
    assert "steers the search" in e.numbers.value
    assert e.controls["placement"].layout.display is None  # shown for zb-auto only
    e.controls["placement"].value = "v"  # the search over V-shaped schedules, same limit
    found = explain_auto(pp=8, microbatches=32, costs=e.costs(), memory_limit=5, placement="v")
    assert e.simulation.schedule.program == found.schedule.program
    assert e.simulation.bubble_rate == simulate(found.schedule, e.costs()).bubble_rate
    assert _number(e.numbers.value, "zb-auto kept").startswith(found.chosen.name)
    e.controls["schedule"].value = "zb-v"  # with a limit: the builder's V search under it
    assert e.controls["placement"].layout.display == "none"
    zbv = build_schedule("zb-v", pp=8, microbatches=32, costs=e.costs(), memory_limit=5)
    assert e.simulation.schedule.program == zbv.program
    assert max(e.simulation.peak_memory) <= 5 and "limit!" not in e.numbers.value
    e.controls["schedule"].value = "1f1b"  # a fixed schedule: the limit is only compared
    assert "ignored by 1f1b" in _number(e.numbers.value, "memory limit")

    e.controls["m"].value = 9  # 1f1b draws it
    shown = bytes(e.image.value)
    e.controls["schedule"].value = "interleaved-1f1b"  # impossible: m not a multiple of pp
    # one line in the widget, no traceback; the last good picture stays
    assert isinstance(e.error, ValueError) and "multiple of pp" in str(e.error)
    text = re.sub(r"<[^>]+>", "", e.numbers.value)
    assert text.startswith("cannot build interleaved-1f1b:") and "\n" not in text
    assert "multiple of pp" in text and "Traceback" not in text and not e.out.outputs
    assert bytes(e.image.value) == shown
    e.controls["m"].value = 16  # possible again: drawn, the error gone
    assert e.error is None and "bubble rate" in e.numbers.value
    with pytest.raises(ValueError, match="unknown"):
        ScheduleExplorer("fast")


def test_schedule_explorer_rebuilds_zb_v_for_its_limit_and_costs():
    # Issue 15: zb-v was cached by (name, pp, m) alone and built without the limit: with
    # the limit at 4 it showed peak 8, 8, 8, 8 "> limit!" where the builder gives 4, 4, 4, 4.
    # (Chunk units then; in rank-microbatches now: the limit 2, the peaks 4 and 2.)
    e = ScheduleExplorer("zb-v", pp=4, microbatches=8, memory_limit=2)

    def shows_the_builders(limit: float) -> None:
        costs = e.costs()
        built = build_schedule("zb-v", pp=4, microbatches=8, costs=costs, memory_limit=limit)
        assert e.simulation.schedule.program == built.program, (costs, limit)
        peak = simulate(built, costs).peak_memory
        assert _number(e.numbers.value, "peak memory per rank") == ", ".join(
            f"{p:.3g}" for p in peak
        )
        assert max(peak) <= limit and "limit!" not in e.numbers.value
        assert "steers the search" in _number(e.numbers.value, "memory limit")
        # the paper's closed forms (p, zero bubble) describe its construction, not this
        assert "searched for these costs" in _number(e.numbers.value, "closed form")
        assert "closed form p<" not in e.numbers.value

    shows_the_builders(2)
    assert _number(e.numbers.value, "peak memory per rank") == "2, 2, 2, 2"
    before = e.simulation.schedule.program
    e.controls["W"].value = 0.5  # the costs are part of the cache key: a new V schedule
    shows_the_builders(2)
    assert e.simulation.schedule.program != before
    e.controls["limit"].value = 3  # ... and so is the limit
    shows_the_builders(3)
    e.controls["W"].value = 1.0
    e.controls["limit"].value = 2  # back to the first settings: the same schedule again
    assert e.simulation.schedule.program == before

    e.controls["limit"].value = 0  # no limit: the paper's construction, and it says so
    assert e.simulation.schedule.program == build_schedule("zb-v", pp=4, microbatches=8).program
    assert "paper's construction" in _number(e.numbers.value, "zb-v").replace("&#x27;", "'")
    assert _number(e.numbers.value, "closed form p") == "4, 4, 4, 4"  # what 1F1B's rank 0 holds


class _Stage(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"x": torch.tanh(self.fc(x))}


def test_run_viewer_shows_a_real_trace_beside_its_simulation():
    torch.manual_seed(0)
    schedule = build_schedule("zb-h1", pp=2, microbatches=4)
    pipe = LocalPipeline(
        [_Stage(), _Stage()], schedule, lambda out, y: ((out["x"] - y) ** 2).mean()
    )
    pipe.step({"x": torch.randn(8, 4)}, torch.randn(8, 4))
    trace = pipe.trace
    sim = simulate(schedule, Costs(1, 1, 1))
    v = RunViewer(trace, sim)
    labels = [t.get_text() for t in v.figure.axes[0].get_yticklabels()]
    assert labels == ["rank 0 run", "rank 0 sim", "rank 1 run", "rank 1 sim"]
    # measured numbers are the trace's own (its makespan and bubble rate)
    assert f"run: makespan {trace.makespan:.4g}, bubble {trace.bubble_rate:.1%}" in v.numbers.value
    assert f"sim: makespan {sim.makespan:.4g}" in v.numbers.value
    actions = next(c for c in v.figure.axes[0].collections if c.get_gid() == "actions")
    assert len(actions.get_paths()) == len(trace.events) + len(sim.events) == 2 * 2 * 4 * 3
    v.show(1)
    labels = [t.get_text() for t in v.figure.axes[0].get_yticklabels()]
    assert labels == ["rank 1 run", "rank 1 sim"]
    assert v.numbers.value.count("<tr>") == 2  # header + rank 1
    v.compare.value = "overlay"
    assert [t.get_text() for t in v.figure.axes[0].get_yticklabels()] == ["rank 1"]
    with pytest.raises(ValueError, match="rank 5 is not in this run"):
        v.show(5)
    # the measured memory record (what the stages really held) drawn as recorded
    mem = plot_memory(trace)
    peaks = [max(ax.get_lines()[0].get_ydata()) for ax in mem.axes]
    assert peaks == trace.peak_memory == [2, 1]  # ZB-H1 holds min(p - r, m) activations
    alone = RunViewer(list(sim.events))  # no simulation: one row per rank, no toggle
    assert alone.compare.layout.display == "none" and "sim:" not in alone.numbers.value


@pytest.mark.parametrize("name", [n for n, r in RECORDS.items() if r.formulas is not None])
def test_closed_forms_shown_agree_with_the_simulator(name):
    from zbkit.schedules.formulas import bubble, peak_memory

    checked = 0
    for f, i, w in [(1, 1, 1), (1, 2, 1), (2, 2, 1), (3, 2, 1.5), (1, 1, 2)]:
        for pp, m in [(2, 4), (3, 6), (4, 8), (4, 12), (3, 5)]:
            costs = Costs(f, i, w)
            try:
                schedule = build_schedule(name, pp=pp, microbatches=m)
            except ValueError:
                continue  # e.g. interleaved needs m % pp == 0
            sim = simulate(schedule, costs)
            v = schedule.stages_per_rank
            cf = bubble(name, pp, m, v, costs)
            if cf is not None:
                assert cf.rate == pytest.approx(sim.bubble_rate, abs=1e-12), (pp, m, costs)
                checked += 1
            pm = peak_memory(name, pp, m, v, costs)
            if pm is not None:
                assert pm[1] == sim.peak_memory, (pp, m, pm[0])
                checked += 1
    assert checked >= 10  # the formulas apply to most of these settings


def test_schedule_explorer_controls_are_wide_and_their_labels_fit():
    e = ScheduleExplorer()
    for name, control in e.controls.items():
        assert control.layout.width == "400px", name
        label_px = int(control.style.description_width.rstrip("px"))
        # about 7 px per character at the notebook's 13 px font: the label is not cut
        assert len(control.description) * 7 <= label_px, control.description


def test_schedule_explorer_image_is_drawn_at_the_size_it_is_shown():
    import struct

    e = ScheduleExplorer("zb-h1", pp=4, microbatches=8)
    png = bytes(e.image.value)
    width, height = struct.unpack(">II", png[16:24])  # the PNG header's IHDR
    assert e.image.layout.width == f"{width}px"  # shown pixel for pixel
    # JupyterLab's output column is 968 px in a 1400-px window: wide, and never shrunk there
    assert 900 <= width <= 968
    assert e.image.layout.max_width == "100%"  # a narrower notebook shrinks it, never stretches
    # box labels: 8 pt at 100 dpi is about 11 px tall (was 7 pt at 72 dpi: 7 px)
    sizes = {t.get_fontsize() for t in e.figure.axes[0].texts}
    assert sizes and min(sizes) * e.figure.dpi / 72 >= 11


def test_run_viewer_table_has_no_float_noise_and_the_overlay_is_readable():
    # back-to-back actions whose summed durations miss the span in the last bits
    t = [0.03, 0.09, 0.43, 0.84]
    events = [(0, 0, kind, 0, t[i], t[i + 1]) for i, kind in enumerate("FIW")]
    lo, hi, busy = rank_spans([Event(*e) for e in events])[0]
    assert hi - lo - busy < 0  # the noise is real: -1.11e-16
    v = RunViewer(events)
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", v.numbers.value)
    assert cells[-1] == "0" and "e-1" not in v.numbers.value

    sim = simulate(build_schedule("zb-h1", pp=2, microbatches=4), Costs(1, 1, 1))
    run = [e._replace(start=1.07 * e.start + 0.05, end=1.07 * e.end) for e in sim.events]
    v = RunViewer(run, sim)
    v.compare.value = "overlay"
    ax = v.figure.axes[0]
    outlines = next(c for c in ax.collections if c.get_gid() == "simulated")
    boxes = next(c for c in ax.collections if c.get_gid() == "actions")
    assert min(outlines.get_linewidths()) >= 1.2 and outlines.get_zorder() > boxes.get_zorder()


@pytest.mark.parametrize("width", [6.0, 10.0, 12.0])
@pytest.mark.parametrize("name", ["zb-h1", "zb-v"])
def test_box_labels_never_run_together(name, width):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from zbkit.viz import plot_schedule

    sim = simulate(build_schedule(name, pp=4, microbatches=8), Costs(1, 1, 0.5))
    fig = plot_schedule(sim, width=width)
    renderer = FigureCanvasAgg(fig).get_renderer()
    rows: dict[float, list] = {}
    for t in fig.axes[0].texts:
        rows.setdefault(t.get_position()[1], []).append(t.get_window_extent(renderer))
    assert rows or width < 10  # narrow boxes may hold no label at all
    for extents in rows.values():
        extents.sort(key=lambda b: b.x0)
        for left, right in zip(extents, extents[1:], strict=False):
            assert left.x1 < right.x0, (name, width)  # a gap between neighbouring labels


def test_before_the_kernel_runs_a_widget_shows_one_line_and_a_picture():
    from zbkit.widgets import SplitBackwardStepper

    e = ScheduleExplorer("zb-h1", pp=4, microbatches=8)
    bundle = e._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle  # live: the widget
    assert bundle["text/plain"] == (
        "ScheduleExplorer (zb-h1, pp=4, m=8): run this cell to get the live widget"
    )
    assert bundle["image/png"].startswith(b"\x89PNG")  # offline or untrusted: the picture
    _, analysis = _mlp_analysis()
    g = ParamGroupExplorer(analysis)._repr_mimebundle_()
    assert (
        g["text/plain"]
        == "ParamGroupExplorer (2 parameter groups): run this cell to get the live widget"
    )
    s = SplitBackwardStepper(nn.Linear(2, 2), torch.randn(3, 2))._repr_mimebundle_()
    assert "\n" not in s["text/plain"] and "run this cell" in s["text/plain"]


def test_run_viewer_title_legend_and_rows_never_overlap_and_one_rank_stays_tall():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    # zb-v: the widest legend (kinds, two chunks, idle, edges; "simulated" in the overlay)
    sim = simulate(build_schedule("zb-v", pp=4, microbatches=8), Costs(0.01, 0.01, 0.01, comm=5e-4))
    run = [e._replace(start=1.07 * e.start + 3e-3, end=1.07 * e.end + 3e-3) for e in sim.events]
    v = RunViewer(run, sim, unit="s")
    for rank, compare in [(-1, "rows"), (-1, "overlay"), (1, "rows"), (1, "overlay")]:
        v.show(rank)
        v.compare.value = compare
        fig = v.figure
        renderer = FigureCanvasAgg(fig).get_renderer()
        ax = fig.axes[0]
        title = next(t for t in (ax.title, ax._left_title) if t.get_text())
        boxes = {
            "title": title.get_window_extent(renderer),
            "legend": ax.get_legend().get_window_extent(renderer),
            "axes": ax.get_window_extent(renderer),
        }
        where = f"rank {rank}, {compare}"
        # stacked top to bottom, each clear of the next, all inside the figure
        assert boxes["title"].y0 > boxes["legend"].y1, where
        assert boxes["legend"].y0 >= boxes["axes"].y1, where
        assert boxes["title"].y1 <= fig.bbox.height and boxes["title"].x0 >= 0, where
        rows = len(ax.get_yticks())
        assert boxes["axes"].height / fig.dpi >= min(0.9, 0.42 * rows) - 1e-6, where
        if rank == 1 and compare == "overlay":  # one rank alone: not a thin strip
            assert rows == 1 and boxes["axes"].height / fig.dpi >= 0.9
        # the title says what was simulated, and the numbers under the picture agree with it
        assert "hop 0.0005" in title.get_text() and "F 0.01" in title.get_text()
        assert f"sim: makespan {sim.makespan:.4g}, bubble {sim.bubble_rate:.1%}" in title.get_text()
        assert f"bubble {sim.bubble_rate:.1%} (simulated with F 0.01" in v.numbers.value


def test_the_explorer_says_how_far_from_optimal_the_schedule_can_be():
    from zbkit.schedules.optimum.exact import bound_for

    e = ScheduleExplorer("zb-h1", pp=4, microbatches=8)  # F = I = W: at the bound
    assert _number(e.numbers.value, "how far from optimal").startswith("optimal")
    e.controls["schedule"].value = "1f1b"
    sim = e.simulation
    bound = bound_for(sim.schedule, e.costs())
    shown = _number(e.numbers.value, "how far from optimal").replace("&lt;", "<")
    gap = (max(sim.span) - bound) / max(sim.span)
    assert shown == f"<= {gap:.1%} above optimal (lower bound {bound:.6g})"
