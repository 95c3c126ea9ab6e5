"""The traps the doctor finds in one traced microbatch's graph: each shown failing first, then
the doctor's finding, then the fix working against plain autograd (conftest's oracle).

torch's V schedules on a gloo world of one rank put stages 0 and 1 on rank 0, so torch's own
runtime runs here in one process; zbkit's LocalPipeline runs the same modules.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.utils.checkpoint as checkpoint
from conftest import batch, grads, mse, oracle, same
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleLoopedBFS, ScheduleZBVZeroBubble

import zbkit.doctor
import zbkit.splitgrad
import zbkit.torchpp
from zbkit.pipeline import LocalPipeline, StageError
from zbkit.schedules import build_schedule

M = 4  # microbatches


class Reused(nn.Module):
    """`lin` twice with `mid` between (ALBERT's shared layer, a tied in/out projection)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.mid = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(torch.tanh(self.mid(self.lin(x))))


class Ignores(nn.Module):
    """Its output does not depend on its input (a stage that restarts from a constant)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.start = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.start.expand(x.shape[0], 4))


class Checkpointed(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint.checkpoint(self.block, x, use_reentrant=self.reentrant)


class CompiledInside(nn.Module):
    """A compiled function inside forward: no OptimizedModule among the modules."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.body = torch.compile(self._body, backend="aot_eager")

    def _body(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _model(second: nn.Module) -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(4, 4), nn.Tanh()), second]


def _torch_step(mods, cls=ScheduleZBVZeroBubble):
    """One step of torch's schedule over both stages on rank 0; (stages, schedule)."""
    stages = [PipelineStage(m, i, 2, torch.device("cpu")) for i, m in enumerate(mods)]
    schedule = cls(stages, M, loss_fn=mse)
    return stages, schedule


def _run_torch(stages, schedule, exact: bool = False) -> None:
    x, y = batch()
    if exact:
        with zbkit.torchpp.exact_split_backward():
            schedule.step(x, target=y)
    else:
        schedule.step(x, target=y)


def _doctor(stages, schedule, runtime=None):
    x, y = batch()
    return zbkit.doctor.check(stages, schedule, inputs=x, target=y, loss_fn=mse, runtime=runtime)


def test_weight_reused_in_one_stage(gloo_world) -> None:
    mods = _model(Reused())
    expected = oracle(mods, *batch(), M)
    stages, schedule = _torch_step(mods)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        _run_torch(stages, schedule)  # the failure: torch's own W
    for m in mods:
        m.zero_grad(set_to_none=True)
    report = _doctor(stages, schedule)
    assert report.traps() == ["weight-reused-in-stage"], report
    (finding,) = report
    assert finding.stage == 1 and finding.rank == 0 and "lin.weight" in finding.where
    assert "exact_split_backward" in finding.fix and finding.torch_version == torch.__version__
    assert all(p.grad is None for m in mods for p in m.parameters())  # the doctor left no .grad
    # the fix: torch's runtime with zbkit's split; the doctor is silent there, and on zbkit's
    stages, schedule = _torch_step(mods)  # fresh: the failed step left torch's caches full
    assert _doctor(stages, schedule, runtime="torch+zbkit").ok
    _run_torch(stages, schedule, exact=True)
    assert same(grads(mods), expected)
    assert zbkit.doctor.check(mods, build_schedule("zb-v", pp=1, microbatches=M),
                              inputs=batch()[0], target=batch()[1], loss_fn=mse).ok  # fmt: skip


def test_input_not_reaching_the_loss(gloo_world) -> None:
    mods = _model(Ignores())
    expected = oracle(mods, *batch(), M)
    assert expected[1]["lin.weight"] is not None  # autograd gives stage 1 its gradients
    stages, schedule = _torch_step(mods)
    _run_torch(stages, schedule)  # the failure: silent, every stage-1 gradient None
    assert all(g is None for g in grads(mods)[1].values())
    for m in mods:
        m.zero_grad(set_to_none=True)
    report = _doctor(stages, schedule)
    assert report.traps() == ["input-not-reaching-loss"], report
    assert "input(s) [0]" in report.findings[0].where and "start" in report.findings[0].where
    _run_torch(stages, schedule, exact=True)  # the fix
    assert same(grads(mods)[1:], expected[1:])
    assert _doctor(stages, schedule, runtime="torch+zbkit").ok


def test_reentrant_checkpoint(gloo_world) -> None:
    mods = _model(Checkpointed(reentrant=True))
    stages, schedule = _torch_step(mods)
    with pytest.raises(RuntimeError, match="use_reentrant"):
        _run_torch(stages, schedule)
    assert _doctor(stages, schedule).traps() == ["reentrant-checkpoint"]
    x, y = batch()
    zb = build_schedule("zb-h1", pp=2, microbatches=M)
    with pytest.raises(StageError, match="use_reentrant=False"):  # zbkit raises with the fix
        LocalPipeline(mods, zb, mse).step(x, target=y)
    found = zbkit.doctor.check(mods, zb, inputs=x, target=y, loss_fn=mse)
    assert found.traps() == ["reentrant-checkpoint"] and found.findings[0].stage == 1
    # not split, nothing to say: torch's looped BFS runs full backwards
    bfs = _torch_step(mods, ScheduleLoopedBFS)
    assert _doctor(*bfs).ok
    # the fix
    fixed = _model(Checkpointed(reentrant=False))
    expected = oracle(fixed, x, y, M)
    stages, schedule = _torch_step(fixed)
    assert _doctor(stages, schedule).ok
    _run_torch(stages, schedule)
    assert same(grads(fixed), expected)


def test_compiled_region_under_a_split() -> None:
    torch._dynamo.reset()
    mods = _model(torch.compile(nn.Sequential(nn.Linear(4, 4), nn.Tanh()), backend="aot_eager"))
    x, y = batch()
    zb = build_schedule("zb-h1", pp=2, microbatches=M)
    found = zbkit.doctor.check(mods, zb, inputs=x, target=y, loss_fn=mse)
    assert found.traps() == ["compiled-region"], found
    (finding,) = found
    assert finding.severity == "slower" and "CompiledFunctionBackward" in finding.where
    assert finding.stage == 1 and "WholeBackwardWarning" in finding.happens
    # what it says happens: zbkit runs it exact, and warns (where splitgrad has the warning)
    expected = oracle(mods, x, y, M)
    whole = getattr(zbkit.splitgrad, "WholeBackwardWarning", None)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        LocalPipeline(mods, zb, mse).step(x, target=y)
    assert same(grads(mods), expected, atol=1e-5)
    if whole is not None:
        assert any(issubclass(w.category, whole) for w in seen)
    # no split, no finding: 1F1B runs each backward whole
    one = build_schedule("1f1b", pp=2, microbatches=M)
    assert zbkit.doctor.check(mods, one, inputs=x, target=y, loss_fn=mse).ok


def test_compiled_region_under_torchs_split(gloo_world) -> None:
    torch._dynamo.reset()
    wrapped = _model(torch.compile(nn.Sequential(nn.Linear(4, 4), nn.Tanh()), backend="aot_eager"))
    with pytest.raises(RuntimeError, match="not supported with stage modules that have used"):
        _torch_step(wrapped)  # torch 2.13 refuses a compiled wrapper (OptimizedModule) itself
    stages, schedule = _torch_step(_model(CompiledInside()))  # no wrapper for torch to see
    own = _doctor(stages, schedule)
    assert own.traps() == ["compiled-region"] and own.findings[0].severity == "wrong"
    assert "161904" in own.findings[0].happens and own.findings[0].stage == 1
    drop_in = _doctor(stages, schedule, runtime="torch+zbkit")
    assert drop_in.traps() == ["compiled-region"] and drop_in.findings[0].severity == "slower"


class CompiledWeight(nn.Module):
    """A compiled part only the weights feed: outside the input closure, run at W alone."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.shape = torch.compile(lambda w: torch.tanh(w) * 2, backend="aot_eager")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.shape(self.lin.weight)


def test_a_compiled_region_only_weights_feed_keeps_the_split() -> None:
    torch._dynamo.reset()
    mods = _model(CompiledWeight())
    x, y = batch()
    zb = build_schedule("zb-h1", pp=2, microbatches=M)
    assert zbkit.doctor.check(mods, zb, inputs=x, target=y, loss_fn=mse).ok
    # what it says: zbkit keeps the split there (no whole backward), and is exact
    expected = oracle(mods, x, y, M)
    with warnings.catch_warnings():
        warnings.simplefilter("error", zbkit.splitgrad.WholeBackwardWarning)
        LocalPipeline(mods, zb, mse).step(x, target=y)
    assert same(grads(mods), expected, atol=1e-5)
