"""What appendix 10 says beside its numbers is true to the numbers it printed, and it keeps to
the public API (issue 36: no private module, no pattern matching over notes).

Oracles: `explain_auto`, `lower_bound` and `lower_bound_parts` asked here, against the stored
outputs (a real run's, which nbval re-checks) and the text beside them.
"""

from __future__ import annotations

import re

from notebook_cells import cell_index, cell_source, cell_stdout, read_cells

from zbkit.schedules import Costs, explain_auto, lower_bound, lower_bound_parts

NOTEBOOK = "10_inside_zb_auto"
P, M = 4, 8
COSTS = Costs(F=1, I=1, W=0.5, mem_activation=1.0, mem_weight=0.3)


def _after(holding: str) -> tuple[str, str]:
    cells = read_cells(NOTEBOOK)
    i = cell_index(cells, holding)
    return cell_stdout(cells[i]), " ".join(cell_source(cells[i + 1]).split())


def test_10_uses_the_public_api_only():
    for cell in read_cells(NOTEBOOK):
        if cell["cell_type"] != "code":
            continue
        src = cell_source(cell)
        assert not re.search(r"\bimport re\b|\bre\.(match|search|findall)", src), src
        for line in src.splitlines():
            if line.startswith(("import ", "from ")):
                assert not re.search(r"(^|[ .,])_\w", line), line  # no private module or name


def test_10_bound_parts_table():
    printed, _ = _after("lower_bound_parts(pp=p")
    head, *rows = printed.splitlines()
    for row in rows:
        limit, *values = row.split()
        parts = lower_bound_parts(pp=P, microbatches=M, costs=COSTS, memory_limit=float(limit))
        names = ["busy", "round trips", "one trip", "rank 0", "last stage", "walk"]
        assert [float(v) for v in values[:-1]] == [round(parts[n], 6) for n in names], row
        assert float(values[-1]) == max(parts.values())


def test_10_tight_search_text():
    printed, text = _after("tight = explain_auto(")
    tight = explain_auto(pp=P, microbatches=M, costs=COSTS, memory_limit=3)
    spans = {t.candidate.name: t.span for t in tight.tried}
    instant = lower_bound(pp=P, microbatches=M, costs=COSTS, memory_limit=3)
    greedies = {s for n, s in spans.items() if n.startswith("greedy")}
    assert len(greedies) == 1, greedies  # "the greedies 29": all the same
    (greedy,) = greedies
    assert spans["ZB-H1"] is None and spans["ZB-H2"] is None  # "both over the limit"
    assert f"The construction reaches {spans['construction']:g}" in text
    assert f"the greedies {greedy:g}, above the instant bound, {instant:g}" in text
    assert tight.chosen.name == "exact (CP-SAT)" and tight.span < greedy
    assert f"from the greedies' {greedy:g}, finds {tight.span:g}" in text
    assert tight.lower_bound >= tight.span - 1e-9 > instant  # proven, above the instant bound
    assert f"kept exact (CP-SAT): span {tight.span:g}" in printed


def test_10_roomy_search_and_sweep():
    found = explain_auto(pp=P, microbatches=M, costs=COSTS, memory_limit=5)
    assert found.chosen.name == "construction"
    assert found.span <= lower_bound(pp=P, microbatches=M, costs=COSTS, memory_limit=5) + 1e-9
    printed, text = _after("candidates built")
    rows = [r.split() for r in printed.splitlines()[1:]]
    from_5 = [r for r in rows if float(r[0]) >= 5]
    assert all(r[2] == "construction" and r[-3] == "3" for r in from_5), from_5
    assert "From 5 on the construction reaches the bound after 3 candidates" in text


def test_10_v_search_and_its_proof():
    cells = read_cells(NOTEBOOK)
    printed = cell_stdout(cells[cell_index(cells, 'placement="v")\nfates')])
    v = explain_auto(pp=P, microbatches=M, costs=COSTS, memory_limit=4.5, placement="v")
    assert v.chosen.name == "reference V heuristic" and v.span > v.lower_bound
    assert f"kept reference V heuristic: span {v.span:g}" in printed
    solved = cell_stdout(cells[cell_index(cells, "best = solve(")])
    value = float(re.search(r"span ([\d.]+), bound ([\d.]+): optimal", solved).group(1))
    assert value < v.span and f"{v.span / value - 1:.2%} above the optimum" in solved
