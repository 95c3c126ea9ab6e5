"""SplitBackwardStepper driven from Python: click F, I, W; the oracle is plain autograd (and
for the graph's colours, what draw_graph's legend says each pass is drawn in)."""

from __future__ import annotations

import re

import pytest
import torch
from palette import graph_colours
from torch import nn

from zbkit.widgets import SplitBackwardStepper

COLOURS = graph_colours()  # F, I, W and dim, as draw_graph's legends show them


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.fc2 = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))  # (5, 3): not a scalar, gradient = ones


def _oracle(model: nn.Module, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    xs = x.detach().clone().requires_grad_(True)
    out = model(xs)
    *grads, gx = torch.autograd.grad(out.sum(), [*model.parameters(), xs])
    return grads, gx


def test_clicking_f_i_w_fills_grads_in_order_and_matches_autograd():
    torch.manual_seed(0)
    model = Mlp()
    x = torch.randn(5, 4)
    want_params, want_x = _oracle(model, x)
    s = SplitBackwardStepper(model, x)
    assert s.phase == "ready" and s.graph is None
    assert [b.disabled for k, b in s.buttons.items() if k != "reset"] == [False, True, True]

    s.buttons["F"].click()
    assert s.phase == "F" and all(p.grad is None for p in model.parameters())
    assert not s.buttons["I"].disabled and s.buttons["F"].disabled and s.buttons["W"].disabled
    assert len(s.analysis.groups) == 2 and "fc1.weight" in s.graph.source
    f_colours = s.graph.source.count(COLOURS["F"])

    s.buttons["I"].click()
    assert all(p.grad is None for p in model.parameters())  # I leaves every .grad alone
    assert torch.allclose(s.input_grads[0], want_x, atol=1e-6)
    table = s.table.value
    assert re.search(r"input\[0\]</td><td[^>]*>\(5, 4\)</td><td[^>]*>filled", table)
    assert table.count(">empty<") == 4 and table.count(">yes<") == 1
    i_src = s.graph.source
    assert COLOURS["I"] in i_src and COLOURS["dim"] in i_src and COLOURS["W"] not in i_src

    s.buttons["W"].click()
    for p, want in zip(model.parameters(), want_params, strict=True):
        assert torch.allclose(p.grad, want, atol=1e-6)
    assert s.table.value.count(">yes<") == 5 and ">NO<" not in s.table.value
    assert COLOURS["W"] in s.graph.source and COLOURS["I"] not in s.graph.source
    assert f_colours > 0 and "W done" in s.status.value

    # exercise 3: W again. The button stays live and the widget says why it is refused
    assert not s.buttons["W"].disabled and s.buttons["I"].disabled
    s.buttons["W"].click()
    assert s.phase == "W" and "W refused" in s.status.value
    assert "already ran" in s.refused and "already ran" in s.status.value
    for p, want in zip(model.parameters(), want_params, strict=True):
        assert torch.allclose(p.grad, want, atol=1e-6)  # nothing added twice
    assert not [o for o in s.out.outputs if o.get("output_type") == "error"]

    # F again starts over from empty .grad (the table shows one step's work)
    s.buttons["F"].click()
    assert all(p.grad is None for p in model.parameters()) and s.phase == "F"
    s.buttons["reset"].click()
    assert s.phase == "ready" and not s.buttons["F"].disabled


def test_out_of_order_steps_and_bad_inputs_are_refused_clearly():
    model = Mlp()
    s = SplitBackwardStepper(model, [torch.randn(2, 4)])
    with pytest.raises(RuntimeError, match="out of order: next is F"):
        s.step("W")
    with pytest.raises(ValueError, match="use one of F, I, W, reset"):
        s.step("B")
    with pytest.raises(TypeError, match="inputs\\[0\\] is list"):
        SplitBackwardStepper(model, [[1.0, 2.0]])


def test_a_grad_left_by_earlier_code_is_cleared_and_said_so():
    # README's order: a split backward by hand on a loss of its own, then the stepper on the
    # same module. The old .grads belong to that other loss: set against the stepper's oracle
    # they read NO in every row before anything was pressed.
    torch.manual_seed(0)
    model = Mlp()
    x = torch.randn(5, 4)
    model(x).pow(2).mean().backward()
    s = SplitBackwardStepper(model, x)
    assert all(p.grad is None for p in model.parameters())
    assert s.cleared == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert "4 parameters had a .grad from earlier code" in s.status.value
    assert ">NO<" not in s.table.value and s.table.value.count(">empty<") == 5
    for kind in "FIW":
        s.step(kind)
    assert s.table.value.count(">yes<") == 5 and ">NO<" not in s.table.value
    assert "earlier code" not in s.status.value  # said once, before the first F
    assert SplitBackwardStepper(Mlp(), x).cleared == []  # a fresh module: nothing to say
