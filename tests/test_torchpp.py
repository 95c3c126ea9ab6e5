"""zbkit.torchpp: zbkit's split backward inside torch's pipelining runtime; autograd the oracle.

In one process: torch 2.13's own stage functions fail on a view output and on tied weights;
the same calls through torch's stage module under `exact_split_backward()` give exactly
what plain `loss.backward()` gives. On 2 gloo ranks (one launch): torch's ScheduleZBVZeroBubble,
ScheduleDualPipeV and ScheduleInterleavedZeroBubble on a model with both, against a
single-process backward.
"""

from __future__ import annotations

import copy
import inspect
import sys

import cloudpickle
import pytest
import torch
import torchpp_ranks
from torch import nn
from torch.distributed.pipelining import _backward as torch_backward
from torch.distributed.pipelining import stage as torch_stage

from zbkit import torchpp
from zbkit.launch import launch

TORCH_FNS = (torch_stage.stage_backward_input, torch_stage.stage_backward_weight)
VIEW_ERROR = "Can't detach views in-place"
TIED_ERROR = "Trying to backward through the graph a second time"


class Stage(nn.Module):
    """A middle stage: `out(tanh(mid(lin(x))))`, then `view` reshapes what comes out."""

    def __init__(self, tied: bool, view) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.mid = nn.Linear(6, 6), nn.Linear(6, 6)
        self.out = self.lin if tied else nn.Linear(6, 6)  # tied: one Linear used twice
        self.view = view

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.view(self.out(torch.tanh(self.mid(self.lin(x)))))  # (4, 6) -> view


VIEWS = {
    "view": lambda h: h.view(4, 2, 3),
    "slice": lambda h: h[:, :4],
    "transpose": lambda h: h.transpose(0, 1),
}
CASES = {
    **{f"{name} output": (False, view) for name, view in VIEWS.items()},
    "tied weights": (True, lambda h: h * 1),
    "tied weights, view output": (True, VIEWS["slice"]),
}


def _run(stage: nn.Module, backward_input, backward_weight, last: bool):
    """Forward, then I and W with the given functions, as torch's stage.py calls them."""
    torch.manual_seed(1)
    x = torch.randn(4, 6).requires_grad_()  # what a received activation looks like
    out = stage(x)
    if last:  # the last stage: I starts at the loss, output_grads=None
        outputs, grads = (out.pow(2).mean(),), None
    else:
        outputs, grads = (out,), (torch.randn_like(out),)
    dinputs, param_groups = backward_input(outputs, grads, [x, "a non-tensor"], stage.parameters())
    backward_weight(stage.parameters(), param_groups)
    return dinputs, outputs, grads, x


def _oracle(stage: nn.Module, outputs, grads, x) -> tuple[torch.Tensor, dict]:
    ref = copy.deepcopy(stage)
    x = x.detach().requires_grad_()
    out = ref(x)
    if grads is None:
        out.pow(2).mean().backward()
    else:
        out.backward(grads[0])
    return x.grad, {n: p.grad for n, p in ref.named_parameters()}


@pytest.mark.parametrize("last", [False, True], ids=["middle", "last"])
@pytest.mark.parametrize("case", list(CASES))
def test_torch_fails_and_the_drop_in_is_exact(case: str, last: bool) -> None:
    tied, view = CASES[case]
    # torch's own functions: views fail in I (a middle stage's outputs are detached in
    # place); tied weights fail in W (the graph is walked once per split point)
    view_fails = not last and "output" in case  # the last stage's I starts at its loss
    stage = Stage(tied, view)
    if view_fails or tied:
        with pytest.raises(RuntimeError) as info:
            _run(
                stage,
                torch_backward.stage_backward_input,
                torch_backward.stage_backward_weight,
                last,
            )
        assert (VIEW_ERROR if view_fails else TIED_ERROR) in f"{info.value} {info.value.__cause__}"

    # the drop-in, looked up where torch's stage.py looks it up
    stage = Stage(tied, view)
    with torchpp.exact_split_backward():
        dinputs, outputs, grads, x = _run(
            stage, torch_stage.stage_backward_input, torch_stage.stage_backward_weight, last
        )
    x_grad, expected = _oracle(stage, outputs, grads, x)
    assert len(dinputs) == 2 and dinputs[1] is None  # torch's shape: one per input value
    assert torch.equal(dinputs[0], x_grad)
    for name, p in stage.named_parameters():
        assert torch.equal(p.grad, expected[name]), name
    assert x.grad is None  # the gradient goes upstream in the tuple, not into .grad


def test_results_have_torchs_shapes_and_outputs_are_detached() -> None:
    stage = Stage(tied=True, view=lambda h: h * 1)
    x = torch.randn(4, 6).requires_grad_()
    out = stage(x)
    dinputs, groups = torchpp.stage_backward_input((out,), (torch.ones_like(out),), [x], [])
    assert isinstance(dinputs, tuple) and isinstance(groups, torchpp.ExactParamGroups)
    assert out.grad_fn is None  # like torch: the output stops holding the graph after I
    # a stage with parameters but no weights passed: nothing for W to do
    assert torchpp.stage_backward_weight([], groups) == ()
    assert repr(groups).startswith("ExactParamGroups(PendingWeight(")


def test_enable_disable_restore_and_refuse_nesting() -> None:
    full = torch_stage.stage_backward
    assert not torchpp.is_enabled()
    torchpp.enable()
    try:
        assert torchpp.is_enabled()
        assert torch_stage.stage_backward_input is torchpp.stage_backward_input
        assert torch_stage.stage_backward_weight is torchpp.stage_backward_weight
        assert torch_stage.stage_backward is full  # the full backward stays torch's
        with pytest.raises(RuntimeError, match="already enabled"):
            torchpp.enable()
        with pytest.raises(RuntimeError, match="already enabled"), torchpp.exact_split_backward():
            pass
        assert torchpp.is_enabled()  # a refused nesting leaves the outer one as it was
    finally:
        torchpp.disable()
    back = (torch_stage.stage_backward_input, torch_stage.stage_backward_weight)
    assert back[0] is TORCH_FNS[0] and back[1] is TORCH_FNS[1]  # torch's own, by identity
    with pytest.raises(RuntimeError, match="without enable"):
        torchpp.disable()

    with pytest.raises(ValueError, match="boom"), torchpp.exact_split_backward():
        raise ValueError("boom")  # restored on error too
    assert torch_stage.stage_backward_input is TORCH_FNS[0] and not torchpp.is_enabled()


def test_mixing_with_torchs_own_functions() -> None:
    # an I that ran under torch's function (before enable) is finished by torch's W
    stage = Stage(tied=False, view=lambda h: h * 1)
    x = torch.randn(4, 6).requires_grad_()
    out = stage(x)
    g = torch.randn_like(out)
    _, torch_groups = torch_backward.stage_backward_input((out,), (g,), [x], stage.parameters())
    with torchpp.exact_split_backward():
        torch_stage.stage_backward_weight(stage.parameters(), torch_groups)
    _, expected = _oracle(stage, (out,), (g,), x)
    for name, p in stage.named_parameters():
        torch.testing.assert_close(p.grad, expected[name])
    # the other way round cannot be finished: torch's W on zbkit's I says what to do
    out = stage(x)
    with torchpp.exact_split_backward():
        _, groups = torch_stage.stage_backward_input((out,), (g,), [x], stage.parameters())
    with pytest.raises(RuntimeError, match="keep the whole"):
        torch_stage.stage_backward_weight(stage.parameters(), groups)


def test_a_torch_whose_call_changed_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def changed(outputs, grads, inputs, weights, extra):  # a different first parameter name
        raise AssertionError("never called")

    assert list(inspect.signature(changed).parameters)[0] != "stage_outputs_or_loss"
    monkeypatch.setattr(torch_stage, "stage_backward_input", changed)
    with pytest.raises(RuntimeError, match="not patched"):
        torchpp.enable()
    assert torch_stage.stage_backward_input is changed and not torchpp.is_enabled()


@pytest.mark.multiprocess
def test_torch_schedules_on_gloo_ranks() -> None:
    cloudpickle.register_pickle_by_value(torchpp_ranks)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # in a failed case rank 0 waits 10 s for the peer that never sends; every wait that must
    # succeed gets 120 s; each case is a fresh group
    ranks = launch(torchpp_ranks.check_all, 10.0, 120.0, nprocs=2, timeout=420)
    expected = torchpp_ranks.oracle(torchpp_ranks.make_model())
    for name in torchpp_ranks.SCHEDULES:  # with the drop-in: the single-process gradients
        got = {}
        for rank in ranks:
            assert "grads" in rank[f"exact {name}"], rank[f"exact {name}"]
            got.update(rank[f"exact {name}"]["grads"])
        assert got.keys() == expected.keys(), name
        for key, grad in expected.items():
            torch.testing.assert_close(got[key], grad, rtol=1e-5, atol=1e-6, msg=key)
    for rank in ranks:  # after the with block: torch's own functions, by identity
        assert rank["restored"] == [True, True] and rank["enabled after"] is False
    # without it, torch fails where its stages are (rank 1: stages 1 and 2); rank 0 times out
    assert VIEW_ERROR in ranks[1]["torch view"]["error"]
    assert TIED_ERROR in ranks[1]["torch tied"]["error"]
    assert all("error" in ranks[0][case] for case in ("torch view", "torch tied"))
