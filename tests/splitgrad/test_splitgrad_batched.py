"""The batched weight pass: hooks, broadcasting, repeated edges, memory."""

import gc
import weakref

import torch
from _splitgrad_oracle import compare_split_to_autograd, random_grads
from test_splitgrad_defects import Params, x_
from torch import nn

from zbkit.models import MLP
from zbkit.splitgrad import fast_paths_available, stage_backward_input, stage_backward_weight


def test_param_hooks_see_the_real_gradient_once():
    torch.manual_seed(0)
    lin = nn.Linear(3, 4).double()
    seen = []
    handles = [p.register_hook(lambda g: seen.append(g.clone())) for p in lin.parameters()]
    x = x_(5, 3)
    out = torch.tanh(lin(x))
    g = torch.randn_like(out)
    res = stage_backward_input([out], [g], [x], list(lin.parameters()))
    assert seen == []  # I computes no weight gradient
    stage_backward_weight(list(lin.parameters()), res.param_groups)
    for h in handles:
        h.remove()
    x2 = x.detach().requires_grad_()
    gw, gb = torch.autograd.grad(torch.tanh(lin(x2)), [lin.weight, lin.bias], g)
    assert len(seen) == 2
    by_shape = {tuple(g.shape): g for g in seen}
    torch.testing.assert_close(by_shape[(4, 3)], gw)
    torch.testing.assert_close(by_shape[(4,)], gb)  # reduced from (5, 4) like autograd does


def test_same_weight_twice_in_one_node():
    torch.manual_seed(1)
    m = Params(v=(4,))
    compare_split_to_autograd(
        m,
        lambda m, xs: [torch.addcmul(xs[0], m.v, m.v) * xs[0]],
        [[x_(3, 4)], [x_(3, 4)]],
        "I0 I1 W1 W0",
        output_grads=random_grads,
    )


def test_mlp_activations_die_after_w_without_gc():
    torch.manual_seed(2)
    mlp = MLP((4, 8, 8, 2)).double()
    params = list(mlp.parameters())
    gc.disable()
    try:
        x = x_(3, 4)
        hidden = mlp.net[0](x)
        ref = weakref.ref(hidden)
        out = mlp.net[2](mlp.net[1](hidden))
        out = mlp.net[4](mlp.net[3](out))
        res = stage_backward_input([out], [torch.ones_like(out)], [x], params)
        del hidden
        stage_backward_weight(params, res.param_groups)
        del out, res
        assert ref() is None, "an activation outlived W: something still holds the graph"
    finally:
        gc.enable()


def test_retain_graph_allows_plain_backward_afterwards():
    torch.manual_seed(3)
    mlp = MLP((4, 6, 2)).double()
    params = list(mlp.parameters())
    x = x_(3, 4)
    out = mlp(x)
    g = torch.randn_like(out)
    res = stage_backward_input([out], [g], [x], params, retain_graph=True)
    stage_backward_weight(params, res.param_groups, retain_graph=True)
    first = [p.grad.clone() for p in params]
    out.backward(g)  # the graph is still there: every gradient doubles
    for p, f in zip(params, first, strict=True):
        torch.testing.assert_close(p.grad, 2 * f)


class Scale(torch.autograd.Function):
    """y = x * w elementwise, as a custom Function (so W takes the engine path)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, (g * x).sum(0)


def test_tensor_hook_that_changes_a_gradient_applies_once():
    # a hook on an activation doubles its gradient; W must not apply it again
    torch.manual_seed(4)
    m = Params(w=(3, 3), v=(3,))

    def fwd(m, xs):
        h = xs[0] @ m.w  # made by a built-in node: batched W
        h.register_hook(lambda g: g * 2)
        k = Scale.apply(torch.sin(h), m.v)  # made by a custom Function: engine-path W
        k.register_hook(lambda g: g * 3)
        return [k.tanh()]

    compare_split_to_autograd(m, fwd, [[x_(2, 3)], [x_(2, 3)]], output_grads=random_grads)


class CountMatmuls(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm):
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_each_pass_does_only_its_half_of_the_matmuls():
    # 3 Linear layers: plain backward does 6 matmuls (input and weight side each);
    # I must do the 3 input-side ones, W the 3 weight-side ones, nothing twice
    # (true of the reference path too) probe the fast paths now: its Linear must not be counted
    fast_paths_available()
    torch.manual_seed(5)
    mlp = MLP((4, 6, 6, 2)).double()
    params = list(mlp.parameters())
    x = x_(3, 4)
    out = mlp(x)
    g = torch.randn_like(out)
    with CountMatmuls() as in_pass:
        res = stage_backward_input([out], [g], [x], params)
    with CountMatmuls() as weight_pass:
        stage_backward_weight(params, res.param_groups)
    out = mlp(x)
    with CountMatmuls() as plain:
        out.backward(g)
    assert (in_pass.count, weight_pass.count, plain.count) == (3, 3, 6)
