"""The reference weight pass, forced, and the capability check that guards the fast paths.

Forced (ZBKIT_SPLITGRAD_REFERENCE=1 or `reference_weight_pass()`), or on a torch whose
internals the probe rejects, I and W touch no torch internal and every gradient still
equals plain `loss.backward()` on a copy of the model.
"""

import subprocess
import sys
import warnings
from contextlib import nullcontext

import pytest
import torch
from _splitgrad_oracle import compare_split_to_autograd, random_grads
from test_splitgrad_defects import D, Params, TwoOut, x_
from test_splitgrad_eager import CountOps, require_fast_paths

from zbkit.models import MLP, TiedLM, TransformerBlock
from zbkit.splitgrad import (
    PendingWeight,
    _fast,
    fast_paths_available,
    grad_node,
    reference_weight_pass,
    stage_backward_input,
    stage_backward_weight,
)


def _mlp():
    return MLP((6, 10, 10, 3)).to(D), [[x_(5, 6)], [x_(5, 6)]], lambda m, xs: [m(xs[0])]


def _transformer_block():  # LayerNorm: its weight half moves to I on the fast path only
    block = TransformerBlock(dim=8, heads=2).to(D)
    return block, [[x_(2, 3, 8)], [x_(2, 3, 8)]], lambda m, xs: [m(xs[0])]


def _tied_weights():  # the tied weight is used twice, as embedding and as projection
    lm = TiedLM(vocab=7, dim=6).to(D)

    def fwd(m, xs):
        h = torch.tanh(xs[0] @ m.embed.weight)  # (b, t, dim)
        return [h @ m.embed.weight.T]

    return lm, [[x_(2, 5, 7)], [x_(2, 5, 7)]], fwd


def _multi_output_node():  # a custom node with two outputs, each with its own gradient
    m = Params(w=(3, 3))

    def fwd(m, xs):
        a, b = TwoOut.apply(xs[0] * 1.5, m.w)
        return [a.sum(1), (b**2).sum(0)]

    return m, [[x_(4, 3)], [x_(4, 3)]], fwd


MODELS = {
    "mlp": _mlp,
    "transformer-block": _transformer_block,
    "tied-weights": _tied_weights,
    "multi-output-node": _multi_output_node,
}


@pytest.mark.parametrize("how", ["env", "context"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_forced_reference_path_matches_plain_backward(name, how, monkeypatch):
    torch.manual_seed(0)
    model, microbatches, fwd = MODELS[name]()
    if how == "env":
        monkeypatch.setenv("ZBKIT_SPLITGRAD_REFERENCE", "1")
    with reference_weight_pass() if how == "context" else nullcontext():
        assert not _fast.use_fast_paths()
        compare_split_to_autograd(model, fwd, microbatches, "I0 I1 W1 W0", random_grads)


def test_forced_reference_covers_the_layer_norm_half_in_i():
    # fast: the LayerNorm backward runs once, in I; reference: its weight half runs in W
    require_fast_paths()
    torch.manual_seed(1)
    block = TransformerBlock(dim=8, heads=2).to(D)
    params = list(block.parameters())
    counts = {}  # forced -> (LayerNorm backwards in I, in W)
    for forced in (False, True):
        x = x_(2, 3, 8)
        out = block(x)
        with reference_weight_pass() if forced else nullcontext():
            with CountOps("native_layer_norm_backward") as in_pass:
                res = stage_backward_input([out], [torch.ones_like(out)], [x], params)
            with CountOps("native_layer_norm_backward") as weight_pass:
                stage_backward_weight(params, res.pending_weight)
        counts[forced] = (*in_pass.count.values(), *weight_pass.count.values())
    assert counts == {False: (2, 0), True: (2, 2)}


def test_i_fast_then_w_forced_still_delivers_the_layer_norm_half():
    # I computed the LayerNorm weight halves; W on the reference path must deliver them
    torch.manual_seed(2)
    block = TransformerBlock(dim=8, heads=2).to(D)
    params = list(block.parameters())
    x = x_(2, 3, 8)
    g = torch.randn(2, 3, 8, dtype=D)
    res = stage_backward_input([block(x)], [g], [x], params)
    with reference_weight_pass():
        stage_backward_weight(params, res.pending_weight)
    got = [p.grad.clone() for p in params]
    block.zero_grad(set_to_none=True)
    block(x.detach().requires_grad_()).backward(g)  # the oracle
    for p, split in zip(params, got, strict=True):
        torch.testing.assert_close(split, p.grad)


def test_probe_rejects_a_torch_without_the_internals(monkeypatch):
    # as on a torch release that renamed the engine's entry point: the probe says no,
    # warns once, and the split stays exact through the reference path
    monkeypatch.delattr(torch.autograd.graph, "_engine_run_backward")
    fast_paths_available.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="reference path"):
            assert not fast_paths_available()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # cached: no second probe, no second warning
            assert not fast_paths_available()
        torch.manual_seed(3)
        model, microbatches, fwd = _transformer_block()
        compare_split_to_autograd(model, fwd, microbatches, "I0 I1 W0 W1", random_grads)
    finally:
        monkeypatch.undo()
        fast_paths_available.cache_clear()
    assert fast_paths_available()


def test_pending_weight_runs_once_and_names_what_it_wants():
    torch.manual_seed(4)
    m = Params(w=(3, 3))
    x = x_(2, 3)
    out = torch.tanh(x @ m.w)
    res = stage_backward_input([out], [torch.ones_like(out)], [x], [m.w])
    assert isinstance(res.param_groups, PendingWeight) and res.param_groups is res.pending_weight
    assert len(res.param_groups) == 1 and res.param_groups[0].params == {grad_node(m.w)}
    assert "waiting for W" in repr(res.pending_weight)
    with pytest.raises(TypeError, match="PendingWeight of one stage_backward_input"):
        stage_backward_weight([m.w], list(res.param_groups))
    with pytest.raises(AttributeError, match="PendingWeight"):
        res.param_groups[0].grads  # noqa: B018 (the old field: a clear error, not a None)
    stage_backward_weight([m.w], res.param_groups)
    assert repr(res.pending_weight) == "PendingWeight(W done)"
    with pytest.raises(RuntimeError, match="W already ran; run stage_backward_input again"):
        stage_backward_weight([m.w], res.param_groups)


def test_importing_splitgrad_imports_no_drawing():
    code = (
        "import sys, zbkit.splitgrad; "
        "print(sorted(m for m in sys.modules if m.startswith(('zbkit.viz', 'graphviz'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
