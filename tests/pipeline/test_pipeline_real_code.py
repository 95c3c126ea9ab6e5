"""What real users' code does to a pipeline: the cases that used to pass silently or fail
with a riddle. Each compares against plain autograd, or against what plain autograd says.

The runner's cases run on a one-rank group (zb-v with pp=1: both stages on this rank), so
they need no second process; tests/pipeline/test_pipeline_real_code_dist.py runs the wire.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
from pipeline_models import one_rank_group
from real_code_models import (
    D,
    EndsWithNone,
    TakesPast,
    TakesTwo,
    TwoInputs,
    WithPast,
    data,
    two_stages,
)
from torch import nn
from torch.nn.functional import mse_loss
from torch.utils.checkpoint import checkpoint

from zbkit import build_schedule
from zbkit.pipeline import LocalPipeline, PipelineStage, ScheduleRunner, StageError
from zbkit.splitgrad import (
    reference_weight_pass,
    stage_backward_full,
    stage_backward_input,
    stage_backward_weight,
)

SCHEDULE = build_schedule("zb-h1", pp=2, microbatches=2)


def runner_for(mods: list[nn.Module], loss_fn: Callable) -> ScheduleRunner:
    sch = build_schedule("zb-v", pp=1, microbatches=2)  # stages 0 and 1 on the one rank
    stages = [PipelineStage(m, s, 2) for s, m in enumerate(mods)]
    return ScheduleRunner(sch, stages, loss_fn, timeout=120)


# ---------------------------------------------------------------- 1. a loss with no graph
def detached(out, y):
    return mse_loss(out, y).detach()  # a stray .detach() (or a tensor made from .item())


def graphless_cases() -> dict[str, Callable[[Callable], list]]:
    """Each runs a pipeline step whose loss carries no graph; returns the losses."""
    x, y = data()

    def frozen(step):
        mods = two_stages()
        for m in mods:
            m.requires_grad_(False)
        return step(mods, mse_loss, x, y)

    def no_grad(step):
        with torch.no_grad():
            return step(two_stages(), mse_loss, x, y)

    return {
        "detached loss": lambda step: step(two_stages(), detached, x, y),
        "every stage frozen": frozen,
        "forward under no_grad": no_grad,
    }


def local_step(mods, loss_fn, x, y):
    return LocalPipeline(mods, SCHEDULE, loss_fn).step(x, y)


@pytest.mark.parametrize("case", list(graphless_cases()))
def test_a_loss_without_a_graph_raises_as_loss_backward_does(case: str) -> None:
    x, y = data()
    with pytest.raises(RuntimeError, match="does not require grad"):  # autograd's own refusal
        mse_loss(two_stages()[1](x), y).detach().backward()
    with pytest.raises(StageError) as info:
        graphless_cases()[case](local_step)
    text = str(info.value)
    assert "stage 1 microbatch 0: the loss does not require grad" in text, text
    assert "would train nothing" in text and ".detach()" in text, text
    if case == "forward under no_grad":
        assert "torch.no_grad()" in text


def test_the_runner_and_splitgrad_refuse_a_graphless_loss_too() -> None:
    x, y = data()
    with one_rank_group():
        for case, run in graphless_cases().items():
            with pytest.raises(StageError, match="stage 1 microbatch 0: the loss does not"):
                run(lambda mods, fn, x, y: runner_for(mods, fn).step(x, targets=y))
            assert dist.is_initialized(), case
    lin = nn.Linear(D, 1)
    loss = mse_loss(lin(x), y).detach()
    for backward in (
        lambda: stage_backward_input([loss], None, [], list(lin.parameters())),
        lambda: stage_backward_full([loss], None, []),
    ):
        with pytest.raises(RuntimeError, match="the output requires grad: .*without an autograd"):
            backward()


def test_a_stage_whose_output_is_detached_trains_what_plain_autograd_trains() -> None:
    # Not an error: the last stage still trains, as `loss.backward()` would train it alone.
    class Cut(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(D, D)

        def forward(self, x):
            return self.lin(x).detach()

    x, y = data()
    mods = [Cut(), nn.Linear(D, 1)]
    twin = copy.deepcopy(mods)
    mse_loss(twin[1](twin[0](x)), y).backward()
    LocalPipeline(mods, SCHEDULE, mse_loss).step(x, y)
    assert mods[0].lin.weight.grad is None and twin[0].lin.weight.grad is None
    torch.testing.assert_close(mods[1].weight.grad, twin[1].weight.grad)


# ---------------------------------------------------------------- 2. frozen between I and W
class Block(nn.Module):
    """A Linear, a LayerNorm (whose weight gradient the fast path computes in I) and a
    weight used twice along one path."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(D, D)
        self.norm = nn.LayerNorm(D)
        self.b = nn.Linear(D, D)

    def forward(self, x):
        h = self.norm(torch.tanh(self.a(x)))
        return self.b(torch.relu(self.b(h)))


FREEZE = ["a.weight", "norm.weight", "norm.bias", "b.weight", "b.bias", "all"]


@pytest.mark.parametrize("path", ["fast", "reference"])
@pytest.mark.parametrize("frozen", FREEZE)
def test_a_parameter_frozen_between_i_and_w_gets_no_gradient_as_in_autograd(
    frozen: str, path: str
) -> None:
    torch.manual_seed(2)
    block, twin = Block(), None
    twin = copy.deepcopy(block)
    x = torch.randn(3, D, requires_grad=True)
    g = torch.randn(3, D)

    def freeze(m: nn.Module) -> None:
        for name, p in m.named_parameters():
            if frozen in (name, "all"):
                p.requires_grad_(False)

    # plain autograd: the parameter is frozen after its forward, before the backward
    out = twin(x)
    freeze(twin)
    out.backward(g)
    mode = reference_weight_pass() if path == "reference" else contextlib.nullcontext()
    with mode:
        weights = list(block.parameters())
        res = stage_backward_input([block(x)], [g], [x], weights)
        freeze(block)  # a freeze callback firing while W waits
        stage_backward_weight(weights, res.pending_weight)
    torch.testing.assert_close(res.input_grads[0], x.grad)
    for (name, p), q in zip(block.named_parameters(), twin.parameters(), strict=True):
        if q.grad is None:
            assert p.grad is None, name
        else:
            torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_a_stage_frozen_between_its_i_and_its_w() -> None:
    x = torch.randn(3, D, requires_grad=True)
    g = torch.randn(3, D)
    block = Block()
    twin = copy.deepcopy(block)
    want = twin(x)
    twin.b.weight.requires_grad_(False)
    want.backward(g)
    stage = PipelineStage(block, 1, 3)
    out = stage.forward(0, {"0": x})["0"]
    torch.testing.assert_close(out, want)  # the block's own output, under its one name
    stage.backward_input(0, {"0": g})
    block.b.weight.requires_grad_(False)
    stage.backward_weight(0)
    assert block.b.weight.grad is None
    torch.testing.assert_close(block.a.weight.grad, twin.a.weight.grad)
    stage.assert_clean()


# ---------------------------------------------------------------- 3. None keeps its place
def oracle_grads(mods: list[nn.Module], x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    twin = copy.deepcopy(mods)
    mse_loss(twin[1](*twin[0](x)), y).backward()
    return [p.grad for m in twin for p in m.parameters()]


def assert_grads(mods: list[nn.Module], expected: list[torch.Tensor]) -> None:
    got = [p.grad for m in mods for p in m.parameters()]
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("pair", [(WithPast, TakesPast), (EndsWithNone, TakesTwo)])
def test_a_none_in_a_stage_tuple_arrives_as_none(pair: tuple[type, type]) -> None:
    x, y = data()
    mods = [pair[0](), pair[1]()]
    expected = oracle_grads(mods, x, y)
    LocalPipeline(mods, SCHEDULE, mse_loss).step(x, y)
    assert_grads(mods, expected)
    if isinstance(mods[1], TakesPast):
        assert mods[1].seen == [None, None]  # one per microbatch
    with one_rank_group():
        mods = [pair[0](), pair[1]()]
        expected = oracle_grads(mods, x, y)
        runner_for(mods, mse_loss).step(x, targets=y)
        assert_grads(mods, expected)


def test_eleven_tuple_outputs_keep_their_order() -> None:
    # keys "0".."10": as strings "10" sorts before "2"; the positions must not
    class Many(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(D, D)

        def forward(self, x):
            h = self.lin(x)
            return tuple(h * (i + 1) for i in range(11))

    class Weighted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(D, 1)

        def forward(self, *hs):
            return self.lin(sum(h * (i + 1) for i, h in enumerate(hs)))

    x, y = data()
    mods = [Many(), Weighted()]
    expected = oracle_grads(mods, x, y)
    LocalPipeline(mods, SCHEDULE, mse_loss).step(x, y)
    assert_grads(mods, expected)


# ---------------------------------------------------------------- 4. torch's several inputs
def test_several_positional_inputs_reach_stage_0_as_torch_passes_them() -> None:
    x, y = data()
    bias = torch.randn(4, D)
    mask = (torch.randn(4, D) > 0).float()
    for call in ("torch", "tuple", "with a None", "keyword None"):
        mods = [TwoInputs(), nn.Linear(D, 1)]
        twin = copy.deepcopy(mods)
        m = mask if call != "with a None" else None
        mse_loss(twin[1](twin[0](x, bias, m)), y).backward()
        pipe = LocalPipeline(mods, SCHEDULE, mse_loss)
        if call == "torch":
            pipe.step(x, bias, mask, target=y)
        elif call == "tuple":
            pipe.step((x, bias, mask), y)
        elif call == "with a None":  # an optional input left out keeps its place
            pipe.step(x, bias, None, targets=y)
        else:
            pipe.step((x, bias, mask), targets=y)
        assert_grads(mods, [p.grad for mm in twin for p in mm.parameters()])
    pipe = LocalPipeline([TwoInputs(), nn.Linear(D, 1)], SCHEDULE, mse_loss)
    with pytest.raises(TypeError, match=r"name the targets as torch does, step\(x1, x2, target"):
        pipe.step(x, bias, y)
    with pytest.raises(TypeError, match="both targets= and target="):
        pipe.step(x, bias, targets=y, target=y)
    with one_rank_group():  # the runner takes the same forms
        mods = [TwoInputs(), nn.Linear(D, 1)]
        twin = copy.deepcopy(mods)
        mse_loss(twin[1](twin[0](x, bias, mask)), y).backward()
        runner_for(mods, mse_loss).step(x, bias, mask, target=y)
        assert_grads(mods, [p.grad for mm in twin for p in mm.parameters()])


# ---------------------------------------------------------------- 6. unchecked arguments
def test_a_schedule_that_is_not_built_yet_is_named() -> None:
    from torch.distributed.pipelining import ScheduleZBVZeroBubble

    mods = two_stages()
    with pytest.raises(TypeError, match=r"got the string 'zb-h1': build it first, build_sched"):
        LocalPipeline(mods, "zb-h1", mse_loss)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"torch's ScheduleZBVZeroBubble: .*Schedule.from_torch"):
        LocalPipeline(mods, ScheduleZBVZeroBubble, mse_loss)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="loss_fn must be a callable"):
        LocalPipeline(mods, SCHEDULE, "mse")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes a list of modules, one per stage"):
        LocalPipeline(mods[0], SCHEDULE, mse_loss)  # type: ignore[arg-type]
    stages = [PipelineStage(m, s, 2) for s, m in enumerate(mods)]
    with pytest.raises(RuntimeError, match=r"ScheduleRunner needs a process group: .*LocalPipel"):
        ScheduleRunner(SCHEDULE, stages, mse_loss)  # no group here: the one check names the fix
    with one_rank_group():
        with pytest.raises(TypeError, match="ScheduleRunner takes a zbkit Schedule"):
            ScheduleRunner("zb-v", stages, mse_loss)  # type: ignore[arg-type]
    from zbkit.schedules import validate

    with pytest.raises(TypeError, match="validate takes a zbkit Schedule"):
        validate("zb-h1")  # type: ignore[arg-type]


def test_a_step_without_targets_names_targets() -> None:
    x, _ = data()
    with pytest.raises(StageError, match=r"target=None: the step was given no targets; pass"):
        LocalPipeline(two_stages(), SCHEDULE, mse_loss).step(x)
    # a loss_fn that needs no targets may go without them
    losses = LocalPipeline(two_stages(), SCHEDULE, lambda out, _: out.pow(2).mean()).step(x)
    assert len(losses) == 2


# ---------------------------------------------------------------- 7. reentrant checkpoints
class Checkpointed(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.reentrant = reentrant

    def forward(self, x):
        return checkpoint(torch.tanh, self.lin(x), use_reentrant=self.reentrant)


def test_a_reentrant_checkpoint_is_named_and_the_other_kind_is_exact() -> None:
    x, y = data()
    with pytest.raises(StageError) as info:
        LocalPipeline([nn.Linear(D, D), Checkpointed(True)], SCHEDULE, lambda o, t: o.sum()).step(
            x, y
        )
    text = str(info.value)
    assert "stage 1 microbatch 0: its I raised RuntimeError" in text, text
    assert "reentrant activation checkpoint" in text and "use_reentrant=False" in text, text
    mods = [nn.Linear(D, D), Checkpointed(False)]
    twin = copy.deepcopy(mods)
    twin[1](twin[0](x)).sum().backward()
    LocalPipeline(mods, SCHEDULE, lambda o, t: o.sum() / 2, scale_grads=False).step(x, y)
    # the pipeline's loss is the sum over 2 microbatches of half-sums: the full-batch sum / 2
    for m, t in zip(mods, twin, strict=True):
        for p, q in zip(m.parameters(), t.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad / 2)


# ---------------------------------------------------------------- 8. the siblings
def test_the_other_entry_points_say_the_same() -> None:
    from zbkit import simulate, torchpp
    from zbkit.schedules import derive_plan

    with pytest.raises(TypeError, match="simulate takes a zbkit Schedule.*build_schedule"):
        simulate("zb-h1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="derive_plan takes a zbkit Schedule.*build_schedule"):
        derive_plan("zb-h1", 0)  # type: ignore[arg-type]
    # torch's runtime with zbkit's exact split: a graphless loss refused as loss.backward() does
    x, y = data()
    lin = nn.Linear(D, 1)
    loss = mse_loss(lin(x), y).detach()
    with pytest.raises(RuntimeError, match="does not require grad"):
        loss.backward()
    with pytest.raises(RuntimeError, match="the loss does not require grad"):
        torchpp.stage_backward_input([loss], None, [x], list(lin.parameters()))
