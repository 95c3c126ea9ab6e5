"""The traps the doctor finds in the schedule's facts (microbatches, batch, placement), the
arguments it refuses, and how a report shows itself."""

from __future__ import annotations

import sys

import cloudpickle
import doctor_ranks
import pytest
import torch
from conftest import batch, grads, mse, oracle, same
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleDualPipeV, ScheduleZBVZeroBubble

import zbkit.doctor
from zbkit.launch import launch
from zbkit.pipeline import LocalPipeline, ScheduleRunner
from zbkit.pipeline import PipelineStage as ZbkitStage
from zbkit.schedules import Schedule, build_schedule


def _mods(n: int = 2) -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(4, 4), nn.Tanh()) for _ in range(n)]


def _torch(mods, m: int = 4):
    stages = [PipelineStage(mod, i, len(mods), torch.device("cpu")) for i, mod in enumerate(mods)]
    return stages, ScheduleZBVZeroBubble(stages, m, loss_fn=mse)


def test_a_torch_class_asked_for_too_few_microbatches() -> None:
    with pytest.raises(ValueError, match="at least as many microbatches"):
        Schedule.from_torch(ScheduleDualPipeV, pp=2, microbatches=2)  # the failure: torch's
    report = zbkit.doctor.check(_mods(4), ScheduleDualPipeV, microbatches=2, pp=2)
    assert report.traps() == ["too-few-microbatches"], report
    assert "at least 4 microbatches" in report.findings[0].fix  # asked of torch's class
    assert zbkit.doctor.check(_mods(4), ScheduleDualPipeV, microbatches=4, pp=2).ok


def test_fewer_rows_than_microbatches(gloo_world) -> None:
    mods = _mods()
    x, y = batch(rows=3)
    stages, schedule = _torch(mods)
    with pytest.raises(AssertionError, match="smaller than num_chunks"):
        schedule.step(x, target=y)
    report = zbkit.doctor.check(stages, schedule, inputs=x, target=y, loss_fn=mse)
    assert report.traps() == ["too-few-microbatches"], report
    zb = build_schedule("zb-h1", pp=2, microbatches=4)
    with pytest.raises(ValueError, match="equal microbatches"):
        LocalPipeline(mods, zb, mse).step(x, target=y)
    assert zbkit.doctor.check(mods, zb, batch=3).traps() == ["too-few-microbatches"]


def test_a_batch_the_microbatches_do_not_divide(gloo_world) -> None:
    mods = _mods()
    x, y = batch(rows=7)
    stages, schedule = _torch(mods)
    schedule.step(x, target=y)  # the failure: runs, microbatches of 2, 2, 2, 1 rows
    batch_mean = [{n: g for n, g in d.items()} for d in oracle(mods, x, y, 1)]
    assert not same(grads(mods), batch_mean)
    report = zbkit.doctor.check(stages, schedule, inputs=x, target=y, loss_fn=mse)
    assert report.traps() == ["batch-indivisible"] and report.findings[0].severity == "wrong"
    assert "[2, 2, 2, 1]" in report.findings[0].happens
    # the fix: 8 rows, the batch's mean gradient
    for m in mods:
        m.zero_grad(set_to_none=True)
    x, y = batch(rows=8)
    stages, schedule = _torch(mods)
    assert zbkit.doctor.check(stages, schedule, inputs=x, target=y, loss_fn=mse).ok
    schedule.step(x, target=y)
    assert same(grads(mods), oracle(mods, x, y, 1))
    zb = build_schedule("zb-h1", pp=2, microbatches=4)
    assert zbkit.doctor.check(mods, zb, batch=7).traps() == ["batch-indivisible"]


def test_zbkit_stages_off_the_schedules_map(gloo_world) -> None:
    mods = _mods()
    zb = build_schedule("zb-v", pp=1, microbatches=4)  # rank 0 holds stages 0 and 1
    mine = [ZbkitStage(mods[1], 1, 2)]
    with pytest.raises(ValueError, match="holds stages"):
        ScheduleRunner(zb, mine, mse)  # the failure: zbkit's runner refuses
    report = zbkit.doctor.check(mine, zb)  # this process's rank: 0
    assert report.traps() == ["stage-off-placement"] and "[0, 1]" in report.findings[0].where
    assert zbkit.doctor.check([ZbkitStage(m, i, 2) for i, m in enumerate(mods)], zb, rank=0).ok


@pytest.mark.multiprocess
def test_torch_stages_off_the_v() -> None:
    cloudpickle.register_pickle_by_value(doctor_ranks)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ranks = launch(doctor_ranks.off_the_v, 15.0, nprocs=2, timeout=240)
    for rank, got in enumerate(ranks):
        assert got["traps"] == ["stage-off-placement"], got
        assert f"must hold stages {[rank, 3 - rank]}" in got["where"][0]
        assert got["step"] != "ran"  # the failure: torch's step raises or times out


def test_arguments_refused_with_reasons() -> None:
    mods, zb = _mods(), build_schedule("zb-h1", pp=2, microbatches=4)
    with pytest.raises(ValueError, match="runtime must be one of"):
        zbkit.doctor.check(mods, zb, runtime="jax")
    with pytest.raises(ValueError, match="runs on 'zbkit'"):
        zbkit.doctor.check(mods, zb, runtime="torch")
    with pytest.raises(TypeError, match="must be a list"):
        zbkit.doctor.check(mods[0], zb)
    with pytest.raises(TypeError, match="zbkit Schedule"):
        zbkit.doctor.check(mods, "zb-h1")
    with pytest.raises(ValueError, match="built for 4"):
        zbkit.doctor.check(mods, zb, microbatches=8)
    with pytest.raises(ValueError, match="pass inputs= too"):
        zbkit.doctor.check(mods, zb, loss_fn=mse)
    with pytest.raises(ValueError, match="needs microbatches= and pp="):
        zbkit.doctor.check(mods, ScheduleDualPipeV)
    with pytest.raises(ValueError, match="no rank= was given"):
        zbkit.doctor.check([ZbkitStage(mods[0], 0, 2)], zb)


def test_a_report_shows_itself() -> None:
    report = zbkit.doctor.check(_mods(), build_schedule("zb-h1", pp=2, microbatches=4), batch=7)
    text = str(report)
    assert "zb-h1 (pp=2" in text and "[batch-indivisible]" in text and torch.__version__ in text
    bundle = report._repr_mimebundle_()
    assert bundle["text/plain"] == text and "<table>" in bundle["text/html"]
    assert repr(report).startswith("Report(zb-h1") and not report.ok and len(report) == 1
    clean = zbkit.doctor.check(_mods(), build_schedule("zb-h1", pp=2, microbatches=4), batch=8)
    assert clean.ok and "no findings" in str(clean)
    assert "not checked: the stages' graphs" in str(clean)
