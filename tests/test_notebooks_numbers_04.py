"""What notebook 04 says beside its numbers is true to the numbers it printed.

Read from the stored outputs (a real run's, which nbval re-checks): the text's claims against
the table printed next to it, one simulation's numbers wherever it is shown, and the machine
reading beside every measured table (issue 22).
"""

from __future__ import annotations

import re

from notebook_cells import (
    cell_index,
    cell_source,
    cell_stdout,
    find_cell,
    prose_numerals,
    read_notebook,
)

WIDGETS = "application/vnd.jupyter.widget-state+json"


# ---------------------------------------------------------------------- 04: the V family
def _v_family(nb: dict) -> tuple[dict[tuple[str, float], tuple[str, str]], str]:
    """(name, overlap) -> (makespan, bubble) as printed, and the markdown after the table."""
    i = cell_index(nb["cells"], 'rows.append(("dualpipev", hides))')
    cell = nb["cells"][i]
    rows = {}
    for line in cell_stdout(cell).splitlines()[1:]:
        name, overlap, makespan, bubble, *_ = line.split()
        rows[name, float(overlap)] = (makespan, bubble)
    return rows, cell_source(nb["cells"][i + 1])


def test_04_dualpipev_is_called_what_its_numbers_show():
    rows, text = _v_family(read_notebook("04_memory"))
    dual, zbv = rows["dualpipev", 0.25], rows["zb-v", 0.0]
    makespans = {key: float(m) for key, (m, _) in rows.items()}
    bubbles = {key: float(b.rstrip("%")) for key, (_, b) in rows.items()}
    # with overlap it has the shortest step, but not the smallest bubble: ZB-V's is smaller
    assert min(makespans, key=makespans.__getitem__) == ("dualpipev", 0.25)
    assert bubbles["dualpipev", 0.25] > bubbles["zb-v", 0.0]
    assert "fastest" not in text  # "fastest" names no metric; the text says which it wins
    assert f"shortest of the four (makespan\n  {dual[0]} against ZB-V's {zbv[0]})" in text
    assert f"bubble rate stays higher ({dual[1]} against {zbv[1]})" in text
    no_overlap = rows["dualpipev", 0.0]
    assert f"(makespan {no_overlap[0]} against {zbv[0]})" in text


def test_04_dualpipev_grid_is_a_table_that_fits_the_page():
    nb = read_notebook("04_memory")
    cell = find_cell(nb["cells"], 'build_schedule("dualpipev", pp=2, microbatches=4)')
    tables = [o["data"]["text/html"] for o in cell["outputs"] if "text/html" in o.get("data", {})]
    assert len(tables) == 1, "the small DualPipeV is shown as its HTML grid"
    html = "".join(tables[0])
    header = re.search(r"<tr>(.*?)</tr>", html).group(1)
    steps = header.count("<th") - 1  # the first is the "step" label
    assert steps <= 20, f"{steps} columns: wider than a notebook page"
    assert html.count("linear-gradient") >= 4  # the overlapped pairs: two colours a cell
    # nothing printed in the notebook is wider than a page either
    for c in nb["cells"]:
        for line in cell_stdout(c).splitlines() if c["cell_type"] == "code" else []:
            assert len(line) <= 110, f"a printed line of {len(line)} characters wraps: {line}"


# ---------------------------------------------------------------------- 04: bytes per rank
def _per_rank(text: str) -> dict[tuple[str, int], list[float]]:
    """(schedule, rank) -> the row's MiB numbers, from a table printed per schedule and rank."""
    rows = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) > 2 and words[0] in ("1f1b", "zb-h1", "zb-h2", "zb-v"):
            numbers = [float(w) for w in words[2:] if re.fullmatch(r"\d+\.\d+", w)]
            rows[words[0], int(words[1])] = numbers
    return rows


def test_04_planner_says_why_the_v_holds_more_on_rank_0():
    cells = read_notebook("04_memory")["cells"]
    i = cell_index(cells, "def held_at_peak(pred, r):")
    printed, text = cell_stdout(cells[i]), " ".join(cell_source(cells[i + 1]).split())
    rows = _per_rank(printed)
    v0, v1, h1 = rows["zb-v", 0], rows["zb-v", 1], rows["zb-h1", 0]  # peak, params, grads, optim
    assert "zb-v's stage_to_rank: [0, 1, 1, 0]" in printed and "[0, 1, 1, 0]" in text
    assert re.search(r"^zb-v\s+0 0-1 6-7 ", printed, flags=re.M)  # the embedding and the head
    assert all(v > h for v, h in zip(v0[:4], h1[:4], strict=True)), (v0, h1)
    found = re.search(r"peak ([\d.]+x); parameters ([\d.]+x), all gradients ([\d.]+x), "
                      r"optimizer ([\d.]+x)", printed)  # fmt: skip
    assert found, printed
    peak, params, grads, optim = found.groups()
    assert params == grads == optim and f"each {params} ZB-H1's" in text
    assert f"{v0[1]:.2f} MiB of parameters against {h1[1]:.2f}" in text
    assert f"its peak is {peak}, {v0[0]:.2f} MiB against {h1[0]:.2f}" in text
    assert f"rank 1 peaks at {v1[0]:.2f} MiB" in text and v1[0] < h1[0] < v0[0]
    assert f"for a while, {h1[-1]:.2f}" in text  # `other` at ZB-H1's rank 0: Adam's step


def test_04_planner_says_what_the_measured_peaks_showed():
    cells = read_notebook("04_memory")["cells"]
    i = cell_index(cells, "comparisons = {name: planner.compare(")
    printed, text = cell_stdout(cells[i]), " ".join(cell_source(cells[i + 1]).split())
    rows = _per_rank(printed)  # predicted, measured, ratio
    within = sum(abs(r[2] - 1) <= 0.05 for r in rows.values())
    assert f"within 5%: {within} of {len(rows)} ranks" in printed
    assert f"{within} of the {len(rows)} ranks within 5%" in text
    firsts = sorted(r[2] for (_, rank), r in rows.items() if rank == 0)
    assert all(abs(x - 1) <= 0.01 for x in firsts) and "Every rank 0 is predicted within 1%" in text
    said = f"(ratio {firsts[0]:.3f} on each)" if firsts[0] == firsts[-1] else (
        f"(ratios {firsts[0]:.3f} to {firsts[-1]:.3f})")  # fmt: skip
    assert said in text
    every = sorted(r[2] for r in rows.values())
    assert f"({every[0]:.3f} to {every[-1]:.3f})" in text
    # compare's words: one note per rank off by more than 5%, and the text says how many
    short = re.findall(r"^(\S+), rank (\d): predicted (\d+)% less than measured", printed, re.M)
    assert len(short) == len(rows) - within
    if not short:
        assert "here it has nothing to say about bytes" in text
    found = re.search(r"measured on rank 0: .*, ([\d.]+x)$", printed, flags=re.M)
    assert found and f"peaks at {found.group(1)} ZB-H1's" in text


# ---------------------------------------------------------------------- 04: every figure said
def _text_after(cells: list[dict], holding: str) -> tuple[str, str]:
    """What the cell holding `holding` printed, and the markdown right after it (one line)."""
    i = cell_index(cells, holding)
    return cell_stdout(cells[i]), " ".join(cell_source(cells[i + 1]).split())


def test_04_first_table_bullets():
    printed, text = _text_after(
        read_notebook("04_memory")["cells"], "peak memory per rank (rank-microbatches)"
    )
    peaks = {}
    for line in printed.splitlines()[1:]:
        name, _, rest = line.split(maxsplit=2)
        peaks[name] = [float(x) for x in rest.strip("[]").split(",")]
    assert f"({peaks['zb-h2'][0]:g} against {peaks['1f1b'][0]:g})" in text  # "7 against 4"
    assert peaks["zb-v"] == [peaks["1f1b"][0]] * 4 and f"Its {peaks['zb-v'][0]:g} are" in text


def _frontier(cells: list[dict]) -> tuple[dict[str, list[tuple[float, float]]], str]:
    printed, text = _text_after(cells, "of zb-auto's curves, only their frontier points")
    listing: dict[str, list[tuple[float, float]]] = {}
    for line in printed.splitlines()[1:]:
        label, memory, bubble = re.match(
            r"(.+?)\s+(?:limit \S+\s+)?memory ([\d.]+)\s+bubble\s+([\d.]+)%", line
        ).groups()
        listing.setdefault(label, []).append((float(memory), float(bubble)))
    return listing, text


def test_04_frontier_bullets_tell_the_listing():
    listing, text = _frontier(read_notebook("04_memory")["cells"])

    def one(name: str) -> tuple[float, float]:
        (point,) = listing[name]
        return point

    def auto_v(memory: float) -> float:
        return next(b for x, b in listing["zb-auto (v)"] if x == memory)

    at_4 = [one(n)[1] for n in ("1f1b", "zb-h1", "interleaved-zb", "zb-v")] + [auto_v(4)]
    assert all(one(n)[0] == 4 for n in ("1f1b", "zb-h1", "interleaved-zb", "zb-v"))
    said = [f"{b:.1f}%" for b in at_4]
    assert (
        f"from {said[0]} (1F1B) to {said[1]} (ZB-H1), {said[2]} (interleaved ZB), "
        f"{said[3]} (ZB-V) and {said[4]} (zb-auto, V)"
    ) in text
    assert at_4 == sorted(at_4, reverse=True)  # "falls"
    h2 = one("zb-h2")
    same = next(x for x, b in listing["zb-auto (v)"] if abs(b - h2[1]) < 1e-9)
    assert f"gets with {same:g}" in text and f"needs {h2[0]:g} for {h2[1]:.1f}%" in text
    half = one("v-half")
    assert half[1] > auto_v(half[0]) and half[1] - auto_v(half[0]) < 1  # "just above"
    assert f"V-Half ({half[0]:g}, {half[1]:.1f}%) sits just above" in text
    assert f"at the same memory ({auto_v(half[0]):.1f}%)" in text
    dual, zbv = one("dualpipev"), one("zb-v")
    assert dual[0] > zbv[0] and dual[1] > zbv[1]  # "slower than ZB-V with more memory"


def test_04_v_family_shares_of_zb_v_memory():
    cells = read_notebook("04_memory")["cells"]
    printed, text = _text_after(cells, 'rows.append(("dualpipev", hides))')
    rows = {}
    for line in printed.splitlines()[1:]:
        name, overlap, _, bubble, share, *_ = line.split()
        rows[name, float(overlap)] = (bubble, float(share))
    half, least, zbv = rows["v-half", 0.0], rows["v-min", 0.0], rows["zb-v", 0.0]
    assert zbv[1] == 1
    assert f"hold {half[1]:g} and {least[1]:g} of ZB-V's memory" in text
    assert f"bubbles of {half[0]} and {least[0]} against ZB-V's {zbv[0]}" in text
    assert "1/3" not in text and "1/2" not in text  # the old words the table contradicted


def test_04_profile_and_gap_words():
    cells = read_notebook("04_memory")["cells"]
    printed, text = _text_after(cells, "embedding and head: {ends")
    share = re.search(r"embedding and head: (\d+%) of the parameters", printed).group(1)
    assert f"hold {share} of the parameters" in text
    # no measured time in any markdown cell (timings live in notebook 10, printed)
    for c in cells:
        if c["cell_type"] == "markdown":
            assert not re.search(r"\d+(\.\d+)? ?s\b(?! of)", cell_source(c)), cell_source(c)


# every numeral of the prose (outside `code`, tables and headings), per cell, and why it is
# true: a value the code sets, a name, or a claim checked against the output, here or in
# tests/exercises/test_exercises_04.py (the sweep, the frontier, the gap table, the real run)
NUMERALS = {
    "0452deab": ["0", "02", "03", "1"],  # rank 0, notebooks 02 and 03, mem_activation is 1
    "6c1aa72d": ["1", "1"],  # F = I = W = 1 (the code)
    "44843649": ["1", "0.3"],  # 1F1B; mem_weight=0.3 (the code)
    # 1F1B; 7 against 4, ZB-V's 4: test_04_first_table_bullets; m = 8 (the code), two chunks
    "3e4321e3": ["1", "1", "0", "7", "4", "1", "0", "4", "8"],
    "d109deab": ["0.5", "1"],  # W = 0.5 (the code), 1F1B
    # test_the_sweep_text_tells_its_table
    "7561770f": ["4", "18.37%", "5", "7", "13.04%", "5", "11.11%", "6.0", "7.0", "7.3", "8"]
    + ["5", "10", "5"],  # "a peak of 5 ... under 5", appendix 10
    # test_04_frontier_bullets_tell_the_listing, test_the_frontier_and_v_family_bullets_...
    "a1f0c3e4": ["2", "1", "4", "4.9", "1", "4", "27.3%", "1", "18.4%", "10.1%", "7.0%"]
    + ["5.9%", "7", "13.0%", "3.5", "3", "19.2%", "18.4%", "4.5", "15.8%"],
    "9a45c398": ["1", "0", "2024"],  # 1F1B, rank 0, a citation
    # test_04_v_family_shares_of_zb_v_memory, test_04_dualpipev_is_called_what_its_numbers_show;
    # pp=2, m=4 (the code: 2 ranks, 2p = 4 microbatches)
    "230f8ee0": ["0.75", "0.5", "19.19%", "31.62%", "6.98%", "4.5", "4", "23.8", "21.5"]
    + ["21.2", "21.5", "11.76%", "6.98%", "2", "2", "4"],
    "e24gap01": ["10", "3", "1"],  # appendix 10; the limit 3 (the code), 1F1B
    "e24gap03": ["4", "3", "27.5", "28.5"],  # test_the_gap_table_is_zb_auto_against_the_...
    "e24byte1": ["2"],  # 2 gloo ranks (the code)
    "e24byte3": ["78%", "2"],  # test_04_profile_and_gap_words; 2 ranks
    # test_04_planner_says_why_the_v_holds_more_on_rank_0 (stage_to_rank's 0, 1, 1, 0 too)
    "e24byte5": ["0", "0", "3", "0", "1", "1", "0", "1.71", "0", "4.42", "2.58", "1.87"]
    + ["26.94", "14.38", "1", "5.44", "0", "4.06", "2"],
    # test_04_planner_says_what_the_measured_peaks_showed
    "e24byte7": ["0", "1%", "0.996", "8", "8", "5%", "0.956", "0.997", "0", "1.87", "5%"],
    "fa96a1d4": ["1", "0"],  # 1F1B, rank 0 ... in the Recap's words
    "10755c2a": ["1", "4", "0", "1", "1"],  # Exercise 1: 4 numbers, rank 0, 1F1B
    "ae0cbe67": ["2", "4", "8"],  # Exercise 2: p = 4, m = 8 (the code)
    "b91d7c35": ["3", "8", "4", "0"],  # Exercise 3: 8 stages on 4 ranks, rank 0
    "7753675b": ["4", "8", "9", "16"],  # Exercise 4: its own p and limits
}


def test_04_every_numeral_in_the_prose_is_accounted_for():
    assert prose_numerals(read_notebook("04_memory")["cells"]) == NUMERALS
