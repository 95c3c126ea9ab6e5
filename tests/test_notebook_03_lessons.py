"""Notebook 03's lessons print what the simulator and the formulas say, and its text agrees.

Read from the stored outputs (a real run's, which nbval re-checks): each table against the
simulator run here and against the closed form written out here, and the numbers the text
quotes against the table beside it. And one model throughout: no cell halves the costs by
hand (issue 22: a `Costs` is a rank's share; chunks split it).
"""

from __future__ import annotations

import ast
import re

from notebook_cells import cell_by_id, cell_source, cell_stdout, read_cells

from zbkit.schedules import Costs, build_schedule, simulate

CELLS = read_cells("03_schedules_and_bubbles")  # read once: no test changes a cell
P, M = 4, 8
UNIT = Costs(F=1, I=1, W=1)


def _figure(cell_id: str) -> str:
    """The text/plain of a cell's stored figure: '<ZbFigure ...: makespan 12, bubble 75.0%>'."""
    plains = [
        "".join(o["data"]["text/plain"])
        for o in cell_by_id(CELLS, cell_id)["outputs"]
        if "image/png" in o.get("data", {})
    ]
    assert len(plains) == 1, cell_id
    return plains[0]


def _prose(cell_id: str) -> str:
    """A markdown cell's text with line breaks as spaces."""
    return " ".join(cell_source(cell_by_id(CELLS, cell_id)).split())


def _sim(name: str, m: int = M, **options: object) -> object:
    return simulate(build_schedule(name, pp=P, microbatches=m, **options), UNIT)


def test_naive_split_keeps_one_device_busy_at_a_time():
    naive = _sim("gpipe", m=1)
    assert naive.bubble_rate == (P - 1) / P
    printed = cell_stdout(cell_by_id(CELLS, "why-naive"))
    assert printed.startswith(
        f"rank 0 works {naive.busy[0]:g} of its span of {naive.span[0]:g} time units: "
        f"bubble {(P - 1) / P:.0%}, (p-1)/p = {(P - 1) / P:.0%}"
    )
    assert f"makespan {naive.makespan:g}, bubble {naive.bubble_rate:.1%}" in _figure("why-naive")
    assert all(busy / naive.makespan == 1 / P for busy in naive.busy)
    text = _prose("why-memory-md")
    assert "Rank 0 is idle `(p-1)/p` of its span, and every device works `1/p` of the" in text


def test_memory_table_and_the_text_beside_it():
    params = 12 * 32 * 4096**2  # the cell's model: 32 layers of width 4096
    state = 16 * params / 2**30  # GiB, Adam in mixed precision
    rows = {
        line[:17].strip(): line[17:].split()
        for line in cell_stdout(cell_by_id(CELLS, "why-memory")).splitlines()
        if line.endswith(("step)", "layer", "boundary"))
    }
    assert rows["data parallel"][:2] == [f"{state:g}", "GiB"]
    assert rows["tensor parallel"][:3] == [f"{state / P:g}", "GiB", str(4 * 32)]
    assert rows["pipeline parallel"][:3] == [f"{state / P:g}", "GiB", str(2 * (P - 1))]
    text = _prose("why-memory-after")
    assert f"needs {state:g} GiB of state on every device" in text
    assert state * 2**30 > 80e9  # "more than an 80 GB GPU holds"
    assert f"bring it down to {state / P:g}" in text
    assert f"pays {4 * 32} all-reduces per microbatch" in text
    assert f"pipeline parallelism {2 * (P - 1)} sends" in text


def test_m_sweep_is_the_simulator_and_the_formula():
    lines = cell_stdout(cell_by_id(CELLS, "m-sweep")).splitlines()
    assert lines[0].split() == ["m", "microbatch", "1F1B", "(p-1)/(m+p-1)", "(p-1)/m", "ZB-H1",
                                "closed", "form"]  # fmt: skip
    rows = {int(line.split()[0]): line.split()[1:] for line in lines[1:]}
    assert sorted(rows) == [1, 2, 4, 8, 16, 32, 64]
    for m, (batch, one_f1b, formula, rough, zb_h1, h1_form) in rows.items():
        assert int(batch) == 64 // m
        assert one_f1b == formula == f"{(P - 1) / (m + P - 1):.2%}"
        assert one_f1b == f"{_sim('1f1b', m).bubble_rate:.2%}"
        assert rough == f"{(P - 1) / m:.2%}"
        assert zb_h1 == f"{_sim('zb-h1', m).bubble_rate:.2%}"
        idle = (P - 1) * (UNIT.F + UNIT.I - UNIT.W)  # ZB-H1's closed form, from m = p on
        work = m * (UNIT.F + UNIT.I + UNIT.W)
        assert h1_form == ("-" if m < P else f"{idle / (idle + work):.2%}")
    text = _prose("m-after")
    assert f"cuts 1F1B's bubble from {rows[8][1]} to {rows[64][1]}" in text
    assert "here to one sequence" in text and rows[64][0] == "1"


def _table() -> dict[str, list[str]]:
    lines = cell_stdout(cell_by_id(CELLS, "interleaved-bfs")).splitlines()
    return {line.split()[0]: line.split()[1:] for line in lines[1:]}


def test_interleaved_placement_picture_and_table():
    inter = build_schedule("interleaved-1f1b", pp=P, microbatches=M)
    assert inter.stage_to_rank == [s % P for s in range(2 * P)]  # round robin
    printed = cell_stdout(cell_by_id(CELLS, "interleaved-plot"))
    assert f"stage -> rank: {inter.stage_to_rank}" in printed
    assert "each chunk: Costs(F=0.5, I=0.5, W=0.5," in printed  # Costs.share(2), not by hand
    sim = simulate(inter, UNIT)
    assert f"makespan {sim.makespan:g}, bubble {sim.bubble_rate:.1%}" in _figure("interleaved-plot")
    table = _table()
    assert sorted(table) == ["1f1b", "interleaved-1f1b", "looped-bfs"]
    for name, (makespan, idle, bubble, hops, *peaks) in table.items():
        sch = build_schedule(name, pp=P, microbatches=M)
        got = simulate(sch, UNIT)
        s2r = sch.stage_to_rank
        assert makespan == f"{got.makespan:g}" and idle == f"{got.idle[0]:g}"
        assert bubble == f"{got.bubble_rate:.1%}"
        assert int(hops) == sum(a != b for a, b in zip(s2r, s2r[1:], strict=False))
        assert " ".join(peaks) == ", ".join(f"{x:g}" for x in got.peak_memory)
    # interleaving divides the idle time by v = 2: the closed form (p-1)(F+I+W)/v
    assert float(table["interleaved-1f1b"][1]) == (P - 1) * 3 / 2 == float(table["1f1b"][1]) / 2


def test_interleaved_text_quotes_its_table():
    t = _table()
    one, dfs, bfs = t["1f1b"], t["interleaved-1f1b"], t["looped-bfs"]
    why = _prose("interleaved-why")
    assert f"{dfs[1]} on rank 0 against 1F1B's {one[1]}" in why
    after = _prose("interleaved-after")
    assert dfs[2] == bfs[2] and dfs[3] == bfs[3]  # same bubble, same hops
    shown = f"same bubble ({dfs[2]} against 1F1B's {one[2]}, makespan {dfs[0]} against {one[0]})"
    assert shown in after
    assert f"same {dfs[3]} hops against {one[3]}" in after
    assert f"Depth-first holds {dfs[4].rstrip(',')} rank-microbatches on rank 0" in after
    assert f"(1F1B: {one[4].rstrip(',')})" in after
    assert set(bfs[4:]) == {f"{M},", f"{M}"} and f"all {M} microbatches'" in after  # = m


def test_zb_v_is_compared_on_the_same_model():
    cells = {"zb-v": "31c9f38c", "zb-h1": "4d1f0789", "inter": "interleaved-plot"}
    spans = {n: re.search(r"makespan ([\d.]+)", _figure(c)).group(1) for n, c in cells.items()}
    text = _prose("80b5bc54")
    assert (
        f"title, {spans['zb-v']}, is shorter than ZB-H1's {spans['zb-h1']} and interleaved "
        f"1F1B's {spans['inter']} on the same model" in text
    )
    assert float(spans["zb-v"]) < float(spans["zb-h1"]) < float(spans["inter"])


def test_closed_forms_match_the_simulator_interleaved_included():
    blocks = cell_stdout(cell_by_id(CELLS, "cff881a8")).split("F=")[1:]
    assert len(blocks) == 2
    for block in blocks:
        rows = {line.split()[0]: line.split()[1:] for line in block.splitlines()[2:]}
        assert "interleaved-1f1b" in rows
        for name, (simulated, form) in rows.items():
            assert form in ("-", simulated), (name, simulated, form)
    table = cell_source(cell_by_id(CELLS, "e7b20852"))
    assert "| interleaved 1F1B | (p-1)(F+I+W)/v |" in table
    assert "work =\nm(F+I+W) whatever the number of chunks" in table


def test_one_costs_for_every_schedule():
    # no cell halves the costs by hand: no Costs built from a division, no F or I of 0.5
    for cell in CELLS:
        if cell["cell_type"] == "markdown":
            text = cell_source(cell)
            assert "F = I = W = 0.5" not in text and "m·v·(F+I+W)" not in text, cell["id"]
            continue
        for node in ast.walk(ast.parse(cell_source(cell))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Costs":
                times = [
                    *node.args[:3],
                    *(k.value for k in node.keywords if k.arg in ("F", "I", "W")),
                ]
                divided = [n for t in times for n in ast.walk(t) if isinstance(n, ast.BinOp)]
                assert not divided, cell_source(cell)
                halves = [*node.args[:2], *(k.value for k in node.keywords if k.arg in ("F", "I"))]
                assert not any(getattr(v, "value", None) == 0.5 for v in halves), cell_source(cell)
        assert "half" not in cell_source(cell), cell["id"]


def test_paper_rows_stand_under_zbkits_and_the_text_says_where_they_differ():
    # the oracle: the paper's Table 5 as quoted in zbkit.schedules.paper, and the text's claim
    from zbkit.schedules.paper import TABLE5

    cell = next(c for c in CELLS if "TABLE5[model, mb]" in cell_source(c))
    lines = cell_stdout(cell).splitlines()[1:]
    zbkit_rows = [line.split() for line in lines if " zbkit " in line]
    paper_rows = [line.split() for line in lines if " paper " in line]
    assert len(zbkit_rows) == len(paper_rows) == 4
    for ours, theirs in zip(zbkit_rows, paper_rows, strict=True):
        published = TABLE5[ours[0], int(ours[1])]
        assert [float(x) for x in theirs[1:]] == list(published)
        assert ours[3:7] == theirs[1:5]  # 1F1B, ZB-H1, ZB-H2, ZB-1p: all four digits
        zb2p = float(ours[7])
        assert zb2p <= published[4], ours  # the search is never worse than the paper's ZB-2p
    text = " ".join(cell_source(c) for c in CELLS if c["cell_type"] == "markdown")
    assert "match the paper's to all four printed digits" in text
    first_equal = zbkit_rows[0][7] == paper_rows[0][5]
    rest_lower = all(
        float(o[7]) < float(t[5]) for o, t in zip(zbkit_rows[1:], paper_rows[1:], strict=True)
    )
    assert first_equal and rest_lower and "lower in the other three" in text
