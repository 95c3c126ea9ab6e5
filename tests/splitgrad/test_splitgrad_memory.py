"""What the split backward frees, and when (see _free.release_saved).

I frees the tensors only it needs (a GELU's input) when it returns; W frees each
group's saved activation once that group's weight half ran. Watched with
weakrefs: a tensor whose last owner is a node's saved slot dies when the slot is
freed. The caller keeps the outputs alive throughout, so nothing dies because
the graph does: only because the split freed it.
"""

import gc
import weakref

import pytest
import torch
from _splitgrad_oracle import compare_split_to_autograd, random_grads
from test_splitgrad_defects import D, x_
from test_splitgrad_eager import CountOps, require_fast_paths
from torch import nn
from torch.nn import functional as F

from zbkit.models import ResidualMLPBlock
from zbkit.splitgrad import _plan, stage_backward_input, stage_backward_weight


class Watched:
    """Three Linear layers with GELUs between, keeping weakrefs to the activations.

    `only_i[k]` is GELU k's input (only I needs it); `for_w[k]` is Linear k+1's
    input (its weight half in W needs it). 2-d inputs: addmm saves them as they are.
    """

    def __init__(self, width: int = 4) -> None:
        torch.manual_seed(0)
        self.layers = [nn.Linear(width, width).to(D) for _ in range(3)]
        self.params = [p for layer in self.layers for p in layer.parameters()]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.only_i, self.for_w, self.nodes = [], [], []
        for layer in self.layers[:-1]:
            u = layer(x)  # (rows, width)
            self.nodes.append(u.grad_fn)
            x = F.gelu(u)  # gelu's node saves u
            self.only_i.append(weakref.ref(u))
            self.for_w.append(weakref.ref(x))
            del u
        return self.layers[-1](x)


def _alive(refs) -> list[bool]:
    return [r() is not None for r in refs]


def test_tensors_only_i_needs_are_gone_when_i_returns():
    require_fast_paths()
    model = Watched()
    x = x_(5, 4)
    out = model.forward(x)
    gc.disable()  # nothing may depend on the cycle collector
    try:
        res = stage_backward_input([out], [torch.ones_like(out)], [x], model.params)
        assert _alive(model.only_i) == [False, False], "a GELU input outlived I"
        assert _alive(model.for_w) == [True, True], "I freed what W needs"
        stage_backward_weight(model.params, res.pending_weight)
        assert _alive(model.for_w) == [False, False], "a saved activation outlived W"
        assert out.grad_fn is not None  # the caller still holds the graph: the split freed them
    finally:
        gc.enable()


def test_big_tensors_only_i_needs_go_as_soon_as_their_node_ran():
    # watched from inside I, when Linear 1's node is about to run: GELU 1 has run, GELU 0
    # not yet. A big GELU input (512 KiB, >= EARLY_BYTES) is gone by then, so the
    # gradients I keeps for W can reuse its memory; a small one waits for I's end. The
    # gradients stay autograd's (oracle: plain backward on a copy of the model)
    require_fast_paths()
    for rows, width, early in ((5, 4, False), (256, 512, True)):
        model = Watched(width)
        x = x_(rows, width)
        out = model.forward(x)
        seen: list = []

        def watch(_grads, seen=seen, refs=model.only_i):
            seen.append(_alive(refs))

        handle = model.nodes[1].register_prehook(watch)
        g = torch.randn_like(out)
        res = stage_backward_input([out], [g], [x], model.params)
        handle.remove()
        assert seen == [[True, not early]], (rows, width)
        assert _alive(model.only_i) == [False, False]
        stage_backward_weight(model.params, res.pending_weight)
        # Watched re-seeds: a second instance has the same weights
        oracle = Watched(width)
        want = torch.autograd.grad(oracle.forward(x), oracle.params, g)
        for p, w in zip(model.params, want, strict=True):
            torch.testing.assert_close(p.grad, w)
        assert res.input_grads[0] is not None


def test_w_frees_each_groups_saved_tensors_when_that_group_is_done():
    require_fast_paths()
    model = Watched()
    x = x_(5, 4)
    out = model.forward(x)
    res = stage_backward_input([out], [torch.ones_like(out)], [x], model.params)
    seen = []

    class Watch(CountOps):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ == "mm":  # one weight half per Linear
                seen.append(_alive(model.for_w))
            return func(*args, **(kwargs or {}))

    with Watch("mm"):
        stage_backward_weight(model.params, res.pending_weight)
    # groups run in parameter order: Linear 0 (input x), 1 (for_w[0]), 2 (for_w[1]);
    # for_w[0] is gone before Linear 2's weight half runs, for_w[1] once W ends
    assert seen == [[True, True], [True, True], [False, True]]
    assert _alive(model.for_w) == [False, False]


def test_retain_graph_keeps_what_only_i_needs():
    require_fast_paths()
    model = Watched()
    x = x_(5, 4)
    out = model.forward(x)
    g = torch.ones_like(out)
    res = stage_backward_input([out], [g], [x], model.params, retain_graph=True)
    assert _alive(model.only_i) == [True, True]
    stage_backward_weight(model.params, res.pending_weight, retain_graph=True)
    assert _alive(model.for_w) == [True, True]
    out.backward(g)  # the whole graph is still there


def test_freed_tensor_names_the_fix_when_asked_for_again():
    require_fast_paths()
    model = Watched()
    x = x_(5, 4)
    out = model.forward(x)
    g = torch.ones_like(out)
    res = stage_backward_input([out], [g], [x], model.params)
    stage_backward_weight(model.params, res.pending_weight)
    try:
        out.backward(g)
    except RuntimeError as exc:
        assert "retain_graph=True to stage_backward_input" in str(exc)
    else:
        raise AssertionError("a backward through freed tensors must raise")


def test_forward_under_saved_tensor_hooks_is_left_alone_and_exact():
    # zbkit.pipeline counts a stage's saved bytes with saved_tensors_hooks on its
    # first forward: those saved tensors belong to the hooks, the split must not touch them
    torch.manual_seed(1)
    blocks = nn.Sequential(*(ResidualMLPBlock(8) for _ in range(2))).to(D)

    def fwd(m, xs):
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            return [m(xs[0])]

    compare_split_to_autograd(
        blocks, fwd, [[x_(2, 3, 8)], [x_(2, 3, 8)]], "I0 I1 W1 W0", output_grads=random_grads
    )


def test_parameter_slots_are_left_alone_and_activation_slots_freed():
    # dropping a saved parameter (a LayerNorm's weight) or a view of one (a Linear's
    # weight.t()) frees nothing, the module holds it: only activations get the hooks
    require_fast_paths()
    torch.manual_seed(0)
    block = ResidualMLPBlock(4).to(D)
    x = x_(2, 4)
    out = block(x)
    down = out.grad_fn.next_functions[1][0]  # x + down(...): AddBackward -> AddmmBackward
    ln = down.next_functions[1][0].next_functions[0][0].next_functions[1][0]  # gelu, up, ln
    assert (down.name(), ln.name()) == ("AddmmBackward0", "NativeLayerNormBackward0")
    params = list(block.parameters())
    res = stage_backward_input([out], [torch.ones_like(out)], [x], params)
    hooked = {n: getattr(ln, f"_raw_saved_{n}").unpack_hook is not None for n in ("weight", "bias")}
    assert hooked == {"weight": False, "bias": False}
    assert ln._raw_saved_input.unpack_hook is not None  # I freed the LayerNorm's input
    stage_backward_weight(params, res.pending_weight)
    assert down._raw_saved_mat2.unpack_hook is None  # weight.t(): left alone
    assert down._raw_saved_mat1.unpack_hook is not None  # the GELU output: freed after W


@pytest.mark.parametrize("order", [(False, True, False), (True, False, False)])
def test_what_to_free_is_learned_once_per_structure_and_still_checked_per_graph(order):
    # the plan keeps, per node position, which saved tensors to free (learned from the
    # first plain graph of a structure). A graph whose forward ran under saved_tensors_hooks
    # (its slots already hooked) must be left alone, exact (oracle: plain backward), and the
    # plain graphs freed all the same. The hooked one may come first: zbkit.pipeline counts
    # what a stage's first forward saves with hooks, and a plan learned from it freed
    # nothing after (found by the planner: a GELU's input kept per microbatch)
    require_fast_paths()
    _plan.PLANS.clear()  # the first graph of this structure is the one in `order`
    for hooked in order:
        model = Watched(width=8)
        x = x_(5, 8)
        if hooked:
            with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
                out = model.forward(x)
        else:
            out = model.forward(x)
        g = torch.randn_like(out)
        res = stage_backward_input([out], [g], [x], model.params)
        assert _alive(model.only_i) == [hooked, hooked], "I kept what only I needs"
        stage_backward_weight(model.params, res.pending_weight)
        # the hooks' packed tensors keep them alive; otherwise the split freed them all
        assert _alive(model.only_i + model.for_w) == [hooked] * 4
        oracle = Watched(width=8)
        want = torch.autograd.grad(oracle.forward(x), oracle.params, g)
        for p, w in zip(model.params, want, strict=True):
            torch.testing.assert_close(p.grad, w)
