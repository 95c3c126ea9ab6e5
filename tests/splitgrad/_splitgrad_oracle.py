"""The oracle for split-backward tests: plain autograd on a deep copy of the module."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import nn

from zbkit.splitgrad import stage_backward_input, stage_backward_weight

Forward = Callable[[nn.Module, list[torch.Tensor]], list[torch.Tensor]]


def _clone_inputs(xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [x.detach().clone().requires_grad_(x.requires_grad) for x in xs]


def compare_split_to_autograd(
    module: nn.Module,
    forward: Forward,
    microbatches: Sequence[Sequence[torch.Tensor]],
    order: str = "",
    output_grads: Callable[[list[torch.Tensor]], list[torch.Tensor | None] | None] | None = None,
    atol: float = 1e-10,
) -> None:
    """Run every microbatch as I..W (in `order`, e.g. "I0 I1 W1 W0") and as plain backward.

    Compares every parameter's `.grad` and every input gradient; raises AssertionError.
    `output_grads(outputs)` gives the gradients for one microbatch (None: scalar losses).
    """
    ref = copy.deepcopy(module)
    n = len(microbatches)
    order = order or " ".join([f"I{i}" for i in range(n)] + [f"W{i}" for i in range(n)])
    grads_for: dict[int, list | None] = {}

    # oracle: one plain backward per microbatch, accumulating
    ref_input_grads = []
    for i, xs in enumerate(microbatches):
        xs = _clone_inputs(xs)
        outs = forward(ref, xs)
        torch.manual_seed(1000 + i)
        grads_for[i] = output_grads(outs) if output_grads else None
        pairs = [
            (o, g)
            for o, g in zip(outs, grads_for[i] or [None] * len(outs), strict=True)
            if o.requires_grad and (g is not None or grads_for[i] is None)
        ]
        torch.autograd.backward(
            [o for o, _ in pairs], None if grads_for[i] is None else [g for _, g in pairs]
        )
        ref_input_grads.append([x.grad for x in xs])

    params = [p for p in module.parameters() if p.requires_grad]
    pending = {}
    for step in order.split():
        kind, i = step[0], int(step[1:])
        if kind == "I":
            xs = _clone_inputs(microbatches[i])
            outs = forward(module, xs)
            before = [None if p.grad is None else p.grad.clone() for p in params]
            res = stage_backward_input(outs, grads_for[i], xs, params)
            for p, b in zip(params, before, strict=True):  # I leaves every .grad alone
                assert (p.grad is None) == (b is None) and (b is None or torch.equal(p.grad, b))
            for j, (x, g) in enumerate(zip(xs, res.input_grads, strict=True)):
                want = ref_input_grads[i][j]
                assert x.grad is None, "stage_backward_input must not touch inputs' .grad"
                if want is None:
                    assert g is None or not g.abs().any(), f"mb {i} input {j}: expected no grad"
                else:
                    assert g is not None, f"mb {i} input {j}: missing gradient"
                    torch.testing.assert_close(g, want, atol=atol, rtol=1e-7)
            pending[i] = res
        else:
            returned = stage_backward_weight(params, pending.pop(i).param_groups)
            assert all(a is b for a, b in zip(returned, (p.grad for p in params), strict=True))
    assert not pending, f"order {order!r} left I passes without W: {sorted(pending)}"

    for (name, p), q in zip(module.named_parameters(), ref.parameters(), strict=True):
        if q.grad is None:
            assert p.grad is None or not p.grad.abs().any(), f"{name}: expected no gradient"
        else:
            assert p.grad is not None, f"{name}: gradient missing after W"
            torch.testing.assert_close(p.grad, q.grad, atol=atol, rtol=1e-7, msg=name)


def random_grads(outs: list[torch.Tensor]) -> list[torch.Tensor | None]:
    return [torch.randn_like(o) for o in outs]
