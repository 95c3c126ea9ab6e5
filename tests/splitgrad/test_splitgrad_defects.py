"""The graphs published split-backward implementations get wrong, one test each."""

import gc
import weakref

import pytest
import torch
from _splitgrad_oracle import compare_split_to_autograd, random_grads
from torch import nn

from zbkit.splitgrad import (
    GradDirection,
    needs_direction,
    stage_backward_full,
    stage_backward_input,
    stage_backward_weight,
)

D = torch.float64


class Params(nn.Module):
    def __init__(self, **shapes):
        super().__init__()
        for name, shape in shapes.items():
            self.register_parameter(name, nn.Parameter(torch.randn(*shape, dtype=D)))


def x_(*shape, grad=True):
    return torch.randn(*shape, dtype=D, requires_grad=grad)


def test_param_used_twice_along_one_path():
    # f(x @ w) @ w: the later use reaches the earlier one through the input closure
    torch.manual_seed(0)
    m = Params(w=(4, 4))
    compare_split_to_autograd(
        m,
        lambda m, xs: [torch.tanh(xs[0] @ m.w) @ m.w],
        [[x_(3, 4)], [x_(3, 4)]],
        "I0 I1 W1 W0",
        output_grads=random_grads,
    )


def test_interleaved_shared_params_do_not_free_each_others_graph():
    # wa and wb alternate; wa's W replays the path through wb's node, which
    # must still be intact (no "backward through the graph a second time")
    torch.manual_seed(1)
    m = Params(wa=(4, 4), wb=(4, 4))

    def fwd(m, xs):
        h = torch.sin(xs[0] @ m.wa) @ m.wb
        return [torch.cos(h @ m.wa) @ m.wb]

    compare_split_to_autograd(
        m, fwd, [[x_(2, 4)], [x_(2, 4)]], "I0 I1 W0 W1", output_grads=random_grads
    )


class TwoOut(torch.autograd.Function):
    """(x @ w, sin(x) * w.sum()): two outputs, both depend on the weight."""

    calls: list = []

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w, torch.sin(x) * w.sum()

    @staticmethod
    def backward(ctx, g1, g2):
        x, w = ctx.saved_tensors
        want_x, want_w = needs_direction(GradDirection.INPUT), needs_direction(GradDirection.WEIGHT)
        TwoOut.calls.append((want_x, want_w))
        gx = gw = None
        if want_x:  # the input half
            gx = g1 @ w.T + g2 * torch.cos(x) * w.sum()
        if want_w:  # the weight half: g2 contributes through w.sum()
            gw = x.T @ g1 + (g2 * torch.sin(x)).sum()
        return gx, gw


def test_multi_output_custom_function_skipping_halves():
    torch.manual_seed(2)
    m = Params(w=(3, 3))

    def fwd(m, xs):
        a, b = TwoOut.apply(xs[0], m.w)
        return [a * 2, b + 1]

    TwoOut.calls.clear()
    compare_split_to_autograd(m, fwd, [[x_(2, 3)], [x_(2, 3)]], output_grads=random_grads)
    # oracle: 2 plain calls (both halves); split: 2 I calls (input only), 2 W calls (weight only)
    assert TwoOut.calls == [(True, True)] * 2 + [(True, False)] * 2 + [(False, True)] * 2


def test_multi_output_node_keeps_grads_per_edge():
    # the node where w joins has two outputs with different gradients; summing
    # them onto output 0 (a known bug) would be wrong here
    torch.manual_seed(3)
    m = Params(w=(3, 3))

    def fwd(m, xs):
        a, b = TwoOut.apply(xs[0] * 1.5, m.w)
        return [a.sum(1), (b**2).sum(0)]

    compare_split_to_autograd(m, fwd, [[x_(4, 3)]], output_grads=random_grads)


def test_frozen_unused_and_output_outside_input_closure():
    torch.manual_seed(4)
    m = Params(a=(3, 3), b=(3, 3), frozen=(3, 3), unused=(3,), side=(3,))
    m.frozen.requires_grad_(False)

    def fwd(m, xs):
        h = xs[0] @ m.a @ m.frozen
        # the second output does not depend on the input: W starts it from the output
        return [h @ m.b, (m.side * 2).exp(), xs[1] * 3]

    compare_split_to_autograd(m, fwd, [[x_(2, 3), x_(3, grad=False)]], output_grads=random_grads)
    assert m.frozen.grad is None and m.unused.grad is None


def test_several_inputs_outputs_and_none_output_grads():
    torch.manual_seed(5)
    m = Params(w=(4, 4), v=(4,))

    def fwd(m, xs):
        x, y, z = xs
        h = (x + y) @ m.w
        p, q = h.chunk(2, dim=1)
        return [p * m.v[:2], q + z[:, :2], h.sum()]

    def grads(outs):  # no gradient for the chunk's second half: None entry
        return [torch.randn_like(outs[0]), None, torch.ones_like(outs[2])]

    mbs = [[x_(3, 4), x_(3, 4), x_(3, 4, grad=False)]]
    compare_split_to_autograd(m, fwd, mbs, output_grads=grads)


def test_param_returned_as_output_and_first_stage_param_chain():
    torch.manual_seed(6)
    m = Params(w=(3,), u=(3, 3))
    # first stage: no input requires grad; a param is itself an output
    compare_split_to_autograd(
        m,
        lambda m, xs: [m.w, torch.tanh(xs[0] @ m.u) * m.w],
        [[x_(2, 3, grad=False)]],
        output_grads=random_grads,
    )


def test_weights_free_activations_after_w():
    # a weakref to an activation dies once W ran and the caller drops its tensors,
    # with the garbage collector off: no cycles through hooks or closures
    torch.manual_seed(7)
    m = Params(w=(5, 5))
    gc.disable()
    try:
        x = x_(4, 5)
        act = torch.sin(x @ m.w)  # saved by the next matmul
        ref = weakref.ref(act)
        out = torch.tanh(act @ m.w) @ m.w
        res = stage_backward_input([out], [torch.ones_like(out)], [x], [m.w])
        del act
        assert ref() is not None  # W still needs it
        stage_backward_weight([m.w], res.param_groups)
        # the consumed PendingWeight keeps nothing: no group, no node, no captured gradient
        assert res.pending_weight.done and len(res.param_groups) == 0
        del out
        assert ref() is None, "activation alive after W while the result is kept"
        del res
        assert ref() is None, "activation still alive after W: a reference cycle or leak"
    finally:
        gc.enable()


def test_full_backward_matches_and_keeps_input_grad():
    torch.manual_seed(8)
    m = Params(w=(3, 3))
    x = x_(2, 3)
    x.grad = torch.full_like(x, 7.0)
    nonleaf = x_(2, 3) * 1.0
    out = (x @ m.w + nonleaf).sin()
    g = torch.randn_like(out)
    gx, gn = stage_backward_full([out], [g], [x, nonleaf])
    x2, n2 = x.detach().requires_grad_(), nonleaf.detach().requires_grad_()
    w2 = m.w.detach().requires_grad_()
    ex, en, ew = torch.autograd.grad((x2 @ w2 + n2).sin(), [x2, n2, w2], g)
    torch.testing.assert_close(gx, ex)
    torch.testing.assert_close(gn, en)
    torch.testing.assert_close(m.w.grad, ew)
    assert torch.equal(x.grad, torch.full_like(x, 7.0))


def test_clear_errors():
    m = Params(w=(3, 3))
    x = x_(2, 3)
    out = x @ m.w
    with pytest.raises(ValueError, match="scalar losses"):
        stage_backward_input([out], None, [x], [m.w])
    with pytest.raises(ValueError, match="1 outputs but 2 output_grads"):
        stage_backward_input([out], [None, None], [x], [m.w])
    with pytest.raises(TypeError, match=r"inputs\[0\] must be a Tensor"):
        stage_backward_input([out], [torch.ones_like(out)], ["x"], [m.w])
    res = stage_backward_input([out], [torch.ones_like(out)], [x], [m.w])
    stage_backward_weight([m.w], res.param_groups)
    with pytest.raises(RuntimeError, match="already ran"):
        stage_backward_weight([m.w], res.param_groups)
