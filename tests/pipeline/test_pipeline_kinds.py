"""A new action kind is one entry in `KINDS`: every walker asks the table.

The kind added here, "X" (a fused full backward), reuses an existing executor method, so
the only other change is its line in the executors' `RUNS` table: the engine, validator,
plan, simulator, measurement, executors and drawings take it from the tables. The oracle
is the same schedule written with "B".
"""

from __future__ import annotations

import dataclasses

import pytest
from pipeline_models import assert_grads_match, batch, loss_fn, make_stages, oracle

from zbkit import viz
from zbkit.pipeline import LocalPipeline, StageError
from zbkit.pipeline._execute import RUNS
from zbkit.schedules import (
    KINDS,
    Action,
    Costs,
    Kind,
    Overlap,
    Schedule,
    ScheduleError,
    build_schedule,
    derive_plan,
    simulate,
    validate,
)
from zbkit.schedules.measure import measured_costs

# B's row under another letter and name: what it needs, makes and holds are B's
FUSED = dataclasses.replace(KINDS["B"], letter="X", name="fused backward")


def _renamed(schedule: Schedule, old: str, new: str) -> Schedule:
    program = [
        [Action(a.stage, new if a.kind == old else a.kind, a.microbatch) for a in row]
        for _, row in sorted(schedule.program.items())
    ]
    return Schedule.from_program(program, schedule.stage_to_rank, schedule.microbatches)


@pytest.fixture
def fused_kind(monkeypatch: pytest.MonkeyPatch) -> Kind:
    monkeypatch.setitem(KINDS, "X", FUSED)
    monkeypatch.setitem(RUNS, "X", RUNS["B"])  # an executor method that exists
    return FUSED


def test_a_kind_the_executors_cannot_run_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(KINDS, "X", FUSED)  # in KINDS, but no line in RUNS
    fused = _renamed(build_schedule("1f1b", pp=2, microbatches=2), "B", "X")
    pipe = LocalPipeline(make_stages(2), fused, loss_fn)
    with pytest.raises(StageError, match=r"1X0: kind 'X' \(fused backward\) is in KINDS but "
                       r"has no entry in RUNS .* runs only F, I, W, B"):  # fmt: skip
        pipe.step(*batch(4))


@pytest.mark.parametrize("name", ["1f1b", "interleaved-1f1b"])
def test_a_kind_added_to_the_table_runs_everywhere(fused_kind: Kind, name: str) -> None:
    base = build_schedule(name, pp=2, microbatches=4)
    fused = _renamed(base, "B", "X")
    validate(fused)
    costs = [Costs(F=1, I=2, W=0.5, comm=0.1, mem_weight=0.3)] * base.num_stages
    got, want = simulate(fused, costs), simulate(base, costs)
    assert [e[4:] for e in got.events] == [e[4:] for e in want.events]
    assert got.memory == want.memory and got.bubble_rate == want.bubble_rate
    for rank in range(base.pp):  # the same transfers around the same positions
        plans = derive_plan(fused, rank), derive_plan(base, rank)
        assert [str(c) for c in plans[0].comms] == [str(c) for c in plans[1].comms]
        assert [str(s).replace("X", "B") for s in plans[0]] == [str(s) for s in plans[1]]
    assert measured_costs(got.events, base.num_stages, comm=0.1) == measured_costs(
        want.events, base.num_stages, comm=0.1
    )
    # a real step: the executors run it through the table's method, gradients as autograd's
    mods = make_stages(base.num_stages)
    x, y = batch(8)
    _, expected = oracle(mods, x, y)
    pipe = LocalPipeline(mods, fused, loss_fn)
    pipe.step(x, y)
    assert_grads_match(mods, expected, f"{name} with X for B")
    assert sorted({e.kind for e in pipe.trace.events}) == ["F", "X"]
    assert pipe.trace.peak_memory == simulate(fused).peak_memory
    fig = viz.plot_schedule(got)  # drawn with the table's name in the legend
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "X: fused backward" in labels


def test_the_validator_knows_the_new_kind_does_i_and_w(fused_kind: Kind) -> None:
    program = [["0F0", "0I0", "0X0"], ["1F0", "1X0"]]
    with pytest.raises(ScheduleError, match=r"0X0 .* computes the input grad a second time"):
        validate(Schedule.from_program(program, [0, 1], 1))
    program = [["0F0", "0X0", "0W0"], ["1F0", "1X0"]]
    with pytest.raises(ScheduleError, match=r"0W0 .* computes the weight grad a second time"):
        validate(Schedule.from_program(program, [0, 1], 1))


@pytest.mark.parametrize("name", ["1f1b", "interleaved-1f1b"])
def test_a_new_kind_goes_through_torchs_comms_form_and_runs(fused_kind: Kind, name: str) -> None:
    """torch's lowered form asks the table too: SEND_B follows whatever makes the input
    gradient, REDUCE_GRAD whatever does W; the loaded file then runs as written."""
    base = build_schedule(name, pp=2, microbatches=4)
    fused = _renamed(base, "B", "X")
    text = fused.to_csv(comms=True)
    assert text == base.to_csv(comms=True).replace("B", "X").replace("SEND_X", "SEND_B").replace(
        "RECV_X", "RECV_B"
    )  # the same transfers around the same actions
    loaded = Schedule.from_csv(text, stage_to_rank=fused.stage_to_rank)
    validate(loaded)
    assert loaded.to_csv(comms=True) == text and loaded.program == fused.program
    mods = make_stages(base.num_stages)
    x, y = batch(8)
    _, expected = oracle(mods, x, y)
    pipe = LocalPipeline(mods, loaded, loss_fn)
    pipe.step(x, y)
    assert_grads_match(mods, expected, f"{name} with X for B, loaded from torch's form")
    assert sorted({e.kind for e in pipe.trace.events}) == ["F", "X"]


def test_reduce_grad_waits_for_the_new_kind_that_does_w(fused_kind: Kind) -> None:
    program = [["0F0", "1F0", "1X0", "0X0"]]
    ok = Schedule.from_program(program, [0, 0], 1)
    validate(Schedule.from_csv("0F0,1F0,1X0,0X0,0REDUCE_GRAD,1REDUCE_GRAD", stage_to_rank=[0, 0]))
    early = "0F0,1F0,1X0,0REDUCE_GRAD,0X0,1REDUCE_GRAD"
    with pytest.raises(ScheduleError, match="0REDUCE_GRAD comes before the last weight gradient"):
        validate(Schedule.from_csv(early, stage_to_rank=[0, 0]))
    assert ok.program[0][-1].info.does_weight


def test_an_overlapped_pair_may_carry_the_new_kind(fused_kind: Kind) -> None:
    pair = Overlap(Action(0, "F", 1), Action(1, "X", 0))
    assert str(pair) == "0F1+1X0"
    with pytest.raises(ValueError, match="a forward then a backward"):
        Overlap(Action(0, "X", 1), Action(1, "F", 0))
