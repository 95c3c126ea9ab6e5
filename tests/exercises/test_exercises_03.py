"""The exercises of notebook 03: each checker against an answer worked out here.

The oracles: the papers' closed forms, computed here in exact fractions (03.4, 03.5) or floats
(03.3, on the notebook's own paper-times row), and the simulator read directly (03.1, 03.2).
(What every exercise shares, its check cell and folded solution, is tested in
test_exercises_all.py.)
"""

from __future__ import annotations

from fractions import Fraction
from itertools import count
from typing import Any

from notebook_cells import cell_by_id, cell_source, cell_stdout, read_cells

from zbkit.exercises import check
from zbkit.schedules import Costs, build_schedule, simulate
from zbkit.schedules.paper import TABLE6

NOTEBOOK = "03_schedules_and_bubbles"
KEYS = [f"03.{k}" for k in range(1, 6)]
UNIT = Costs(F=1, I=1, W=1)


def _judged(key: str, answer: Any) -> tuple[bool | None, str]:
    verdict = check(key, answer)
    return verdict.right, verdict.why


def _rate(name: str, m: int, costs: Costs = UNIT, pp: int = 4) -> float:
    return simulate(build_schedule(name, pp=pp, microbatches=m), costs).bubble_rate


def test_03_1_zb_h2_has_no_bubble_from_2p_minus_1():
    pp = 4
    m = next(m for m in count(1) if _rate("zb-h2", m) == 0)
    assert m == 2 * pp - 1  # the closed form's condition for F = I = W
    # the idea the feedback gives: rank 0 waits for microbatch 0's I, whose forward went down
    # p stages and whose I came back up p-1; only forwards (one unit each) can fill the wait
    wait = pp * UNIT.F + (pp - 1) * UNIT.I
    assert wait / UNIT.F == m
    right, why = _judged("03.1", m)
    assert right is True and f"m = {m} = 2p-1" in why and f"waits {wait:g} time units" in why
    right, why = _judged("03.1", m + 2)
    assert right is False and "fewer microbatches" in why and str(m) not in why
    right, why = _judged("03.1", m - 2)
    assert right is False and f"{_rate('zb-h2', m - 2):.1%}" in why
    assert "runs out of forwards" in why and "no W is ready" in why
    right, why = _judged("03.1", float(m))
    assert right is False and "whole number" in why


def test_03_2_comm_hurts_zb_v_most():
    names = ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2", "zb-v")
    slow = Costs(F=1, I=1, W=1, comm=0.2)
    rise = {n: _rate(n, 8, slow) - _rate(n, 8) for n in names}
    worst = max(rise, key=rise.__getitem__)
    right, why = _judged("03.2", worst.upper())
    assert right is True and f"+{100 * rise[worst]:.1f} points" in why
    assert "6 hops a microbatch each way against interleaved 1F1B's 7" in why
    other = min(rise, key=rise.__getitem__)
    right, why = _judged("03.2", other)
    assert right is False and f"rises {100 * rise[other]:.1f} points" in why
    assert "how many hops" in why and "idle time" in why  # the idea, not a direction
    right, why = _judged("03.2", "pipedream")
    assert right is False and "not one of the seven" in why


def _paper_row() -> tuple[int, int, tuple[float, float, float, float]]:
    """(p, m, (F, I, W, comm)) of the paper-times table's first row: the paper's Table 6
    as quoted in zbkit.schedules.paper, which the notebook's cell reads."""
    cell = cell_by_id(read_cells(NOTEBOOK), "b8d18663")
    printed = cell_stdout(cell).splitlines()
    assert "TABLE6" in cell_source(cell) and printed[1].split()[:2] == ["1.5B", "24"]
    pp, _, _, runs = TABLE6["1.5B"]
    return pp, 24, runs[24]


def test_03_3_the_closed_form_leaves_communication_out():
    pp, m, (f, i, w, comm) = _paper_row()
    idle = (pp - 1) * (f + i - w)
    form = idle / (idle + m * (f + i + w))
    right, why = _judged("03.3", round(form, 4))  # as the learner reads it off a print
    assert right is True and f"{form:.4f}" in why and "communication" in why
    simulated = _rate("zb-h1", m, Costs(f, i, w, comm=comm), pp=pp)
    assert simulated > form + 0.005  # the two differ: the exercise has a point
    right, why = _judged("03.3", simulated)
    assert right is False and "the simulator's" in why
    right, why = _judged("03.3", 100 * form)
    assert right is False and "percent" in why
    right, why = _judged("03.3", "0.15")
    assert right is False and "as a number" in why


def test_03_4_four_chunks_per_rank_beat_zb_h1():
    pp, m = 4, 8
    f, i, w = Fraction(1), Fraction(1), Fraction(1)
    zb_h1 = m * (f + i + w) + (pp - 1) * (f + i - w)  # makespans: work + the busiest idle

    def interleaved(v: int) -> Fraction:
        return m * (f + i + w) + (pp - 1) * (f + i + w) / v

    v = next(v for v in count(1) if interleaved(v) < zb_h1)
    assert interleaved(v - 1) == zb_h1  # one fewer chunk ties: the checker must say so
    right, why = _judged("03.4", v)
    assert right is True and f"makespan {float(interleaved(v)):g}" in why
    idle_h1 = (pp - 1) * (f + i - w)
    right, why = _judged("03.4", v - 1)
    assert right is False and "ties" in why and f"= {float(idle_h1):g}" in why
    right, why = _judged("03.4", v - 2)
    slower = (pp - 1) * (f + i + w) / (v - 2)  # its idle, above ZB-H1's: the reason
    assert right is False and f"{float(slower):g} against ZB-H1's (p-1)(F+I-W)" in why
    assert "go up" not in why
    right, why = _judged("03.4", v + 2)
    assert right is False and "a smaller v does too" in why and "idle time" in why


def test_03_5_enough_microbatches_for_a_small_1f1b_bubble():
    pp = 4
    m = next(m for m in count(1) if Fraction(pp - 1, m + pp - 1) < Fraction(1, 10))
    rough = next(m for m in count(1) if Fraction(pp - 1, m) < Fraction(1, 10))
    right, why = _judged("03.5", m)
    assert right is True and f"{pp - 1}/{m + pp - 1}" in why
    right, why = _judged("03.5", rough)
    assert right is False and "approximation" in why
    right, why = _judged("03.5", m - 1)
    assert right is False and "10.00%" in why and "go up" not in why
    assert f"m(F+I+W) = {3 * (m - 1)}" in why and "nine times" in why  # 1/10 <=> work > 9 idle
    right, why = _judged("03.5", m + 5)
    assert right is False and "a smaller m" in why
    right, why = _judged("03.5", True)
    assert right is False and "whole number" in why
