"""Normalisation weight halves computed in I (see _backward._EAGER_NODES).

I asks for a LayerNorm's weight gradients in the same kernel call as its input
gradient and W only delivers them; anything that would make that inexact
(hooks on the parameters, a parameter also used elsewhere, a first stage) must
fall back to the normal split. The oracle is plain autograd on a copy.
"""

import os

import pytest
import torch
from _splitgrad_oracle import compare_split_to_autograd, random_grads
from test_splitgrad_defects import D, Params, x_
from torch import nn
from torch.nn import functional as F

from zbkit.models import ResidualMLPBlock
from zbkit.splitgrad import fast_paths_available, stage_backward_input, stage_backward_weight


def require_fast_paths() -> None:
    """For tests that count what the fast paths save: skip when forced off, probe first.

    Probing here, before any counting starts, keeps the probe's own ops out of the counts.
    """
    if os.environ.get("ZBKIT_SPLITGRAD_REFERENCE", "0") not in ("", "0"):
        pytest.skip("ZBKIT_SPLITGRAD_REFERENCE forces the reference path")
    assert fast_paths_available(), "the torch in CI (2.13) must pass the fast-path probe"


class CountOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts calls of the aten ops given by name (overload packets)."""

    def __init__(self, *names: str) -> None:
        super().__init__()
        self.names = names
        self.count = dict.fromkeys(names, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.count:
            self.count[name] += 1
        return func(*args, **(kwargs or {}))


def _blocks(n: int = 2, dim: int = 8) -> nn.Module:
    return nn.Sequential(*(ResidualMLPBlock(dim) for _ in range(n))).to(D)


def test_layer_norm_backward_runs_once_and_w_only_delivers():
    require_fast_paths()
    torch.manual_seed(0)
    model = _blocks()
    params = list(model.parameters())
    x = x_(2, 3, 8)
    out = model(x)
    g = torch.randn_like(out)
    names = ("native_layer_norm_backward", "mm", "addmm")
    with CountOps(*names) as in_pass:
        res = stage_backward_input([out], [g], [x], params)
    assert all(p.grad is None for p in params)  # computed in I, still not in .grad
    with CountOps(*names) as weight_pass:
        stage_backward_weight(params, res.param_groups)
    got = [p.grad.clone() for p in params]
    model.zero_grad(set_to_none=True)
    out = model(x)
    with CountOps(*names) as plain:
        out.backward(g)
    # one LayerNorm backward per block, in I; matmuls split half and half
    assert in_pass.count == {"native_layer_norm_backward": 2, "mm": 4, "addmm": 0}
    assert weight_pass.count == {"native_layer_norm_backward": 0, "mm": 4, "addmm": 0}
    assert plain.count == {"native_layer_norm_backward": 2, "mm": 8, "addmm": 0}
    for p, want in zip(params, got, strict=True):
        torch.testing.assert_close(p.grad, want, atol=1e-12, rtol=0)


def test_layer_norm_stack_exact_in_any_microbatch_order():
    torch.manual_seed(1)
    compare_split_to_autograd(
        _blocks(3),
        lambda m, xs: [m(xs[0])],
        [[x_(2, 4, 8)] for _ in range(3)],
        "I0 I1 W1 I2 W0 W2",
        output_grads=random_grads,
    )


def test_group_norm_and_frozen_layer_norm_weight():
    # GroupNorm is eager too; a LayerNorm whose weight is frozen still hands W its bias
    torch.manual_seed(2)
    m = nn.ModuleDict({"gn": nn.GroupNorm(2, 4), "ln": nn.LayerNorm(4), "lin": nn.Linear(4, 4)})
    m = m.to(D)
    m["ln"].weight.requires_grad_(False)

    def fwd(m, xs):
        h = m["gn"](xs[0].unsqueeze(-1)).squeeze(-1)
        return [m["lin"](m["ln"](torch.tanh(h)))]

    compare_split_to_autograd(m, fwd, [[x_(3, 4)], [x_(3, 4)]], "I1 I0 W0 W1", random_grads)


def test_batch_norm_backward_runs_once_and_stays_exact():
    require_fast_paths()
    torch.manual_seed(6)
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU()).to(D)
    compare_split_to_autograd(
        m,
        lambda m, xs: [m(xs[0])],
        [[x_(2, 3, 5, 5)], [x_(2, 3, 5, 5)]],
        "I0 I1 W1 W0",
        output_grads=random_grads,
    )
    x = x_(2, 3, 5, 5)
    out = m(x)
    with CountOps("native_batch_norm_backward") as in_pass:
        res = stage_backward_input([out], [torch.randn_like(out)], [x], list(m.parameters()))
    with CountOps("native_batch_norm_backward") as weight_pass:
        stage_backward_weight(list(m.parameters()), res.pending_weight)
    # one fused call in I, as plain backward makes it; W only delivers BN's gradients
    assert in_pass.count == {"native_batch_norm_backward": 1}
    assert weight_pass.count == {"native_batch_norm_backward": 0}


def _ln_grads(ln: nn.LayerNorm, x: torch.Tensor, g: torch.Tensor) -> list[torch.Tensor]:
    """Oracle: plain autograd's gradients of sin(layer_norm(x)) for the weight and bias."""
    w = ln.weight.detach().requires_grad_()
    b = ln.bias.detach().requires_grad_()
    out = torch.sin(F.layer_norm(x.detach(), ln.normalized_shape, w, b))
    return list(torch.autograd.grad(out, [w, b], g))


def test_hooks_on_layer_norm_params_run_once_in_w():
    require_fast_paths()
    torch.manual_seed(3)
    for tensor_hook in (False, True):  # False: eager path; True: hooks force the normal split
        ln = nn.LayerNorm(5).to(D)
        seen = []
        for p in ln.parameters():
            p.register_post_accumulate_grad_hook(lambda p, seen=seen: seen.append("post"))
        if tensor_hook:  # doubles the gradient: must apply exactly once, in W
            ln.weight.register_hook(lambda g, seen=seen: seen.append("hook") or g * 2)
        x = x_(4, 5)
        g = torch.randn(4, 5, dtype=D)
        res = stage_backward_input([torch.sin(ln(x))], [g], [x], list(ln.parameters()))
        assert seen == [], "I must run no parameter hook"
        with CountOps("native_layer_norm_backward") as weight_pass:
            stage_backward_weight(list(ln.parameters()), res.param_groups)
        # eager: W only delivers; with a hook W computes the weight half itself
        assert weight_pass.count["native_layer_norm_backward"] == int(tensor_hook)
        assert sorted(seen) == ["hook"] * tensor_hook + ["post", "post"]
        gw, gb = _ln_grads(ln, x, g)
        torch.testing.assert_close(ln.weight.grad, gw * (2 if tensor_hook else 1))
        torch.testing.assert_close(ln.bias.grad, gb)


def test_layer_norm_params_also_used_elsewhere():
    # v is both weight and bias of one LayerNorm (two edges into one parameter),
    # and u is a LayerNorm weight that also scales the output: neither may be
    # captured as one edge in I; both must stay exact
    torch.manual_seed(4)
    m = Params(u=(6,), v=(6,))

    def fwd(m, xs):
        h = F.layer_norm(xs[0], (6,), m.v, m.v)
        return [F.layer_norm(torch.tanh(h), (6,), m.u) * m.u]

    compare_split_to_autograd(
        m, fwd, [[x_(3, 6)], [x_(3, 6)]], "I0 I1 W0 W1", output_grads=random_grads
    )


def test_first_stage_layer_norm():
    # inputs need no gradient: I does nothing, W computes every LayerNorm gradient
    torch.manual_seed(5)
    compare_split_to_autograd(
        _blocks(2),
        lambda m, xs: [m(xs[0])],
        [[x_(2, 3, 8, grad=False)], [x_(2, 3, 8, grad=False)]],
        "I0 I1 W1 W0",
        output_grads=random_grads,
    )
