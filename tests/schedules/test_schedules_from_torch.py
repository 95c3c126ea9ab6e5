"""Schedule.from_torch and compare_with_torch on real torch schedule objects (issue 14).

torch's classes run here on stand-in stages (their constructors only read sizes), and torch
is the oracle: its pipeline_order, its placement, its own validator's verdict."""

from __future__ import annotations

import itertools
import subprocess
import sys
from types import SimpleNamespace

import pytest

from zbkit.schedules import (
    Costs,
    Overlap,
    Schedule,
    build_schedule,
    compare_with_torch,
    simulate,
    validate,
)
from zbkit.schedules.from_torch import torch_names

ts = pytest.importorskip("torch.distributed.pipelining.schedules")

SIZES = [(1, 4), (2, 4), (2, 6), (3, 6), (4, 8), (4, 12)]
TORCH_NAMES = torch_names()  # torch class -> zbkit name, from the schedules' records
SAME = [c for c in TORCH_NAMES if c not in ("Schedule1F1B", "ScheduleGPipe")]


def torch_object(cls: str, p: int, m: int, v: int | None = None):
    v = v or (1 if cls in ("Schedule1F1B", "ScheduleGPipe") else 2)
    stage = SimpleNamespace(num_stages=v * p, group_size=p, group_rank=0, submod=None)
    return getattr(ts, cls)(stage if v == 1 else [stage] * v, m)


def rows(order) -> dict[int, list[str]]:
    return {r: [str(a) for a in row if a is not None] for r, row in order.items()}


def compute_rows(schedule: Schedule) -> dict[int, list[str]]:
    return {r: schedule.row(r, []) for r in range(schedule.pp)}


@pytest.mark.parametrize("cls", TORCH_NAMES)
def test_from_torch_keeps_torchs_program_placement_and_ops(cls):
    for p, m in SIZES:
        if cls == "ScheduleDualPipeV" and m < 2 * p:
            continue  # torch refuses these
        obj = torch_object(cls, p, m)
        ours = Schedule.from_torch(obj)
        assert ours.name == TORCH_NAMES[cls]
        assert (ours.pp, ours.microbatches) == (p, m)
        # compute actions as torch lists them, torch's other actions kept in their places
        want = rows(getattr(obj, "pipeline_order_with_comms", None) or obj.pipeline_order)
        assert {r: ours.row(r) for r in range(p)} == want, (cls, p, m)
        assert compute_rows(ours) == {
            r: [c for c in row if ts._Action.from_str(c).computation_type
                in (ts.F, ts.B, ts.I, ts.W, ts.OVERLAP_F_B)]
            for r, row in rows(obj.pipeline_order).items()
        }  # fmt: skip
        # the placement torch uses
        mapping = getattr(obj, "stage_index_to_group_rank", None)
        if mapping is not None:
            assert ours.stage_to_rank == [mapping[s] for s in range(ours.num_stages)]
        if cls in ("ScheduleZBVZeroBubble", "ScheduleDualPipeV"):
            assert ours.stage_to_rank == [min(s, 2 * p - 1 - s) for s in range(2 * p)]
        else:
            assert ours.stage_to_rank == [s % p for s in range(ours.num_stages)]
        # the class with sizes gives the same schedule as the object
        again = Schedule.from_torch(getattr(ts, cls), pp=p, microbatches=m)
        assert again == ours


@pytest.mark.parametrize("cls", SAME)
def test_torchs_schedules_equal_zbkits_builders_of_the_same_name(cls):
    for p, m in SIZES:
        if cls == "ScheduleDualPipeV" and m < 2 * p:
            continue
        c = compare_with_torch(cls, pp=p, microbatches=m, costs=Costs(1, 1, 1))
        assert c.equal, (cls, p, m, c.differences)
        assert c.torch_error is None and c.zbkit_error is None
        assert c.torch_sim.events == c.zbkit_sim.events  # same program, same simulation
        assert "programs: equal, action for action" in str(c)
        if cls == "ScheduleDualPipeV":
            assert any(isinstance(i, Overlap) for r in c.torch.program.values() for i in r)
    # torch's interleaved classes with 3 stages per rank too
    for cls in ("ScheduleInterleaved1F1B", "ScheduleLoopedBFS", "ScheduleInterleavedZeroBubble"):
        c = compare_with_torch(cls, pp=2, microbatches=4, stages_per_rank=3)
        assert c.equal and c.torch.num_stages == 6, (cls, c.differences)


def test_torch_1f1b_last_rank_numbers_its_forwards_1_to_m_and_both_validators_refuse_it():
    """torch 2.13's Schedule1F1B draws the last rank's forwards as F1..Fm (its runtime runs
    F0..F(m-1)): torch's own validator rejects that order, and zbkit's names the cell."""
    for p, m in [(2, 4), (3, 5), (4, 8), (4, 12)]:
        obj = torch_object("Schedule1F1B", p, m)
        last = rows(obj.pipeline_order)[p - 1]
        forwards = [int(c[len(str(p - 1)) + 1 :]) for c in last if c[len(str(p - 1))] == "F"]
        assert forwards == list(range(1, m + 1)), (p, m, last)
        with pytest.raises(AssertionError, match="without first running Forward"):
            ts._validate_schedule(obj.pipeline_order, p, p, m)
        c = compare_with_torch("1f1b", pp=p, microbatches=m)
        assert c.torch_error is not None and c.zbkit_error is None and c.torch_sim is None
        r = p - 1
        assert c.torch_error.startswith(
            f"rank {r}, position 1: {r}B0 (stage {r}, microbatch 0) but {r}F0 is missing"
        ), c.torch_error
        marked = [ln for ln in c.torch_error.splitlines() if "<-- ERROR HERE" in ln]
        assert marked == [ln for ln in marked if ln.startswith(f"rank {r}")] and len(marked) == 1
        assert f"[{r}B0]" in marked[0]
        # every other rank is zbkit's 1f1b, action for action; the last differs at F0 / F1
        assert c.differences == {r: (0, f"{r}F1", f"{r}F0")}
        text = str(c)
        assert "valid" in text and "NO" in text and "<-- ERROR HERE" in text
        assert f"rank {r} differs first at position 0: torch {r}F1, zbkit {r}F0" in text


def test_torch_gpipe_runs_its_backwards_first_to_last_zbkits_last_to_first():
    # a real difference between two valid orders: torch's B0 first, zbkit's (the GPipe
    # paper's figure) B(m-1) first; same peak memory, same makespan for equal costs
    for p, m in [(2, 4), (4, 8)]:
        c = compare_with_torch("gpipe", pp=p, microbatches=m, costs=Costs(1, 1, 1))
        assert c.torch_error is None and c.zbkit_error is None and not c.equal
        assert c.differences == {r: (m, f"{r}B0", f"{r}B{m - 1}") for r in range(p)}
        assert c.torch_sim.makespan == c.zbkit_sim.makespan
        assert c.torch_sim.peak_memory == c.zbkit_sim.peak_memory == [m] * p


def test_loaded_schedules_simulate_and_keep_torchs_transfers():
    zbv = Schedule.from_torch(ts.ScheduleZBVZeroBubble, pp=4, microbatches=8)
    validate(zbv)  # transfers matched, FSDP actions in order
    assert any(zbv.torch_ops.values())
    assert simulate(zbv, Costs(1, 1, 1)).bubble_rate == pytest.approx(
        simulate(build_schedule("zb-v", pp=4, microbatches=8), Costs(1, 1, 1)).bubble_rate
    )
    # single-stage classes: only torch's REDUCE_GRAD after the last backward
    gpipe = Schedule.from_torch(torch_object("ScheduleGPipe", 3, 6))
    assert {str(op) for ops in gpipe.torch_ops.values() for _, op in ops} == {
        "0REDUCE_GRAD", "1REDUCE_GRAD", "2REDUCE_GRAD"
    }  # fmt: skip
    validate(gpipe)


def test_wrong_sizes_and_names_are_one_line():
    obj = torch_object("ScheduleZBVZeroBubble", 2, 4)
    with pytest.raises(ValueError, match="microbatches=8, but the torch schedule has"):
        Schedule.from_torch(obj, microbatches=8)
    with pytest.raises(TypeError, match="needs pp= and microbatches="):
        Schedule.from_torch(ts.Schedule1F1B)
    with pytest.raises(ValueError, match="two stages per rank"):
        Schedule.from_torch(ts.ScheduleZBVZeroBubble, pp=2, microbatches=4, stages_per_rank=3)
    with pytest.raises(ValueError, match="one stage per rank"):
        Schedule.from_torch(ts.Schedule1F1B, pp=2, microbatches=4, stages_per_rank=2)
    with pytest.raises(ValueError, match="no torch schedule named 'zb-h9'.*zb-v"):
        compare_with_torch("zb-h9", pp=2, microbatches=4)
    with pytest.raises(ValueError, match="no torch schedule named 'zb-h9'.*zb-v"):
        Schedule.from_torch("zb-h9", pp=2, microbatches=4)
    with pytest.raises(TypeError, match="needs pp= and microbatches="):
        Schedule.from_torch("ScheduleZBVZeroBubble")


def test_from_torch_takes_a_class_name_as_compare_does():
    by_class = Schedule.from_torch(ts.ScheduleZBVZeroBubble, pp=2, microbatches=8)
    for name in ("ScheduleZBVZeroBubble", "zb-v"):
        by_name = Schedule.from_torch(name, pp=2, microbatches=8)
        assert by_name == by_class and by_name.torch_ops == by_class.torch_ops


def test_compare_takes_names_classes_and_class_names():
    by_name = compare_with_torch("zb-v", pp=2, microbatches=4)
    assert by_name.equal
    for other in ("ScheduleZBVZeroBubble", ts.ScheduleZBVZeroBubble):
        assert compare_with_torch(other, pp=2, microbatches=4).torch == by_name.torch
    assert repr(by_name).startswith("TorchComparison('zb-v', pp=2, m=4, equal=True")


def test_zbkit_schedules_still_imports_without_torch():
    code = (
        "import sys; import zbkit.schedules as s; "
        "assert hasattr(s, 'compare_with_torch'); assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_many_sizes_load_and_agree_but_interleaved_1f1b_with_m_equal_to_p():
    """A wider sweep (p 1-5, m 1-3p) of the classes torch and zbkit share. The one difference
    found: with m = p, torch's Interleaved1F1B lets the later ranks run its last chunk's first
    backward before its second forward (3F0 3B0 3F1 for p = 2), zbkit's runs the forwards
    first; both valid, same makespan for equal costs."""
    for cls, p in itertools.product(SAME, range(1, 6)):
        for m in range(1, 3 * p + 1):
            try:
                c = compare_with_torch(cls, pp=p, microbatches=m, costs=Costs(1, 1, 1))
            except ValueError:  # sizes the builder (and torch) refuse, e.g. m % p for interleaved
                continue
            if cls == "ScheduleInterleaved1F1B" and m == p and p > 1:
                assert not c.equal and 0 not in c.differences, (p, c.differences)
                assert c.torch_error is None and c.zbkit_error is None
                assert c.torch_sim.makespan == c.zbkit_sim.makespan, p
            else:
                assert c.equal, (cls, p, m, c.differences)
    c = compare_with_torch("interleaved-1f1b", pp=2, microbatches=2)
    assert c.differences == {1: (3, "3B0", "3F1")}
