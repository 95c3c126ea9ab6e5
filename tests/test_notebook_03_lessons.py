"""Notebook 03's lessons print what the simulator and the formulas say, and its text agrees.

Read from the stored outputs (a real run's, which nbval re-checks): each table against the
simulator run here and against the closed form written out here, and the numbers the text
quotes against the table beside it. And one model throughout: no cell halves the costs by
hand (issue 22: a `Costs` is a rank's share; chunks split it).
"""

from __future__ import annotations

import ast

from notebook_cells import cell_by_id, cell_python, cell_source, cell_stdout, read_cells

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
    assert "Every device works `1/p` of the time: four devices do the work of one" in text
    assert P == 4


def test_memory_table_and_the_text_beside_it():
    params = 12 * 32 * 4096**2  # the cell's model: 32 layers of width 4096
    state = 16 * params / 2**30  # GiB, Adam in mixed precision
    lines = cell_stdout(cell_by_id(CELLS, "why-memory")).splitlines()
    assert lines[1].split()[6:9] == ["fits", "80", "GB"]
    rows = {line[:17].strip(): line[17:].split() for line in lines[2:]}
    assert sorted(rows) == ["data parallel", "pipeline parallel", "tensor parallel"]
    gpu = 80e9 / 2**30
    for name, per_device in [("data parallel", state), ("tensor parallel", state / P),
                             ("pipeline parallel", state / P)]:  # fmt: skip
        assert rows[name][:3] == [f"{per_device:g}", "GiB", "yes" if per_device < gpu else "no"]
    assert rows["data parallel"][2] == "no" and rows["pipeline parallel"][2] == "yes"
    assert rows["tensor parallel"][3] == str(4 * 32)
    assert rows["pipeline parallel"][3] == str(2 * (P - 1))
    text = _prose("why-memory-after")
    assert "Tensor and pipeline parallelism both divide the state by `p`" in text
    assert not any(ch.isdigit() for ch in text.replace("04", ""))  # the table carries them


def test_m_sweep_is_the_simulator_and_the_formula():
    lines = cell_stdout(cell_by_id(CELLS, "m-sweep")).splitlines()
    assert lines[0].split() == ["m", "microbatch", "1F1B", "rate", "(p-1)/(m+p-1)", "idle/work",
                                "(p-1)/m"]  # fmt: skip
    rows = {int(line.split()[0]): line.split()[1:] for line in lines[1:]}
    assert sorted(rows) == [1, 2, 4, 8, 16, 32, 64]
    for m, (batch, one_f1b, formula, ratio) in rows.items():
        assert int(batch) == 64 // m
        assert one_f1b == formula == f"{(P - 1) / (m + P - 1):.2%}"
        assert one_f1b == f"{_sim('1f1b', m).bubble_rate:.2%}"
        assert ratio == f"{(P - 1) / m:.2f}"  # a ratio, not a rate: no percent sign
    # "it exceeds 1 when m < p-1"
    assert all((float(ratio) > 1) == (m < P - 1) for m, (*_, ratio) in rows.items())
    assert "exceeds 1 when `m < p-1`" in _prose("m-md")
    assert rows[64][0] == "1"  # the largest m leaves one sequence a microbatch


def _table() -> dict[str, list[str]]:
    lines = cell_stdout(cell_by_id(CELLS, "interleaved-bfs")).splitlines()
    return {line.split()[0]: line.split()[1:] for line in lines[1:]}


def test_interleaved_placement_picture_and_table():
    inter = build_schedule("interleaved-1f1b", pp=P, microbatches=4)  # drawn at m = 4
    assert inter.stages_per_rank == 2  # the text's `v = 2`: the default
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
    after = _prose("interleaved-after")
    assert "Both orders halve rank 0's idle time (`v = 2`) and pay the same hops" in after
    assert float(dfs[1]) == float(bfs[1]) == float(one[1]) / 2 and dfs[3] == bfs[3]
    # "depth-first holds a little more than 1F1B, breadth-first all `m`, like GPipe"
    peak = {n: max(float(x.rstrip(",")) for x in row[4:]) for n, row in t.items()}
    assert peak["1f1b"] < peak["interleaved-1f1b"] < 1.5 * peak["1f1b"]
    assert {float(x.rstrip(",")) for x in bfs[4:]} == {M}
    assert max(simulate(build_schedule("gpipe", pp=P, microbatches=M), UNIT).peak_memory) == M
    assert "depth-first holds a little more than 1F1B, breadth-first all `m`, like GPipe" in after


def _compare(cell_id: str) -> dict[str, list[str]]:
    """The rows of a `compare(...)` table: name -> makespan, longest span, bubble, peak
    memory, hops, throughput synced, post-validated."""
    lines = cell_stdout(cell_by_id(CELLS, cell_id)).splitlines()
    assert lines[0].split()[:2] == ["schedule", "makespan"]
    return {line.split()[0]: line.split()[1:] for line in lines[1:-1]}


def test_compare_tables_are_the_simulator():
    for cell_id in ("iterations-table", "zbv-compare"):
        for name, row in _compare(cell_id).items():
            sch = build_schedule(name, pp=P, microbatches=M)
            one = simulate(sch, UNIT)
            synced = simulate(sch, UNIT, iterations=3, optimizer_sync=True)
            free = simulate(sch, UNIT, iterations=3, optimizer_sync=False)
            s2r = sch.stage_to_rank
            assert row == [
                f"{one.makespan:g}",
                f"{max(one.span):g}",
                f"{one.bubble_rate:.1%}",
                f"{max(one.peak_memory):g}",
                str(sum(a != b for a, b in zip(s2r, s2r[1:], strict=False))),
                f"{synced.throughput:.4f}",
                f"{free.throughput:.4f}",
            ], (cell_id, name)


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
    assert "rate = bubble / (bubble + m(F+I+W)), whatever the chunks per rank" in " ".join(
        table.split()
    )
    # "Where a closed form's assumption fails (ZB-V with W ≠ F), the simulator still answers"
    rows = {line.split()[0]: line.split()[1:] for line in blocks[1].splitlines()[2:]}
    assert "W=0.5" in blocks[1].splitlines()[0] and rows["zb-v"][1] == "-"
    assert "ZB-V with W ≠ F" in _prose("3099bcb9")


def test_one_costs_for_every_schedule():
    # no cell halves the costs by hand: no Costs built from a division, no F or I of 0.5
    for cell in CELLS:
        if cell["cell_type"] == "markdown":
            text = cell_source(cell)
            assert "F = I = W = 0.5" not in text and "m·v·(F+I+W)" not in text, cell["id"]
            continue
        for node in ast.walk(ast.parse(cell_python(cell))):
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
    text = _prose("4e5ec847")
    assert text.startswith("The first four columns match the paper's to all four printed digits")
    first_equal = zbkit_rows[0][7] == paper_rows[0][5]
    rest_lower = all(
        float(o[7]) < float(t[5]) for o, t in zip(zbkit_rows[1:], paper_rows[1:], strict=True)
    )
    assert first_equal and rest_lower
    assert "ZB-2p is equal in the first row and lower in the other three" in text
