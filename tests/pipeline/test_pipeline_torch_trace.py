"""trace_torch on torch's own pipelines: 2 and 4 gloo ranks running torch's Schedule1F1B and
ScheduleZBVZeroBubble on torch's PipelineStage (issue 14).

One launch per rank count checks every case inside (process start-up dominates). What the
ranks ran is compared exactly (every action once, in the program's order); the bubble rate
with a generous tolerance (the ranks share 2 cores with other work)."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import cloudpickle
import pytest
import torch_ranks

from zbkit.launch import launch
from zbkit.pipeline import Trace, schedule_of_trace, trace_torch
from zbkit.schedules import Schedule, build_schedule, simulate, validate
from zbkit.schedules.measure import hop_latency, measured_costs

cloudpickle.register_pickle_by_value(torch_ranks)
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ts = pytest.importorskip("torch.distributed.pipelining.schedules")

# The trace's bubble next to its simulation's is printed, not asserted: no bound holds on a
# shared machine (a busy one gave 0.41 against 0.004 where a quiet one gives 0.03-0.28), and
# tests make no timing assertions. benchmarks/pipeline_vs_sim.py measures that gap.
CASES = [("Schedule1F1B", 4), ("Schedule1F1B", 8), ("ScheduleZBVZeroBubble", 8)]


def expected_program(cls: str, p: int, m: int) -> Schedule:
    """What torch's runtime runs on each rank. ZBV: its pipeline_order. 1F1B: the loop in
    Schedule1F1B._step_microbatches, which is zbkit's 1f1b (torch's drawn pipeline_order
    numbers the last rank's forwards 1..m; the runtime runs 0..m-1)."""
    if cls == "Schedule1F1B":
        return build_schedule("1f1b", pp=p, microbatches=m)
    return Schedule.from_torch(getattr(ts, cls), pp=p, microbatches=m)


def check_run(out: list[list[dict]], p: int) -> tuple[list[str], list[tuple[Trace, Any]]]:
    """What the ranks ran, checked; returns the lines to print and each case's (least
    disturbed trace, its simulation) for `_draw`."""
    lines, runs = [], []
    for i, (cls, m) in enumerate(CASES):
        per_rank = [out[r][i] for r in range(p)]
        want = expected_program(cls, p, m)
        # every action once, in the program's order, on the rank that owns its stage
        for r, row in enumerate(per_rank):
            for events, samples in zip(row["orders"], row["samples"], strict=True):
                got = [f"{e.stage}{e.kind}{e.microbatch}" for e in events]
                assert got == [str(a) for a in want.actions(r)], (cls, m, r)
                assert all(e.rank == r for e in events)
                assert samples == len(got)  # one memory sample per action
            assert row["restored"], row["case"]  # torch's methods back, also after an error
            assert row["grads_equal"], row["case"]  # tracing changes nothing torch computes
        traces: list[Trace] = per_rank[0]["traces"]
        assert all(r["traces"] == traces for r in per_rank)  # one merged trace per step
        for trace in traces:
            assert len(trace.events) == len(want)
            assert {(e.stage, e.kind, e.microbatch) for e in trace.events} == {
                (a.stage, a.kind, a.microbatch) for r in range(p) for a in want.actions(r)
            }
        # the step least disturbed by other work on the machine: the shortest
        trace = min(traces, key=lambda t: t.makespan)
        ran = schedule_of_trace(trace, want.stage_to_rank, name=cls)
        assert ran.program == want.program
        validate(ran)
        if cls == "Schedule1F1B":  # torch's drawing: the last rank off by one, as from_torch says
            drawn = Schedule.from_torch(getattr(ts, cls), pp=p, microbatches=m)
            for r in range(p - 1):
                assert drawn.program[r] == ran.program[r]
            assert [a.microbatch for a in drawn.actions(p - 1) if a.kind == "F"] == list(
                range(1, m + 1)
            )
        # one clock: the merged trace starts at 0 and nothing starts before its input exists
        assert min(e.start for e in trace.events) == 0.0
        # the simulation from the trace's own costs, next to the trace
        costs = measured_costs(trace.events, ran.num_stages, comm=hop_latency(trace.events))
        sim = simulate(ran, costs)
        gap = abs(trace.bubble_rate - sim.bubble_rate)
        lines.append(
            f"{cls} p={p} m={m}: bubble trace {trace.bubble_rate:.3f}, simulation "
            f"{sim.bubble_rate:.3f} (|diff| {gap:.3f}); makespan {trace.makespan * 1e3:.1f} ms "
            f"vs {sim.makespan * 1e3:.1f} ms"
        )
        # the memory the stages really held = the simulator's rule for the same program
        assert trace.peak_for(costs) == pytest.approx(sim.peak_memory), lines[-1]
        # Chrome export of every action
        doc = trace.to_chrome()
        assert sum(ev.get("ph") == "X" for ev in doc["traceEvents"]) == len(trace.events)
        runs.append((trace, sim))
    return lines, runs


def _draw(runs: list[tuple[Trace, Any]]) -> None:
    """plot_schedule (the simulation outlined over the measured run) and RunViewer show each
    run: a box per action, an outline per simulated one, the run's own numbers. Called after
    every other check: without the notebook extra only this part is skipped."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("ipywidgets")
    from zbkit import viz
    from zbkit.widgets import RunViewer

    for trace, sim in runs:
        fig = viz.plot_schedule(trace, simulation=sim, compare="overlay")
        layers = {c.get_gid(): c for c in fig.axes[0].collections}
        assert len(layers["actions"].get_paths()) == len(trace.events)
        assert len(layers["simulated"].get_paths()) == len(sim.events)
        numbers = RunViewer(trace, sim).numbers.value
        assert f"run: makespan {trace.makespan:.4g}, bubble {trace.bubble_rate:.1%}" in numbers
        assert f"sim: makespan {sim.makespan:.4g}, bubble {sim.bubble_rate:.1%}" in numbers


@pytest.mark.multiprocess
@pytest.mark.parametrize("p", [2, 4])
def test_trace_torch_records_every_action_in_program_order(p: int, capsys) -> None:
    out = launch(torch_ranks.traced_runs, CASES, nprocs=p, timeout=300)
    lines, runs = check_run(out, p)
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    _draw(runs)


def test_trace_torch_refuses_what_is_not_a_torch_schedule() -> None:
    with pytest.raises(TypeError, match="needs a torch pipeline schedule"):
        with trace_torch(build_schedule("1f1b", pp=2, microbatches=4)):
            pass


def test_trace_torch_wraps_and_restores_stage_methods_even_on_error() -> None:
    """On a stand-in schedule: the stage's own methods are back after the block."""
    calls = []

    class Stage:
        stage_index, group_rank = 1, 0
        fwd_cache: dict = {}
        dw_runner: dict = {}

        def forward_one_chunk(self, fwd_chunk_id, args=(), kwargs=None):
            calls.append(("F", fwd_chunk_id))

        def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True,
                               last_backward=False):  # fmt: skip
            calls.append(("B" if full_backward else "I", bwd_chunk_id))

        def backward_weight_one_chunk(self, bwd_chunk_id, last_backward=False):
            calls.append(("W", bwd_chunk_id))

    stage = Stage()
    sched = SimpleNamespace(_stage=stage)
    ticks = iter(range(100))
    with trace_torch(sched, clock=lambda: float(next(ticks))) as rec:
        stage.forward_one_chunk(0, ())
        stage.backward_one_chunk(0, None, False)  # positional full_backward=False: I
        stage.backward_weight_one_chunk(0)
        stage.backward_one_chunk(1, full_backward=True)
    assert [f"{e.stage}{e.kind}{e.microbatch}" for e in rec.trace.events] == [
        "1F0", "1I0", "1W0", "1B1"
    ]  # fmt: skip
    assert rec.trace.events[0][4:6] == (0.0, 1.0)
    assert "forward_one_chunk" not in stage.__dict__ and len(calls) == 4
    with pytest.raises(ValueError, match="boom"):
        with trace_torch(sched):
            raise ValueError("boom")
    assert not {"forward_one_chunk", "backward_one_chunk"} & set(stage.__dict__)
