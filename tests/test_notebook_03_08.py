"""Notebooks 03 and 08 say what their pictures and numbers show (issue 22).

Read from the notebooks themselves: the code a cell runs (re-run here, or its call's arguments
taken apart), the outputs it stored (a real run's, which nbval re-checks), and the text beside
them. The oracles: the figure's artists, zb-auto's own search, torch's own error message.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections import Counter
from pathlib import Path

import pytest
from notebook_cells import cell_by_id, cell_source, cell_stdout, next_cell, read_cells

import zbkit
from zbkit.schedules import Costs, build_schedule, explain_auto, simulate
from zbkit.schedules.paper import TABLE6
from zbkit.viz import plot_schedule


def test_03_zb_v_picture_names_each_box_chunk_and_kind():
    cells = read_cells("03_schedules_and_bubbles")
    space: dict = {}
    exec(cell_source(cell_by_id(cells, "4f980069")), space)  # the imports, p and m
    *body, last = cell_source(cell_by_id(cells, "31c9f38c")).strip().splitlines()
    exec("\n".join(body), space)
    fig = eval(last, space)  # the picture the notebook shows
    sim = simulate(space["zbv"], space["unit"])  # one Costs for every schedule (no halving)
    # every box says its stage, kind and microbatch: `5F` over `3` (the stage tells the chunk)
    said = Counter(
        (round(t.get_position()[1]), t.get_text().replace("\n", "")) for t in fig.axes[0].texts
    )
    assert said == Counter((e.rank, e.label) for e in sim.events)
    assert {e.microbatch for e in sim.events} == set(range(4))  # the text's "drawn at m = 4"
    # and the text says how to read it: light chunk down, dark chunk back up
    text = " ".join(cell_source(cell_by_id(cells, "80b5bc54")).split())
    assert "Light boxes are chunk 0 (down), dark ones chunk 1 (up)" in text
    assert "Drawn at `m = 4` so the labels fit; below `m = 2p` a bubble remains" in text
    assert sim.bubble_rate > 0 and 4 < 2 * space["p"]


def _paper_rows(cells: list[dict]) -> list[tuple[str, int, int, Costs]]:
    """(model, m, p, costs) of each row of the paper-times table: the rows it printed, the
    times from the paper's Table 6 (zbkit.schedules.paper, which the cell reads)."""
    printed = cell_stdout(cell_by_id(cells, "b8d18663")).splitlines()
    rows = []
    for line in printed[1:]:
        if " zbkit " in line:
            model, mb = line.split()[0], int(line.split()[1])
            pp, h, a, runs = TABLE6[model]
            mem_w = 32 * h / (34 * h + 5 * a * 1024)
            rows.append((model, mb, pp, Costs(*runs[mb], mem_activation=1.0, mem_weight=mem_w)))
    return rows


def test_03_zb_1p_is_zb_h1_because_zb_h1_reaches_the_lower_bound():
    cells = read_cells("03_schedules_and_bubbles")
    printed = [line for line in cell_stdout(cell_by_id(cells, "b8d18663")).splitlines() if line]
    assert printed[0].split() == ["model", "m", "1F1B", "ZB-H1", "ZB-H2", "ZB-1p", "ZB-2p"]
    rows = _paper_rows(cells)
    assert "TABLE6" in cell_source(cell_by_id(cells, "b8d18663"))  # the paper's times, as quoted
    assert len(printed) == 1 + 2 * len(rows) == 9  # each row: zbkit's, then the paper's
    ours = [line for line in printed[1:] if " zbkit " in line]
    for line, (model, mb, pp, costs) in zip(ours, rows, strict=True):
        name, m, _, *rates = line.split()
        assert (name, int(m)) == (model, mb)
        assert rates[1] == rates[3]  # the column the learner asked about: ZB-1p = ZB-H1
        assert float(rates[4]) < float(rates[2])  # ZB-2p beats ZB-H2
        # why: at p activations zb-auto keeps ZB-H1, which reaches the lower bound, so
        # nothing else is even timed (the oracle: zb-auto's own search, not shown in 03)
        search = explain_auto(pp=pp, microbatches=mb, costs=costs, memory_limit=pp)
        assert search.chosen.name == "ZB-H1"
        others = [t for t in search.tried if t.candidate is not search.chosen]
        assert others and all("ZB-H1 reaches the lower bound" in t.note for t in others)
        h1 = simulate(build_schedule("zb-h1", pp=pp, microbatches=mb), costs)
        assert f"{h1.bubble_rate:.4f}" == rates[1] == rates[3]
    # the notebook says so, and leaves the search itself to the appendix (issue 36)
    why = " ".join(cell_source(next_cell(cells, cell_by_id(cells, "b8d18663"))).split())
    assert "ZB-1p is ZB-H1 in every row" in why and "nothing beats ZB-H1" in why
    shown = "".join(cell_stdout(c) for c in cells if c["cell_type"] == "code")
    assert "not run:" not in shown and "explain_auto" not in "".join(cell_source(c) for c in cells)


def _plot_call(source: str) -> ast.Call:
    calls = [
        n
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "plot_schedule"
    ]
    assert len(calls) == 1, source
    return calls[0]


def test_08_dashed_outlines_the_text_names_are_drawn():
    cells = read_cells("08_torch_pipelining")
    call = _plot_call(cell_source(cell_by_id(cells, "fef17b0e")))
    literal = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg != "simulation"}
    assert "simulation" in {k.arg for k in call.keywords}
    assert "dashed outline" in cell_source(next_cell(cells, cell_by_id(cells, "fef17b0e")))
    # the same call on a run 10% slower than its simulation: outlines, dashed, one per action
    sim = simulate(build_schedule("zb-v", pp=2, microbatches=4), Costs(1, 1, 1))
    slower = [e._replace(start=1.1 * e.start, end=1.1 * e.end) for e in sim.events]
    fig = plot_schedule(slower, simulation=sim, **literal)
    ax = fig.axes[0]
    outlines = next(c for c in ax.collections if c.get_gid() == "simulated")
    assert len(outlines.get_paths()) == len(sim.events)
    (offset, dashes) = outlines.get_linestyle()[0]
    assert dashes is not None and len(dashes) >= 2  # dashed, not solid
    assert "simulated" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_08_torch_error_is_shown_whole():
    torch = pytest.importorskip("torch")
    from torch.distributed.pipelining import stage as torch_stage

    # the same failure as the notebook's TiedStage: one Linear used twice
    lin, mid = torch.nn.Linear(6, 6), torch.nn.Linear(6, 6)
    x = torch.randn(4, 6, requires_grad=True)
    out = lin(torch.tanh(mid(lin(x))))
    params = [*lin.parameters(), *mid.parameters()]
    with pytest.raises(RuntimeError) as caught:
        _, groups = torch_stage.stage_backward_input((out,), (torch.ones_like(out),), [x], params)
        torch_stage.stage_backward_weight(params, groups)
    message = " ".join(str(caught.value).split())
    assert len(message) > 90  # what the notebook used to cut
    shown = " ".join(cell_stdout(cell_by_id(read_cells("08_torch_pipelining"), "a675c013")).split())
    assert shown == f"torch's split backward fails: {message}"


def test_08_hang_demo_runs_from_an_installed_zbkit():
    cells = read_cells("08_torch_pipelining")
    code = "\n".join(cell_source(c) for c in cells if c["cell_type"] == "code")
    assert "tests" not in re.findall(r"[\"'](\w+)[\"']", code)  # no path into the repo's tests
    cell = cell_by_id(cells, "91f92900")
    assert '"-m", "zbkit.debug_demo"' in cell_source(cell)
    # the module the notebook runs lives in the package, not beside it
    spec = importlib.util.find_spec("zbkit.debug_demo")
    assert spec is not None and spec.origin is not None
    assert Path(spec.origin).parent == Path(zbkit.__file__).parent
    shown = cell_stdout(cell)
    assert "torchrun failed: True" in shown
    assert "rank 0  0F0 [0B0] 0F1  0B1  <-- WAITING HERE" in shown
    assert "rank 1  1F0  1B0 [1F1] 1B1  <-- WAITING HERE" in shown
