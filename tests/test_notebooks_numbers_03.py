"""What notebook 03 says beside its numbers is true to the numbers it printed (issue 36).

Read from the stored outputs (a real run's, which nbval re-checks): each figure-bearing
sentence against the table or picture beside it, and the simulator run here as the oracle.
The last test lists every numeral the prose holds, so a new one cannot slip in unchecked.
(The tables themselves against the simulator: tests/test_notebook_03_lessons.py.)
"""

from __future__ import annotations

import re

from notebook_cells import cell_by_id, cell_source, cell_stdout, prose_numerals, read_cells

from zbkit.schedules import Costs, build_schedule, simulate

CELLS = read_cells("03_schedules_and_bubbles")
P, M = 4, 8  # the notebook's p and m (its first code cell)
UNIT = Costs(F=1, I=1, W=1)


def _prose(cell_id: str) -> str:
    """A markdown cell's text with line breaks as spaces."""
    return " ".join(cell_source(cell_by_id(CELLS, cell_id)).split())


def _figure(cell_id: str) -> str:
    """The text/plain of a cell's stored figure: '<ZbFigure ...: makespan 27, bubble 0.0%>'."""
    (plain,) = [
        "".join(o["data"]["text/plain"])
        for o in cell_by_id(CELLS, cell_id)["outputs"]
        if "image/png" in o.get("data", {})
    ]
    return plain


def _shown(cell_id: str) -> tuple[float, str]:
    found = re.search(r"makespan ([\d.]+), bubble ([\d.]+%)", _figure(cell_id))
    assert found, _figure(cell_id)
    return float(found.group(1)), found.group(2)


def _table(cell_id: str) -> dict[str, dict[str, str]]:
    """A `compare(...)` table as printed: name -> column -> value."""
    lines = cell_stdout(cell_by_id(CELLS, cell_id)).splitlines()
    columns = ["makespan", "span", "bubble", "peak", "hops", "synced", "post"]
    rows = {
        line.split()[0]: dict(zip(columns, line.split()[1:], strict=True)) for line in lines[1:-1]
    }
    assert lines[-1].startswith("zero-bubble rate")
    rows["zero"] = {"rate": lines[-1].split()[-1]}
    return rows


def test_the_code_sets_p_m_and_the_costs_the_text_names():
    setup = cell_source(cell_by_id(CELLS, "4f980069"))
    assert "p, m = 4, 8" in setup and "unit = Costs(F=1, I=1, W=1)" in setup
    assert "microbatches=1)" in cell_source(cell_by_id(CELLS, "why-naive"))  # "`m = 1`"
    assert "batch = 64" in cell_source(cell_by_id(CELLS, "m-sweep"))  # "64 sequences"


def test_one_device_works_at_a_time_without_microbatches():
    naive = simulate(build_schedule("gpipe", pp=P, microbatches=1), UNIT)
    spans = sorted((e.start, e.end) for e in naive.events)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False))
    assert "One device works at a time" in _prose("why-md")
    assert all(busy / naive.makespan == 1 / P for busy in naive.busy)
    assert "Every device works `1/p` of the time: four devices do the work of one" in _prose(
        "why-memory-md"
    )


def test_sixteen_bytes_a_parameter():
    # bf16 weight and gradient (2 + 2), fp32 master copy and Adam's two moments (3 x 4)
    assert 2 + 2 + 3 * 4 == 16
    assert "each parameter costs 16 bytes of state" in _prose("why-memory-md")
    assert "state = 16 * params" in cell_source(cell_by_id(CELLS, "why-memory"))
    assert "12 * layers * hidden**2" in cell_source(cell_by_id(CELLS, "why-memory"))
    printed = cell_stdout(cell_by_id(CELLS, "why-memory")).splitlines()
    assert len(printed[2:]) == 3 and "combine all three" in _prose("why-memory-after")


def test_gpipe_and_1f1b_lose_what_the_text_says():
    grid = cell_stdout(cell_by_id(CELLS, "33768c58")).splitlines()
    assert "1F3" in grid[2].split() and grid[2].startswith("rank 1")  # "`1F3` is stage 1's ..."
    gpipe = simulate(build_schedule("gpipe", pp=P, microbatches=M), UNIT)
    one_f1b = simulate(build_schedule("1f1b", pp=P, microbatches=M), UNIT)
    # "rank 0 loses `p-1` forwards and `p-1` backwards"; "holds all `m`"
    assert gpipe.idle[0] == (P - 1) * (UNIT.F + UNIT.I + UNIT.W)
    assert "rank 0 loses `p-1` forwards and `p-1` backwards" in _prose("f27bb203")
    assert gpipe.peak_memory == [M] * P
    # 1F1B: "Same bubble, but rank `r` holds at most `p-r` microbatches' activations"
    assert one_f1b.bubble_rate == gpipe.bubble_rate
    assert one_f1b.peak_memory == [P - r for r in range(P)]
    assert "rank `r` holds at most `p-r` microbatches' activations" in _prose("f27bb203")


def test_every_rank_idles_the_same_whatever_m():
    # "every rank idles `(p-1)(F+I+W)` of the makespan whatever `m` is"
    for m in (1, 4, 8, 64):
        sim = simulate(build_schedule("1f1b", pp=P, microbatches=m), UNIT)
        assert all(sim.makespan - busy == (P - 1) * 3 for busy in sim.busy)
    assert "every rank idles `(p-1)(F+I+W)` of the makespan whatever `m` is" in _prose("m-md")
    # "`2(p-1)` messages" a microbatch: the memory table's pipeline row
    assert "6 sends" in cell_stdout(cell_by_id(CELLS, "why-memory")) and 2 * (P - 1) == 6


def test_interleaving_crossings_and_idle():
    inter = build_schedule("interleaved-1f1b", pp=P, microbatches=M)
    v, s2r = inter.stages_per_rank, inter.stage_to_rank
    crossings = sum(a != b for a, b in zip(s2r, s2r[1:], strict=False))
    assert crossings == v * P - 1 and "`vp-1` rank crossings each way instead of `p-1`" in (
        _prose("interleaved-why")
    )
    sim = simulate(inter, UNIT)
    assert all(sim.makespan - b == (P - 1) * 3 / v for b in sim.busy)  # (p-1)(F+I+W)/v
    assert "At `m = 8`:" in _prose("interleaved-why")
    assert "microbatches=m)" in cell_source(cell_by_id(CELLS, "interleaved-bfs"))


def test_zb_h1_idles_and_holds_what_the_text_says():
    h1 = simulate(build_schedule("zb-h1", pp=P, microbatches=M), UNIT)
    one = simulate(build_schedule("1f1b", pp=P, microbatches=M), UNIT)
    assert all(h1.makespan - b == (P - 1) * (UNIT.F + UNIT.I - UNIT.W) for b in h1.busy)
    assert h1.peak_memory == one.peak_memory  # "keeps 1F1B's order of F and I, and its memory"
    assert "A rank then idles `(p-1)(F+I-W)`, once `m ≥ p`" in _prose("6d32d28b")
    assert _shown("4d1f0789") == (h1.makespan, f"{h1.bubble_rate:.1%}")


def test_zb_h2_zero_and_its_makespan_stand_together():
    # "the bubble rate is 0. But ... one iteration's makespan ... stays ZB-H1's"
    text = _prose("zb-h2-md")
    assert "the bubble rate is 0" in text and "**makespan**" in text and "stays ZB-H1's" in text
    h2_span, h2_bubble = _shown("1854b732")
    h1_span, _ = _shown("4d1f0789")
    assert h2_bubble == "0.0%" and h2_span == h1_span
    # "(more memory)"; and the optimizer step is named right there, not cells later
    t = _table("iterations-table")
    assert float(t["zb-h2"]["peak"]) > float(t["zb-h1"]["peak"])
    assert "optimizer step" in text
    after = _prose("iterations-md")
    assert "**synchronises**" in after and "post-validation" in after


def test_post_validation_is_what_zb_h2_needs():
    t = _table("iterations-table")
    zero = t["zero"]["rate"]
    assert float(zero) == round(1 / (UNIT.F + UNIT.I + UNIT.W), 4)
    text = _prose("iterations-tile-md")
    # "With the sync ZB-H2 is exactly as fast as ZB-H1"
    assert t["zb-h2"]["synced"] == t["zb-h1"]["synced"]
    assert "With the sync ZB-H2 is exactly as fast as ZB-H1" in text
    # "Without it, ZB-H2 ... reaches the zero-bubble rate"
    assert t["zb-h2"]["post"] == zero and "reaches the zero-bubble rate" in text
    # "ZB-H1 gains nothing: its longest span is its makespan"
    assert (
        t["zb-h1"]["post"] == t["zb-h1"]["synced"] and t["zb-h1"]["span"] == t["zb-h1"]["makespan"]
    )
    assert "ZB-H1 gains nothing: its longest span is its makespan" in text
    # "Two iterations of ZB-H2, post-validated": the picture's code
    code = cell_source(cell_by_id(CELLS, "iterations-h2"))
    assert "iterations=2" in code and "optimizer_sync=False" in code
    assert _shown("iterations-h2")[1] == "0.0%"


def test_zb_v_text_against_its_table():
    zbv = build_schedule("zb-v", pp=P, microbatches=4)
    assert zbv.stage_to_rank == [min(s, 2 * P - 1 - s) for s in range(2 * P)]  # r and 2p-1-r
    assert f"stage -> rank: {zbv.stage_to_rank}" in cell_stdout(cell_by_id(CELLS, "31c9f38c"))
    assert any((e.stage, e.kind, e.microbatch) == (5, "F", 3) for e in simulate(zbv, UNIT).events)
    assert _shown("31c9f38c")[1] != "0.0%" and 4 < 2 * P  # "below `m = 2p` a bubble remains"
    t = _table("zbv-compare")
    rows = {n: r for n, r in t.items() if n != "zero"}
    text = _prose("zbv-after")
    # "ZB-V has no bubble, 1F1B's peak memory and the shortest makespan, so it is the fastest
    # with the optimizer step synchronised"
    assert rows["zb-v"]["bubble"] == "0.0%" and rows["zb-v"]["peak"] == rows["1f1b"]["peak"]
    assert min(rows, key=lambda n: float(rows[n]["makespan"])) == "zb-v"
    assert max(rows, key=lambda n: float(rows[n]["synced"])) == "zb-v"
    assert "ZB-V has no bubble, 1F1B's peak memory and the shortest makespan" in text
    # "Its turn on the last rank saves one hop against interleaving"
    assert int(rows["interleaved-1f1b"]["hops"]) - int(rows["zb-v"]["hops"]) == 1
    assert "saves one hop against interleaving" in text
    # "Post-validated, ZB-H2 and ZB-V both reach the zero-bubble rate; ZB-H2 pays in memory"
    assert rows["zb-h2"]["post"] == rows["zb-v"]["post"] == t["zero"]["rate"]
    assert float(rows["zb-h2"]["peak"]) > float(rows["zb-v"]["peak"])
    assert "ZB-H2 and ZB-V both reach the zero-bubble rate; ZB-H2 pays for it in memory" in text


def test_the_closed_forms_costs_and_the_papers_tables():
    code = cell_source(cell_by_id(CELLS, "cff881a8"))
    assert "Costs(F=1, I=1, W=1), Costs(F=1, I=1, W=0.5)" in code  # "W = F and W = F/2"
    assert "for W = F and for W = F/2" in _prose("e7b20852")
    paper = cell_source(cell_by_id(CELLS, "b8d18663"))
    assert "TABLE5" in paper and "TABLE6" in paper  # "(its Table 6)", "(Table 5)"
    assert "for limit in (pp, 2 * pp)" in paper  # "a memory limit of `p` and `2p`"
    assert '"zb-auto"' in paper and "zb-auto" in _prose("b44cd711")


# every numeral of the prose (outside `code`, tables and headings), per cell, and why it is
# true: a value the code sets, a name, or a claim the tests above check against the output
NUMERALS = {
    "92aae3fb": ["1", "1", "02"],  # 1F1B twice, notebook 02
    "why-md": ["1", "0", "0"],  # device 1, device 0 (names)
    "why-memory-md": ["16"],  # test_sixteen_bytes_a_parameter
    "why-memory-after": ["04"],  # notebook 04
    "1f857158": ["1", "3"],  # stage 1, microbatch 3: test_gpipe_and_1f1b_lose_what_the_text_says
    "f27bb203": ["0", "0", "1"],  # rank 0 twice, 1F1B
    "m-md": ["1", "1", "64"],  # "exceeds 1" (lessons test), 1F1B, batch = 64
    "interleaved-md": ["1", "2021", "0", "1"],  # 1F1B, a citation, chunk 0 and 1
    "interleaved-why": ["1", "2023"],  # 1F1B, a citation
    "interleaved-after": ["0", "1"],  # rank 0, 1F1B
    "6d32d28b": ["02", "1"],  # notebook 02, 1F1B
    "zb-h2-md": ["0"],  # test_zb_h2_zero_and_its_makespan_stand_together
    "80b5bc54": ["0", "1", "5", "3"],  # chunk 0 and 1, stage 5 microbatch 3
    "zbv-after": ["1"],  # 1F1B
    "e7b20852": ["2"],  # "F/2": test_the_closed_forms_costs_and_the_papers_tables
    "b44cd711": ["2024", "6", "5", "1", "2"],  # ICLR 2024, Tables 6 and 5, ZB-1p, ZB-2p
    "4e5ec847": ["2", "1"],  # ZB-2p, ZB-1p
    "remember-md": ["1", "1"],  # 1F1B
    "ex03-1": ["1", "1"],  # Exercise 1, F = I = W = 1 (the exercise's costs)
    "ex03-2": ["2", "1", "1"],  # Exercise 2, 1f1b, interleaved-1f1b
    "ex03-3": ["3", "1.5"],  # Exercise 3, the 1.5B model
    "ex03-4": ["4", "1"],  # Exercise 4, 1F1B
    "ex03-5": ["5", "1", "10%"],  # Exercise 5, 1F1B, the exercise's threshold
}


def test_every_numeral_in_the_prose_is_accounted_for():
    assert prose_numerals(CELLS) == NUMERALS
    # and the words for numbers that carry a claim, each checked above
    text = " ".join(_prose(c["id"]) for c in CELLS if c["cell_type"] == "markdown")
    for claim in ("four devices do the work of one", "combine all three", "halve rank 0's idle",
                  "all four printed digits", "the other three", "saves one hop"):  # fmt: skip
        assert claim in text, claim
