"""The exact optimum (`solve`) against exhaustive enumeration, the simulator and zb-auto.

Oracle: every program of tiny settings enumerated (each rank's actions in every order that
keeps F before I before W of a microbatch, microbatches in any order), validated, simulated,
the ones within the memory limit kept: the best simulated span is the optimum. And for
larger small settings, the simulator (the solver's order simulates to its value) and zb-auto
(never better than a proven optimum; the issue's two cases where it is worse).
"""

from __future__ import annotations

import itertools
import sys

import pytest

from zbkit.schedules import Costs, Schedule, ScheduleError, build_schedule, lower_bound, simulate
from zbkit.schedules import solve as solve_exact
from zbkit.schedules.core.action import Action

pytest.importorskip("ortools")

TINY = [
    (2, 1, Costs(1, 1, 1), None),
    (2, 2, Costs(1, 1.5, 0.5, comm=0.2), None),
    (2, 2, Costs(2, 1, 0.5, comm=0.1, mem_weight=0.5), 1.5),
    (3, 2, Costs(1, 2, 1), 2.0),
    (3, 2, Costs(1, 1, 0.25, comm=0.3), None),
]


def _orders(stage: int, m: int):
    """Every order of one stage's 3m actions keeping F < I < W per microbatch."""
    slots = [(k, j) for j in range(m) for k in "FIW"]
    for perm in itertools.permutations(range(len(slots))):
        seen: dict[int, str] = {}
        ok = True
        for i in perm:
            k, j = slots[i]
            if "FIW".index(k) != len(seen.get(j, "")):
                ok = False
                break
            seen[j] = seen.get(j, "") + k
        if ok:
            yield [Action(stage, k, j) for k, j in (slots[i] for i in perm)]


def _enumerated_best(p: int, m: int, costs: Costs, limit: float) -> float:
    rows = [list(_orders(s, m)) for s in range(p)]
    best = float("inf")
    for program in itertools.product(*rows):
        sch = Schedule(dict(enumerate(program)), list(range(p)), m)
        try:
            sim = simulate(sch, costs)
        except ScheduleError:  # a deadlock
            continue
        if max(sim.peak_memory) <= limit + 1e-9:
            best = min(best, max(sim.span))
    return best


@pytest.mark.parametrize("p,m,costs,limit", TINY)
def test_solve_is_the_enumerated_optimum(p, m, costs, limit) -> None:
    found = solve_exact(pp=p, microbatches=m, costs=costs, memory_limit=limit)
    best = _enumerated_best(p, m, costs, p * costs.mem_activation if limit is None else limit)
    assert found.optimal and found.value == pytest.approx(best, abs=1e-9)
    assert found.lower_bound == pytest.approx(best, abs=1e-6)


@pytest.mark.parametrize(
    "costs,expected",
    [  # issue 24's two cases: zb-auto 31.4 and 42.85 at p=4, m=8, limit 4
        (Costs(1, 1.5, 0.5, comm=0.2), 31.2),
        (Costs(1.85, 1.81, 0.93, comm=0.06), 42.75),
    ],
)
def test_the_issues_cases_are_proven_and_beat_zb_auto(costs, expected) -> None:
    found = solve_exact(pp=4, microbatches=8, costs=costs, memory_limit=4, time_limit=120)
    assert found.optimal and found.value == pytest.approx(expected, abs=1e-9)
    sim = simulate(found.schedule, costs)  # the order simulates to the solver's value
    assert max(sim.span) == pytest.approx(found.value) and max(sim.peak_memory) <= 4 + 1e-9
    # the heuristics miss it (issue 24, point 3); zb-auto's exact candidate does not
    from zbkit.schedules import explain_auto

    auto = explain_auto(pp=4, microbatches=8, costs=costs, memory_limit=4)
    heuristics = [t.span for t in auto.tried if t.span and "exact" not in t.candidate.name]
    assert min(heuristics) > found.value + 0.05
    assert auto.chosen.name == "exact (CP-SAT)"
    assert max(simulate(auto.schedule, costs).span) == pytest.approx(found.value, abs=1e-9)
    assert lower_bound(pp=4, microbatches=8, costs=costs, memory_limit=4) <= found.value


GRID = {  # proven within seconds here (warm-started from zb-auto, the instant bound as a cut)
    "linear": [
        (2, 4, Costs(1, 1, 1), None),
        (3, 3, Costs(1, 1.5, 0.5, comm=0.2), None),
        (2, 3, Costs(1, 2, 1, mem_weight=0.4), 1.5),
        (4, 4, Costs(1, 1, 0.5, comm=0.1), 3.0),
    ],
    "v": [
        (2, 4, Costs(1, 1, 1), None),
        (2, 2, Costs(1, 2, 1, comm=0.2), 1.5),
        (3, 3, Costs(1, 1, 1), None),
    ],
}


@pytest.mark.parametrize("placement", sorted(GRID))
def test_zb_auto_is_never_better_than_a_proven_optimum(placement) -> None:
    for p, m, costs, limit in GRID[placement]:
        found = solve_exact(
            pp=p, microbatches=m, costs=costs, memory_limit=limit, placement=placement
        )
        assert found.optimal, (p, m, costs)
        sim = simulate(found.schedule, costs)
        assert max(sim.span) == pytest.approx(found.value)
        auto = build_schedule("zb-auto", pp=p, microbatches=m, costs=costs, memory_limit=limit,
                              placement=placement)  # fmt: skip
        assert max(simulate(auto, costs).span) >= found.value - 1e-9
        bound = lower_bound(
            pp=p, microbatches=m, costs=costs, memory_limit=limit, placement=placement
        )
        assert bound <= found.value + 1e-9


def test_makespan_objective_and_bad_input() -> None:
    found = solve_exact(pp=3, microbatches=3, costs=Costs(1, 1, 1), objective="makespan")
    assert found.optimal and simulate(found.schedule, Costs(1, 1, 1)).makespan == pytest.approx(
        found.value
    )
    assert "optimal (proven)" in str(found)
    with pytest.raises(ValueError, match="objective must be one of"):
        solve_exact(pp=2, microbatches=2, objective="speed")
    with pytest.raises(ValueError, match="memory_limit=0.5 is below what any order holds"):
        solve_exact(pp=2, microbatches=2, memory_limit=0.5)
    # each entry point names itself and what to change, before any work
    bad = [
        (dict(microbatches=0), "microbatches must be an int >= 1, got 0"),
        (dict(pp=2.5), "pp must be an int >= 1, got 2.5"),
        (dict(placement="w"), "placement must be 'linear' or 'v', got 'w'"),
        (dict(memory_limit="3"), "memory_limit must be a number, got '3'"),
        # the V's rank holds both chunks' activations of a microbatch at once: 2 x 0.5
        (dict(memory_limit=0.75, placement="v"), r"below what any order holds: .* \(1\)"),
    ]
    entries = {
        "lower_bound": lower_bound,
        "solve": solve_exact,
        "zb-opt": lambda **kw: build_schedule("zb-opt", **kw),
    }
    for changed, message in bad:
        for who, entry in entries.items():
            with pytest.raises(ValueError, match=f"^{who}: .*{message}"):
                entry(**{"pp": 2, "microbatches": 2, **changed})


def test_without_cp_sat_the_error_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ortools.sat.python.cp_model", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'zbkit\[exact\]'"):
        solve_exact(pp=2, microbatches=2)


def test_every_schedule_is_told_how_far_from_optimal_it_can_be(capsys) -> None:
    import argparse

    from zbkit.schedules.cli import add_arguments
    from zbkit.schedules.cli import main as cli_main
    from zbkit.schedules.optimum.exact import bound_for, gap_line

    costs = Costs(1, 1.5, 0.5, comm=0.2)
    found = solve_exact(pp=4, microbatches=8, costs=costs, memory_limit=4)
    h1 = build_schedule("zb-h1", pp=4, microbatches=8)
    bound = bound_for(h1, costs)  # certified: never above the proven optimum
    assert bound is not None and bound <= found.lower_bound + 1e-9
    span = max(simulate(h1, costs).span)
    assert (
        gap_line(span, bound) == f"<= {(span - bound) / span:.1%} above optimal (lower bound 30.4)"
    )
    # zb-auto's schedule there is the one its exact candidate proved: the CLI says so too,
    # where the instant bound alone (30.4) could not
    auto = build_schedule("zb-auto", pp=4, microbatches=8, costs=costs, memory_limit=4)
    assert bound_for(auto, costs) == pytest.approx(found.value)
    assert gap_line(max(simulate(auto, costs).span), bound_for(auto, costs)).startswith("optimal")
    # ZB-H1 at 1F1B's memory with equal costs reaches the bound: optimal, and said so
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert cli_main(parser.parse_args(["zb-h1", "--pp", "4", "-m", "8"])) == 0
    assert (
        "longest rank span 27: optimal (it reaches the lower bound 27)" in capsys.readouterr().out
    )
    # overlapped pairs save time the bounds do not count: no claim
    dual = build_schedule("dualpipev", pp=4, microbatches=8)
    assert bound_for(dual, Costs(1, 1, 1, overlap=0.5)) is None
    assert bound_for(dual, Costs(1, 1, 1)) <= max(simulate(dual, Costs(1, 1, 1)).span)


SMALL_COSTS = [
    Costs(1, 1, 1),
    Costs(1, 1.5, 0.5, comm=0.2),
    Costs(1.85, 1.81, 0.93, comm=0.06, mem_weight=0.4),
]


def _small_settings():
    """p 2-3, m 2-4, three cost sets, limits 0.75, 1 and 1.5 of 1F1B's peak (p); linear."""
    for p, m, costs, share in itertools.product((2, 3), (2, 3, 4), SMALL_COSTS, (0.75, 1, 1.5)):
        yield p, m, costs, share * p


def test_lower_bound_is_at_least_90_percent_of_the_proven_optimum_on_small_settings() -> None:
    worst = 1.0
    for p, m, costs, limit in _small_settings():
        found = solve_exact(pp=p, microbatches=m, costs=costs, memory_limit=limit)
        assert found.optimal, (p, m, costs, limit)
        bound = lower_bound(pp=p, microbatches=m, costs=costs, memory_limit=limit)
        assert bound <= found.value + 1e-9, (p, m, costs, limit)  # certified
        worst = min(worst, bound / found.value)
    assert worst >= 0.9, f"the instant bound falls to {worst:.1%} of the optimum"


def test_zb_auto_is_the_proven_optimum_where_it_solves_and_says_so(monkeypatch) -> None:
    # every small setting (at most 96 actions): zb-auto's span is the optimum; its table's
    # last line says so; without CP-SAT the exact row says what to install
    from zbkit.schedules import explain_auto

    for p, m, costs, limit in _small_settings():
        found = solve_exact(pp=p, microbatches=m, costs=costs, memory_limit=limit)
        auto = explain_auto(pp=p, microbatches=m, costs=costs, memory_limit=limit)
        assert max(simulate(auto.schedule, costs).span) == pytest.approx(found.value, abs=1e-9)
        assert auto.lower_bound == pytest.approx(found.value, abs=1e-6)
        assert "how far from optimal: optimal" in repr(auto), (p, m, costs, limit)
    monkeypatch.setitem(sys.modules, "ortools.sat.python.cp_model", None)  # not installed
    costs = Costs(1, 1.5, 0.5, comm=0.2)
    plain = explain_auto(pp=4, microbatches=8, costs=costs, memory_limit=4)  # the issue's 31.4
    row = next(t for t in plain.tried if t.candidate.name == "exact (CP-SAT)")
    assert row.note == "not run: needs CP-SAT (pip install 'zbkit[exact]')"


def test_zb_opt_is_the_solvers_schedule_by_name() -> None:
    costs = Costs(1, 1.5, 0.5, comm=0.2)
    found = solve_exact(pp=3, microbatches=4, costs=costs, memory_limit=2.25)
    named = build_schedule("zb-opt", pp=3, microbatches=4, costs=costs, memory_limit=2.25)
    assert named.name == "zb-opt" and max(simulate(named, costs).span) == pytest.approx(found.value)
    with pytest.raises(ValueError, match=r"zb-opt: 192 actions .* > 144.*use zb-auto"):
        build_schedule("zb-opt", pp=4, microbatches=16)
    with pytest.raises(ValueError, match="time_limit must be a number of seconds > 0"):
        build_schedule("zb-opt", pp=2, microbatches=2, time_limit=0)
    with pytest.raises(ValueError, match="placement must be 'linear' or 'v'"):
        build_schedule("zb-opt", pp=2, microbatches=2, placement="looped")


def test_the_warm_start_is_the_solvers_first_incumbent() -> None:
    # a cap of almost no work leaves the solver little more than its start: from the
    # construction's 24.9 (optimal here) it must not come back worse (the MILP on HiGHS did
    # while setting the objective after the start dropped it: 26.2)
    from zbkit.schedules.core.costs import per_stage
    from zbkit.schedules.optimum.exact import prove
    from zbkit.schedules.search.candidates import CANDIDATES, Problem

    costs = Costs(1, 1.5, 0.5, comm=0.2)
    per = per_stage(costs, [0, 1])
    construction = next(c for c in CANDIDATES["linear"] if c.name == "construction")
    start = Schedule(construction.built(Problem(2, 8, per, 3.0, "linear")).program, [0, 1], 8)
    assert max(simulate(start, costs).span) == pytest.approx(24.9)
    found = prove([0, 1], 8, per, 3.0, "linear", warm=start, work=1e-4)
    assert found.value <= 24.9 + 1e-9


def test_zb_opt_in_the_cli_and_the_explorer_is_the_proof_not_zb_autos_search(capsys) -> None:
    # the instant bound (27.5) is below the proven optimum (28.5) at p=4, m=8 under 3: only
    # the solver's own bound can say "optimal", and the CLI says it for zb-opt's schedule
    import argparse
    import re

    from zbkit.schedules.cli import add_arguments
    from zbkit.schedules.cli import main as cli_main
    from zbkit.widgets import ScheduleExplorer

    costs = Costs(1, 1, 0.5, mem_weight=0.3)
    assert lower_bound(pp=4, microbatches=8, costs=costs, memory_limit=3) == pytest.approx(27.5)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["zb-opt", "--pp", "4", "--microbatches", "8", "--costs", "1,1,0.5,0,1,0.3"]
    assert cli_main(parser.parse_args([*argv, "--memory-limit", "3"])) == 0
    out = capsys.readouterr().out
    assert "longest rank span 28.5: optimal (it reaches the lower bound 28.5)" in out
    assert "kept:" not in out  # no candidates: a proof
    named = build_schedule("zb-opt", pp=4, microbatches=8, costs=costs, memory_limit=3)
    explorer = ScheduleExplorer("zb-opt", pp=4, microbatches=8, costs=costs, memory_limit=3)
    assert explorer.error is None and explorer.simulation.schedule.name == "zb-opt"
    # one of the optimal orders (a proof's schedule may differ between equal-valued ones)
    assert max(explorer.simulation.span) == pytest.approx(max(simulate(named, costs).span))
    text = re.sub("<[^>]+>", " ", explorer.numbers.value)
    assert "kept" not in text and "optimal (it reaches the lower bound 28.5)" in text


def test_a_solve_from_nothing_finds_the_same_optimum() -> None:
    costs = Costs(1, 1.5, 0.5, comm=0.2)
    warm = solve_exact(pp=3, microbatches=4, costs=costs, memory_limit=2.25)
    cold = solve_exact(pp=3, microbatches=4, costs=costs, memory_limit=2.25, warm_start=False)
    assert warm.optimal and cold.optimal and cold.value == pytest.approx(warm.value)


def test_lower_bound_on_the_v_is_certified_and_at_least_90_percent() -> None:
    # the memory chains (`bounds.chains`) see that a V rank holds two chunks' activations:
    # under 0.75 p the closed forms alone fell to 78% of the optimum (p=3, m=4, W cheap)
    worst = 1.0
    for (p, m), costs, share in itertools.product(((2, 2), (2, 3), (2, 4), (3, 2), (3, 4)),
                                                  SMALL_COSTS, (0.75, 1, 1.5)):  # fmt: skip
        found = solve_exact(pp=p, microbatches=m, costs=costs, memory_limit=share * p,
                            placement="v")  # fmt: skip
        assert found.optimal
        bound = lower_bound(pp=p, microbatches=m, costs=costs, memory_limit=share * p,
                            placement="v")  # fmt: skip
        assert bound <= found.value + 1e-9, (p, m, costs, share)
        worst = min(worst, bound / found.value)
    assert worst >= 0.9, f"the V's instant bound falls to {worst:.1%} of the optimum"


def test_probing_both_orders_of_two_forwards_lifts_the_v_bound_to_the_optimum(monkeypatch) -> None:
    # the V at p=2, m=8, W cheap, under 0.75 p: rank 0 picks which chunk's forward runs
    # first, and either order delays rank 1; the walk alone sees 26.35 (89.8% of the proven
    # 29.35), probing both orders of each pair finds the optimum itself
    from zbkit.schedules.optimum import walk

    costs, limit = Costs(1, 1.5, 0.5, comm=0.2), 1.5
    found = solve_exact(pp=2, microbatches=8, costs=costs, memory_limit=limit, placement="v")
    assert found.optimal and found.value == pytest.approx(29.35)
    probed = lower_bound(pp=2, microbatches=8, costs=costs, memory_limit=limit, placement="v")
    monkeypatch.setattr(walk, "PROBE_MAX_ACTIONS", 0)
    walk._chains.cache_clear()
    walked = lower_bound(pp=2, microbatches=8, costs=costs, memory_limit=limit, placement="v")
    walk._chains.cache_clear()
    assert walked == pytest.approx(26.35) and walked < 0.9 * found.value
    assert probed == pytest.approx(found.value)


def test_lower_bound_never_passes_a_proven_optimum() -> None:
    # oracle: the solver's proof, on random settings: per-stage costs (one stage slower),
    # comm, mem_weight, limits from tight to roomy, both placements
    import random

    from random_costs import random_setting

    rng = random.Random(24)
    for trial in range(16):
        placement, p, m, per = random_setting(rng, (2, 3), (2, 5), uneven=trial % 2 == 0)
        per = [Costs(*(round(getattr(c, f), 2) for f in Costs.__slots__)) for c in per]
        n = len(per)
        held = 2 if placement == "v" else 1  # a rank's activations of one microbatch
        limit = rng.uniform(held + 0.2 * m, 1.5 * n)
        try:
            found = solve_exact(pp=p, microbatches=m, costs=per, memory_limit=limit,
                                placement=placement)  # fmt: skip
        except ValueError:  # nothing fits
            continue
        assert found.optimal, (trial, placement, p, m, limit)
        bound = lower_bound(pp=p, microbatches=m, costs=per, memory_limit=limit,
                            placement=placement)  # fmt: skip
        assert bound <= found.value + 1e-6, (trial, placement, p, m, per, limit)
