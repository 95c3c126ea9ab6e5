"""Notebook 04: its exercises against answers worked out here, and its text against its outputs.

The oracles: each rank's program walked by hand, one action after the other with the memory
rule written out (04.1, 04.3), zb-auto's builder asked directly (04.2), the simulator read
directly (04.4). Then the notebook: the sweep is drawn at the simulated peaks; the gap table
is zb-auto against `lower_bound` and `solve`; no trace of the old per-chunk rule is left.
(What every exercise shares, its check cell and folded solution, is tested in
test_exercises_all.py.)
"""

from __future__ import annotations

import re
from typing import Any

import matplotlib
import pytest
from notebook_cells import cell_index, cell_source, cell_stdout, read_cells

from zbkit.exercises import check
from zbkit.schedules import Costs, build_schedule, explain_auto, lower_bound, simulate

matplotlib.use("Agg")

NOTEBOOK = "04_memory"
KEYS = [f"04.{k}" for k in range(1, 5)]
P, M = 4, 8
SWEEP = Costs(F=1, I=1, W=0.5, mem_activation=1.0, mem_weight=0.3)


def _judged(key: str, answer: Any) -> tuple[bool | None, str]:
    verdict = check(key, answer)
    return verdict.right, verdict.why


def _walk_peaks(name: str, change: dict[str, float], pp: int = P, m: int = M) -> list[float]:
    """Each rank's peak, its program walked in order: memory changes by change[kind]."""
    schedule = build_schedule(name, pp=pp, microbatches=m)
    peaks = []
    for rank in range(pp):
        held = peak = 0.0
        for action in schedule.actions(rank):
            held += change[action.kind]
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


# ----------------------------------------------------------------- the exercises


def test_04_1_zb_h1_holds_p_everywhere_when_i_frees_nothing():
    heavy = _walk_peaks("zb-h1", {"F": 1.0, "I": 0.0, "W": -1.0})  # I: +1 - 1
    light = _walk_peaks("zb-h1", {"F": 1.0, "I": -0.7, "W": -0.3})  # mem_weight 0.3
    one_f_one_b = _walk_peaks("1f1b", {"F": 1.0, "B": -1.0})
    assert heavy != light and heavy != one_f_one_b

    right, why = _judged("04.1", heavy)
    assert right is True and "held from its F to its W" in why
    assert _judged("04.1", tuple(heavy))[0] is True
    right, why = _judged("04.1", light)
    assert right is False and "mem_weight = 0.3" in why and "until its W" in why
    right, why = _judged("04.1", one_f_one_b)
    assert right is False and "1F1B's peaks" in why
    right, why = _judged("04.1", heavy[:2])
    assert right is False and "one peak per rank" in why
    assert _judged("04.1", max(heavy))[0] is False


def _builds(limit: float) -> bool:
    try:
        build_schedule("zb-auto", pp=P, microbatches=M, costs=SWEEP, memory_limit=limit)
    except ValueError:
        return False
    return True


def test_04_2_zb_auto_needs_room_for_one_forward():
    least = SWEEP.mem_activation  # one forward's activations: below it no F can run
    assert _builds(least) and not _builds(least * 0.999)

    right, why = _judged("04.2", least)
    assert right is True and "bubble" in why
    right, why = _judged("04.2", least + SWEEP.mem_weight)  # F + W's leftovers: plausible
    assert _builds(least + SWEEP.mem_weight)
    assert right is False and "builds, but so does a smaller limit" in why
    assert "what one microbatch holds at once" in why  # the idea, not only the direction
    right, why = _judged("04.2", least / 2)
    assert right is False and "builds nothing" in why and "at least" in why
    right, why = _judged("04.2", 0)
    assert right is False and "> 0" in why
    assert _judged("04.2", "1")[0] is False


def test_04_3_interleaved_run_peak_is_in_rank_microbatches():
    schedule = build_schedule("interleaved-1f1b", pp=P, microbatches=M)
    assert {a.kind for r in range(P) for a in schedule.actions(r)} == {"F", "B"}
    v = schedule.stages_per_rank  # each chunk half a rank's share
    peak = _walk_peaks("interleaved-1f1b", {"F": 1 / v, "B": -1 / v})[0]
    assert v == 2 and peak > P  # more than 1F1B's rank 0

    right, why = _judged("04.3", peak)
    assert right is True and "they match" in why
    right, why = _judged("04.3", peak * v)  # each chunk counted as a whole rank's share
    assert right is False and "half" in why
    right, why = _judged("04.3", float(P))
    assert right is False and "1F1B" in why and "both" in why
    assert _judged("04.3", [peak])[0] is False


def test_04_4_the_big_sweep_stops_falling_where_the_simulator_says():
    pp, m = 8, 32
    rates = {}
    for limit in range(pp, 2 * pp + 1):
        schedule = build_schedule("zb-auto", pp=pp, microbatches=m, costs=SWEEP, memory_limit=limit)
        rates[limit] = simulate(schedule, SWEEP).bubble_rate
    stops = next(x for x in rates if all(abs(rates[y] - rates[x]) < 1e-9 for y in rates if y > x))
    assert pp < stops < 2 * pp, "the exercise asks where it stops: inside the sweep"

    right, why = _judged("04.4", stops)
    assert right is True and f"{rates[stops]:.2%}" in why and f"{rates[pp]:.2%}" in why
    assert _judged("04.4", float(stops))[0] is True
    right, why = _judged("04.4", 2 * pp)
    assert right is False and "stopped falling before" in why and "bubble left" in why
    right, why = _judged("04.4", stops - 1)
    assert right is False and "still falls" in why and "one more forward" in why
    right, why = _judged("04.4", 3 * pp)
    assert right is False and "outside" in why


# ----------------------------------------------------------------- the notebook


@pytest.fixture(scope="module")
def cells() -> list[dict]:
    return read_cells(NOTEBOOK)


def test_the_old_per_chunk_rule_is_gone(cells):
    for old in ("per_chunk(", "mem_activation=0.5", "halved", "per chunk (half a stage)"):
        holding = [i for i, c in enumerate(cells) if old in cell_source(c)]
        assert not holding, f"cells {holding} still hold {old!r}"
    # one Costs for every schedule: no cell builds a second, halved one for the V family
    assert "Costs.share(v)" in cell_source(cells[0]) and "rank-microbatches" in cell_source(
        cells[0]
    )


def test_the_sweep_is_drawn_at_the_simulated_peaks(cells):
    i = cell_index(cells, "limits = [4, 4.5, 5, 6, 7, 8]")
    namespace: dict[str, Any] = {}
    exec("from zbkit.schedules import Costs, build_schedule, simulate", namespace)
    exec("import matplotlib.pyplot as plt", namespace)
    namespace.update(p=P, m=M)
    exec(compile(cell_source(cells[i]), "04_memory sweep", "exec"), namespace)
    ax = namespace["ax"]
    lines = {line.get_gid(): line for line in ax.get_lines()}
    for limit, x_at in zip(namespace["limits"], lines["zb-auto"].get_xdata(), strict=True):
        schedule = build_schedule("zb-auto", pp=P, microbatches=M, costs=SWEEP, memory_limit=limit)
        assert x_at == pytest.approx(max(simulate(schedule, SWEEP).peak_memory)), limit
    for name in ("1f1b", "zb-h1", "zb-h2"):
        sim = simulate(build_schedule(name, pp=P, microbatches=M), SWEEP)
        assert lines[name].get_xdata()[0] == pytest.approx(max(sim.peak_memory)), name
    assert "peak" in ax.get_xlabel() and "rank-microbatches" in ax.get_xlabel()
    namespace["plt"].close("all")


def _sweep_table(cells: list[dict]) -> tuple[dict[str, tuple[str, list[float]]], str]:
    """name -> (bubble as printed, peaks) of the sweep's table, and the text after it."""
    i = cell_index(cells, "{'zb-auto, limit ' + str(limit):<18}")
    rows = {}
    for line in cell_stdout(cells[i]).splitlines()[1:]:
        name, bubble, peaks = re.match(r"(.+?)\s+([\d.]+%)\s+\[(.*)\]", line).groups()
        rows[name] = (bubble, [float(x) for x in peaks.split(",")])
    return rows, " ".join(cell_source(cells[i + 1]).split())


def test_the_sweep_text_tells_its_table(cells):
    rows, text = _sweep_table(cells)
    for limit in (4, 4.5, 5, 6, 7, 8):
        schedule = build_schedule("zb-auto", pp=P, microbatches=M, costs=SWEEP, memory_limit=limit)
        sim = simulate(schedule, SWEEP)
        bubble, peaks = rows[f"zb-auto, limit {limit}"]
        assert bubble == f"{sim.bubble_rate:.2%}"
        assert peaks == [round(v, 2) for v in sim.peak_memory]
    h1, h2 = rows["zb-h1"], rows["zb-h2"]
    assert rows["zb-auto, limit 4"][0] == h1[0] and f"ties ZB-H1, {h1[0]}" in text
    assert f"needs {max(h2[1]):g} for {h2[0]}" in text
    five = rows["zb-auto, limit 5"]
    assert max(five[1]) == 5 and float(five[0][:-1]) < float(h2[0][:-1])
    assert "At a peak of 5 it beats ZB-H2" in text
    flat = [rows[f"zb-auto, limit {x}"] for x in (5, 6, 7, 8)]
    assert len({b for b, _ in flat}) == 1 and f"stays at {flat[0][0]}" in text
    later = [max(peaks) for _, peaks in flat[1:]]
    assert f"({later[0]}, {later[1]}, then {later[2]} under 8)" in text


def test_the_frontier_and_v_family_bullets_tell_their_tables(cells):
    i = cell_index(cells, "frontier = viz.plot_frontier(p, m, costs)")
    listing = {}
    for line in cell_stdout(cells[i + 1]).splitlines()[1:]:
        label, memory, bubble = re.match(
            r"(.+?)\s+(?:limit \S+\s+)?memory ([\d.]+)\s+bubble\s+([\d.]+)%", line
        ).groups()
        listing.setdefault(label, []).append((float(memory), float(bubble)))
    bullets = " ".join(cell_source(cells[i + 2]).split())  # the text, its line breaks as spaces
    (dual,) = listing["dualpipev"]
    assert f"DualPipeV ({dual[0]:g}, {dual[1]:.1f}%)" in bullets
    zero = min(mem for mem, bubble in listing["zb-auto (v)"] if bubble == 0)
    assert f"zero bubble at {zero:g}" in bullets
    ((vmin, _),), ((one_f_one_b, _),) = listing["v-min"], listing["1f1b"]
    assert vmin == one_f_one_b / 2 and f"({vmin:g}, half of 1F1B's {one_f_one_b:g})" in bullets

    j = cell_index(cells, 'rows.append(("dualpipev", hides))')
    peaks = {}
    for line in cell_stdout(cells[j]).splitlines()[1:]:
        name, overlap, *_ = line.split()
        peaks[name, float(overlap)] = max(float(x) for x in re.findall(r"[\d.]+(?=[,\]])", line))
    text = " ".join(cell_source(cells[j + 1]).split())
    assert f"({peaks['dualpipev', 0.0]:g} against {peaks['zb-v', 0.0]:g}:" in text
    assert peaks["dualpipev", 0.0] - peaks["zb-v", 0.0] == 0.5  # "half a rank-microbatch more"
    assert "half a rank-microbatch more" in text


def test_the_real_run_matches_the_simulation_everywhere(cells):
    i = cell_index(cells, "pipe.trace.peak_for(Costs(mem_activation=1.0, mem_weight=0.3))\n    sim")
    rows = [line for line in cell_stdout(cells[i]).splitlines() if " run " in line]
    assert len(rows) == 5 and all(row.endswith("match") for row in rows)
    zbv = next(row for row in rows if row.startswith("zb-v"))
    assert "run [4.0, 4.0, 4.0, 4.0]" in zbv  # one rank's share, split over its two chunks


def test_the_gap_table_is_zb_auto_against_the_proven_optimum(cells):
    # oracle: explain_auto for zb-auto, lower_bound for the bound, solve for the optimum
    from zbkit.schedules import solve

    i = cell_index(cells, "optimal: it reaches the bound")
    rows = [r for r in cell_stdout(cells[i]).splitlines()[1:] if r.strip()]
    assert [float(r.split()[0]) for r in rows] == [3, 4, 4.5, 5, 6, 7, 8]
    for row in rows:
        limit, bound, auto, best, *said = row.split()
        limit_ = float(limit)
        found = explain_auto(pp=P, microbatches=M, costs=SWEEP, memory_limit=limit_)
        assert float(bound) == pytest.approx(
            lower_bound(pp=P, microbatches=M, costs=SWEEP, memory_limit=limit_)
        )
        assert float(auto) == pytest.approx(found.span)
        proven = solve(pp=P, microbatches=M, costs=SWEEP, memory_limit=limit_)
        assert proven.optimal and float(best) == pytest.approx(proven.value), row
        reaches = found.span <= float(bound) + 1e-9
        verdict = " ".join(said)
        if reaches:
            assert verdict == "optimal: it reaches the bound", row
        elif found.span <= proven.value + 1e-9:
            assert verdict == "optimal: solve proves it", row
        else:
            assert verdict.endswith("above the optimum"), row
    # the text: the rows where the bound is loose, with their numbers
    text = " ".join(cell_source(cells[i + 1]).split())
    loose = [r.split() for r in rows if r.split()[4:] == ["optimal:", "solve", "proves", "it"]]
    assert len(loose) == 1 and loose[0][0] == "3", rows
    _, bound, auto, best, *_ = loose[0]
    assert f"Under 3 the bound, {bound}, is loose" in text
    assert f"zb-auto's {auto} is still the optimum" in text and auto == best
    first_reach = min(float(r.split()[0]) for r in rows if "reaches" in r)
    assert f"From {first_reach:g} on it reaches the bound" in text
