"""torch.distributed.pipelining's forms, run by zbkit unchanged (single process, autograd oracle).

A torch user's stage module returns a Tensor (or a tuple of them) and takes positional
arguments; their loss is ``loss_fn(output, target)``; they call ``step(x, target=y,
losses=losses)``, build ``PipelineStage(module, i, n, device)`` and unpack
``stage_backward_input``'s result as a tuple.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from zbkit import splitgrad
from zbkit.pipeline import LocalPipeline, PipelineStage, StageError
from zbkit.schedules import build_schedule

WIDTH = 5


class Block(nn.Module):  # torch style: a Tensor in, a Tensor out
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))  # (b, WIDTH)


class Split(nn.Module):  # a tuple out: the next stage takes two positional arguments
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.lin(x)
        return torch.tanh(h), 0.5 * h  # (b, WIDTH) each


class Join(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, h: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.lin(h) + skip


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:  # torch's loss form
    return nn.functional.mse_loss(output, target)


def oracle(mods: list[nn.Module], x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """Plain autograd on a copy: the full-batch loss's gradients, in parameter order."""
    copies = copy.deepcopy(mods)
    out = x
    for m in copies:
        out = m(*out) if isinstance(out, tuple) else m(out)
    mse(out, y).backward()
    return [p.grad for m in copies for p in m.parameters()]


def assert_grads_match(mods: list[nn.Module], expected: list[torch.Tensor]) -> None:
    got = [p.grad for m in mods for p in m.parameters()]
    for g, e in zip(got, expected, strict=True):
        assert g is not None
        torch.testing.assert_close(g, e, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "zb-v"])
def test_tensor_and_tuple_returning_stages_match_autograd(name: str) -> None:
    sch = build_schedule(name, pp=2, microbatches=4)
    n = sch.num_stages
    # a tuple handed over between stages 0 and 1, Tensors after
    mods: list[nn.Module] = [Split(), Join()] + [Block() for _ in range(n - 2)]
    torch.manual_seed(0)
    x, y = torch.randn(8, WIDTH), torch.randn(8, WIDTH)
    expected = oracle(mods, x, y)
    losses: list[torch.Tensor] = [torch.tensor(7.0)]  # torch clears the list, then fills it
    got = LocalPipeline(mods, sch, mse).step(x, target=y, losses=losses)
    assert len(losses) == 4 and all(a is b for a, b in zip(losses, got, strict=True))
    assert torch.allclose(torch.stack(losses).mean(), mse(_run(mods, x), y), atol=1e-6)
    assert_grads_match(mods, expected)


def _run(mods: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    out = x
    with torch.no_grad():
        for m in mods:
            out = m(*out) if isinstance(out, tuple) else m(out)
    return out


def test_dict_stages_are_unchanged_and_loss_sees_the_module_form() -> None:
    sch = build_schedule("1f1b", pp=2, microbatches=2)
    seen = []

    class Named(nn.Module):
        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"hidden": 2 * x}

    class Tail(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(WIDTH))

        def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return hidden * self.w, hidden.sum(1)

    def loss(output: object, target: torch.Tensor) -> torch.Tensor:
        seen.append(type(output))
        assert isinstance(output, tuple) and len(output) == 2
        return nn.functional.mse_loss(output[0], target)

    stages = [PipelineStage(Named(), 0, 2), PipelineStage(Tail(), 1, 2)]
    LocalPipeline(stages, sch, loss).step(torch.randn(4, WIDTH), torch.randn(4, WIDTH))
    assert seen == [tuple, tuple]
    out = stages[0].forward(9, torch.randn(2, WIDTH))
    assert list(out) == ["hidden"]  # a dict module's outputs keep their names
    stages[0].reset()


def test_target_alias_and_its_conflict() -> None:
    sch = build_schedule("gpipe", pp=2, microbatches=2)
    pipe = LocalPipeline([Block(), Block()], sch, mse)
    x, y = torch.randn(4, WIDTH), torch.randn(4, WIDTH)
    a = pipe.step(x, targets=y)
    b = pipe.step(x, target=y)
    assert torch.equal(torch.stack(a), torch.stack(b))
    with pytest.raises(TypeError, match="both targets= and target="):
        pipe.step(x, targets=y, target=y)


def test_torch_pipeline_stage_signature() -> None:
    block = Block()
    st = PipelineStage(block, 1, 3, torch.device("cpu"))
    assert st.module is block and st.stage_index == 1 and st.num_stages == 3
    assert block.lin.weight.device.type == "cpu"
    assert PipelineStage(Block(), 0, 2, "cpu", split_first_stage=True).split_first_stage
    with pytest.raises(TypeError, match="input_args: zbkit agrees names, shapes and dtypes"):
        PipelineStage(Block(), 0, 2, "cpu", input_args=(torch.randn(2, WIDTH),))
    with pytest.raises(TypeError, match=r"group: .*ScheduleRunner\(\.\.\., group=\.\.\.\)"):
        PipelineStage(Block(), 0, 2, "cpu", group=None)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        PipelineStage(Block(), 0, 2, bogus=1)


def test_bad_module_output_names_the_forms() -> None:
    class Bad(nn.Module):
        def forward(self, x: torch.Tensor) -> list:
            return [x, 3]

    st = PipelineStage(Bad(), 0, 2)
    with pytest.raises(StageError) as err:
        st.forward(0, torch.randn(2, WIDTH))
    assert str(err.value) == (
        "stage 0 microbatch 0: a stage module must return a Tensor, a tuple of Tensors "
        "(torch's forms) or dict[str, Tensor] (zbkit's: outputs by name), got list of Tensor, int"
    )


def test_stage_backward_input_unpacks_like_torch() -> None:
    lin = nn.Linear(WIDTH, WIDTH)
    x = torch.randn(3, WIDTH, requires_grad=True)
    out = torch.tanh(lin(x))
    g = torch.randn_like(out)
    ref = copy.deepcopy(lin)
    xr = x.detach().requires_grad_()
    torch.autograd.backward(torch.tanh(ref(xr)), g)

    result = splitgrad.stage_backward_input([out], [g], [x], lin.parameters())
    grads_input, param_groups = result  # torch's (grads_input, param_groups)
    assert len(result) == 2 and result[0] is grads_input and result[1] is param_groups
    assert param_groups is result.pending_weight
    torch.testing.assert_close(grads_input[0], xr.grad)
    assert lin.weight.grad is None  # W has not run
    splitgrad.stage_backward_weight(lin.parameters(), param_groups)
    torch.testing.assert_close(lin.weight.grad, ref.weight.grad)
    torch.testing.assert_close(lin.bias.grad, ref.bias.grad)


def test_a_loss_for_the_other_form_is_named() -> None:
    sch = build_schedule("gpipe", pp=2, microbatches=2)
    pipe = LocalPipeline([Block(), Block()], sch, lambda out, y: mse(out["y"], y))
    with pytest.raises(StageError) as err:
        pipe.step(torch.randn(4, WIDTH), torch.randn(4, WIDTH))
    text = str(err.value)
    assert text.startswith("1F0: stage 1 microbatch 0: loss_fn raised TypeError: ")
    assert text.endswith(
        "It was given a Tensor: the last stage module's output as the module returns it "
        "(dict[str, Tensor], a Tensor or a tuple of Tensors)"
    )
