"""The analysis cached per graph structure (_plan): reused only for the same structure.

A reused plan must give, node for node, what a fresh analysis of this graph gives
(checked on random graphs, with other graphs' plans in the cache), and gradients
must match plain autograd when the structure changes between microbatches.
"""

import gc
import threading
import weakref

import pytest
import torch
from _splitgrad_oracle import compare_split_to_autograd, random_grads
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_splitgrad_defects import D, Params, x_
from test_splitgrad_eager import require_fast_paths
from test_splitgrad_property import D as F
from test_splitgrad_property import program, run
from torch import nn

from zbkit.models import ResidualMLPBlock
from zbkit.splitgrad import (
    _plan,
    grad_node,
    reference_weight_pass,
    stage_backward_input,
    stage_backward_weight,
)
from zbkit.splitgrad._groups import find_stage_groups


@pytest.fixture(autouse=True)
def empty_cache():
    _plan.PLANS.clear()
    yield
    _plan.PLANS.clear()


def _params() -> Params:
    return Params(p0=(F, F), p1=(F, F), p2=(F, F), v=(F,), unused=(F,))


def _same_analysis(cached: _plan.BoundPlan, fresh) -> None:
    assert len(cached.groups) == len(fresh.groups)
    for a, b, ta, tb in zip(
        cached.groups, fresh.groups, cached.tensors, fresh.tensors, strict=True
    ):
        assert a.param_nodes == b.param_nodes
        assert a.intermediates == b.intermediates
        assert a.exits == b.exits
        assert a.roots == b.roots
        assert a.needs_both_directions == b.needs_both_directions
        assert [id(t) for t in ta] == [id(t) for t in tb]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs=st.lists(program, min_size=2, max_size=4), first=st.booleans(), seed=st.integers())
# the same node types in the same order, other edges (see the wiring test below)
@example(
    [
        [("scale", 1, 2), ("scale", 5, 5), ("mul", 3, 0)],
        [("mul", 3, 4), ("scale", 2, 2), ("mul", 3, 4)],
    ],
    False,
    0,
)
def test_a_reused_plan_is_what_a_fresh_analysis_finds(programs, first, seed):
    # every program twice: the second graph of each gets its plan from the cache,
    # which by then also holds the other programs' plans (same parameters, same count)
    _plan.PLANS.clear()
    torch.manual_seed(seed % 2**16)
    m = _params()
    weights = list(m.parameters())
    for prog in programs + programs:
        xs = [x_(2, F, grad=not first) for _ in range(2)]
        outs = run(prog, m, xs, [1])
        out_nodes = [grad_node(o) for o in outs]
        in_nodes = [grad_node(x) for x in xs if x.requires_grad]
        cached = _plan.analyse_cached(out_nodes, in_nodes, weights)
        _same_analysis(cached, find_stage_groups(out_nodes, in_nodes, weights))
    assert _plan.PLANS.hits >= len(programs)


def test_same_structure_reuses_the_plan_and_stays_exact():
    require_fast_paths()
    torch.manual_seed(0)
    model = nn.Sequential(ResidualMLPBlock(8), ResidualMLPBlock(8)).to(D)
    mbs = [[x_(2, 3, 8)] for _ in range(3)]
    compare_split_to_autograd(
        model, lambda m, xs: [m(xs[0])], mbs, "I0 I1 W0 I2 W2 W1", output_grads=random_grads
    )
    assert (_plan.PLANS.misses, _plan.PLANS.hits) == (1, 2)


class Branchy(nn.Module):
    """A second Linear and a tanh only when the microbatch's first value is positive."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4).to(D), nn.Linear(4, 4).to(D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)  # (3, 4)
        if x[0, 0] > 0:
            h = torch.tanh(self.b(h))
        return h * 2


def test_a_branch_taken_or_not_between_microbatches_gets_its_own_plan():
    require_fast_paths()
    torch.manual_seed(0)
    mbs = [[x_(3, 4)] for _ in range(4)]
    for k, sign in enumerate((1, -1, 1, -1)):
        mbs[k][0].data[0, 0] = sign * (1 + k)
    compare_split_to_autograd(
        Branchy(), lambda m, xs: [m(xs[0])], mbs, "I0 I1 W1 I2 W0 I3 W3 W2", random_grads
    )
    assert (_plan.PLANS.misses, _plan.PLANS.hits) == (2, 2)


def _split_then_plain(out, inputs, weights, g) -> tuple[list, list]:
    """(input grads, weight grads) from I then W, and from plain autograd."""
    want = torch.autograd.grad(out, [*inputs, *weights], g, retain_graph=True)
    for w in weights:
        w.grad = None
    res = stage_backward_input([out], [g], inputs, weights)
    stage_backward_weight(weights, res.pending_weight)
    return [*res.input_grads, *(w.grad for w in weights)], list(want)


def test_the_same_ops_wired_otherwise_do_not_share_a_plan():
    # same node types found in the same order, same input and weight positions: only
    # the edges differ. A plan that ignored them would give B two split points for v
    # (A's) and wrong gradients. (Found by search over the property test's programs.)
    require_fast_paths()
    torch.manual_seed(0)
    m = _params()
    for wiring in ("A", "B", "A", "B"):
        x0, x1 = x_(2, F), x_(2, F)
        first = x1 * m.v if wiring == "A" else x1 * x0
        out = (first * m.v) * x0
        got, want = _split_then_plain(out, [x0, x1], [m.v], torch.randn(2, F, dtype=D))
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
    assert (_plan.PLANS.misses, _plan.PLANS.hits) == (2, 2)


def test_the_same_graph_with_another_stage_input_does_not_share_a_plan():
    # which leaf is the stage input decides the input closure, so the split points
    require_fast_paths()
    torch.manual_seed(0)
    m = _params()
    for which in (0, 1, 0, 1):
        a, b = x_(2, F), x_(2, F)
        out = torch.tanh(a @ m.p0) * b
        got, want = _split_then_plain(out, [(a, b)[which]], [m.p0], torch.randn(2, F, dtype=D))
        for u, v in zip(got, want, strict=True):
            torch.testing.assert_close(u, v, atol=1e-12, rtol=1e-10)
    assert (_plan.PLANS.misses, _plan.PLANS.hits) == (2, 2)


def test_weights_in_another_order_are_another_key_and_land_right():
    require_fast_paths()
    torch.manual_seed(0)
    m = _params()
    for weights in ([m.p0, m.p1], [m.p1, m.p0]):
        x = x_(2, F)
        out = torch.tanh(x @ m.p0) @ m.p1
        got, want = _split_then_plain(out, [x], weights, torch.randn(2, F, dtype=D))
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
    assert _plan.PLANS.misses == 2


def test_a_hook_added_between_microbatches_is_seen_by_the_cached_plan():
    # LayerNorm weight halves are computed in I only for hook-free parameters; the hook
    # check is per call, so a hook added after the plan was made still applies once
    require_fast_paths()
    torch.manual_seed(0)
    block = ResidualMLPBlock(4).to(D)
    ref = ResidualMLPBlock(4).to(D)
    ref.load_state_dict(block.state_dict())
    xs = [x_(2, 4) for _ in range(2)]
    calls = []
    for k, x in enumerate(xs):
        if k == 1:
            for mod in (block, ref):
                mod.ln.weight.register_hook(lambda g: calls.append(1) or g * 3)
        out = block(x)
        g = torch.ones_like(out)
        res = stage_backward_input([out], [g], [x], list(block.parameters()))
        stage_backward_weight(list(block.parameters()), res.pending_weight)
        ref(x.detach().requires_grad_()).backward(g)
    assert len(calls) == 2  # once per model: the split ran it once, like plain autograd
    assert (_plan.PLANS.misses, _plan.PLANS.hits) == (1, 1)
    for (name, p), q in zip(block.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-12, rtol=1e-10, msg=name)


def test_the_cache_keeps_no_graph_alive_and_stays_bounded(monkeypatch):
    require_fast_paths()
    monkeypatch.setattr(_plan.PLANS, "maxsize", 3)
    torch.manual_seed(0)
    m = _params()
    alive = []
    for depth in range(1, 6):  # five structures: a chain of 1..5 tanh
        x = x_(2, F)
        u = x @ m.p0
        alive.append(weakref.ref(u))
        h = torch.sin(u)  # sin's node saves u; retain_graph below: nothing frees it early
        del u
        for _ in range(depth):
            h = torch.tanh(h)
        res = stage_backward_input([h], [torch.ones_like(h)], [x], [m.p0], retain_graph=True)
        stage_backward_weight([m.p0], res.pending_weight, retain_graph=True)
        del x, h, res
    gc.collect()
    assert [r() for r in alive] == [None] * 5, "a plan kept a graph's tensors alive"
    assert len(_plan.PLANS.plans) == 3 and _plan.PLANS.misses == 5


def test_the_reference_path_does_not_use_the_cache():
    torch.manual_seed(0)
    m = _params()
    x = x_(2, F)
    with reference_weight_pass():
        _split_then_plain(torch.tanh(x @ m.p0) @ m.p1, [x], [m.p0, m.p1], torch.ones(2, F, dtype=D))
    assert (_plan.PLANS.misses, _plan.PLANS.hits, len(_plan.PLANS.plans)) == (0, 0, 0)


def test_threads_sharing_a_small_cache_stay_exact(monkeypatch):
    # four stages in four threads, four structures, room for two plans: misses,
    # evictions and hits interleave; every thread's gradients must stay plain autograd's
    require_fast_paths()
    monkeypatch.setattr(_plan.PLANS, "maxsize", 2)
    errors = []

    def stage(depth: int) -> None:
        try:
            torch.manual_seed(depth)
            m = _params()
            for _ in range(15):
                x = x_(2, F)
                h = x @ m.p0
                for _ in range(depth):
                    h = torch.tanh(h) @ m.p1
                got, want = _split_then_plain(h, [x], [m.p0, m.p1], torch.ones(2, F, dtype=D))
                for a, b in zip(got, want, strict=True):
                    torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
        except Exception as exc:  # reported by the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=stage, args=(depth,)) for depth in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(_plan.PLANS.plans) <= 2 and _plan.PLANS.misses >= 4
