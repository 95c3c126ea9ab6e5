"""check_split: I then W checked against one whole backward on real data; autograd the oracle.

The wrong graph here is a custom autograd Function that keeps a running sum of its weight
gradient on `ctx` and returns the sum: right the first time its backward runs, k times too
large the k-th. A plain `loss.backward()` runs it once; a split runs it in I and again in W,
so the split is silently wrong, and `check_split` says so, naming the parameter. The same
check on clean stages changes no gradient, leaves nothing behind and runs once per stage and
input shape. All in one process: LocalPipeline, zbkit's ScheduleRunner and torch's
ScheduleZBVZeroBubble (through zbkit.torchpp) on a one-rank gloo world, and splitgrad's own
`stage_backward_input(check=True)`.
"""

from __future__ import annotations

import copy
import gc
import re
import weakref

import pytest
import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage as TorchStage
from torch.distributed.pipelining import ScheduleZBVZeroBubble

from zbkit import torchpp
from zbkit.pipeline import LocalPipeline, PipelineStage, ScheduleRunner, StageError
from zbkit.schedules import Schedule, build_schedule
from zbkit.splitgrad import (
    GradDirection,
    SplitMismatch,
    needs_direction,
    stage_backward_input,
    stage_backward_weight,
)

WIDTH, M = 6, 4  # features; microbatches per step


class Accumulating(torch.autograd.Function):
    """`x @ w.T` whose backward adds its gradient of one half (`half`: "weight" or "input")
    to a sum kept on ctx and returns the sum: the k-th backward is k times too large."""

    @staticmethod
    def forward(ctx, x, w, half):
        ctx.save_for_backward(x, w)
        ctx.half, ctx.total = half, 0  # the state a backward should never keep
        return x @ w.T  # (b, out)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx, gw = g @ w, g.T @ x  # (b, in), (out, in)
        if ctx.half == "weight":
            ctx.total = gw = ctx.total + gw
        else:
            ctx.total = gx = ctx.total + gx
        return gx, gw, None


class Logged(torch.autograd.Function):
    """`x @ w.T`, exact; each backward logs (which forward, whether it wanted both halves):
    a whole backward wants both, the split's I only the input half and W only the weight's."""

    @staticmethod
    def forward(ctx, x, w, log):
        ctx.save_for_backward(x, w)
        ctx.log, ctx.index = log, log["forwards"]
        log["forwards"] += 1
        return x @ w.T  # (b, out)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        whole = needs_direction(GradDirection.INPUT) and needs_direction(GradDirection.WEIGHT)
        ctx.log["backwards"].append((ctx.index, whole))
        return g @ w, g.T @ x, None


class FnLinear(nn.Module):
    """A bias-free Linear computed by a custom Function: `fn.apply(x, weight, extra)`."""

    def __init__(self, fn: type[torch.autograd.Function], extra: object) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(WIDTH, WIDTH) / WIDTH**0.5)
        self.fn, self.extra = fn, extra

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn.apply(x, self.weight, self.extra)


class First(nn.Module):
    """Stage 0, zbkit's form: its output travels by name, as `h`."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"h": torch.tanh(self.lin(x))}


class Head(nn.Module):
    """The last stage: `tanh(lin(h)) + out(h)`, `lin` the Function under test."""

    def __init__(self, lin: nn.Module) -> None:
        super().__init__()
        self.lin, self.out = lin, nn.Linear(WIDTH, WIDTH)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(h)) + self.out(h)


def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (out - target).pow(2).mean()


def batch(rows: int = 2 * M, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, WIDTH, generator=g), torch.randn(rows, WIDTH, generator=g)


def stateful(half: str = "weight", first: nn.Module | None = None) -> list[nn.Module]:
    torch.manual_seed(0)
    return [first or First(), Head(FnLinear(Accumulating, half))]


def chain(mods: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    h = x
    for mod in mods:
        h = mod(**h) if isinstance(h, dict) else mod(h)
    return h


def mean_loss(mods: list[nn.Module], x, y, m: int = M) -> torch.Tensor:
    """The mean of the m microbatch losses: what a pipeline step's gradients are of."""
    pairs = zip(x.tensor_split(m), y.tensor_split(m), strict=True)
    return sum(mse(chain(mods, xs), ys) for xs, ys in pairs) / m


def oracle(mods: list[nn.Module], x, y, m: int = M) -> dict[str, torch.Tensor]:
    """Plain autograd on a copy: one backward of the mean microbatch loss."""
    mods = copy.deepcopy(mods)
    mean_loss(mods, x, y, m).backward()
    return grads(mods)


def grads(mods: list[nn.Module]) -> dict[str, torch.Tensor]:
    return {f"{s}.{n}": p.grad for s, mod in enumerate(mods) for n, p in mod.named_parameters()}


def zb_h1() -> Schedule:
    return build_schedule("zb-h1", pp=2, microbatches=M)


# ---------------------------------------------------------------- LocalPipeline


def test_a_stateful_function_is_silently_wrong_and_check_split_names_it() -> None:
    x, y = batch()
    mods = stateful()
    expected = oracle(mods, x, y)
    # the failure: the split runs the backward twice (I, then W), the second gives twice the
    # weight gradient; the step raises nothing
    LocalPipeline(mods, zb_h1(), mse).step(x, target=y)
    got = grads(mods)
    torch.testing.assert_close(got["1.lin.weight"], 2 * expected["1.lin.weight"])
    for name in expected.keys() - {"1.lin.weight"}:  # the input gradients were right
        torch.testing.assert_close(got[name], expected[name], msg=name)

    # the check: the stage, the microbatch, the parameter and how far off, in the message
    mods = stateful()
    pipe = LocalPipeline(mods, zb_h1(), mse, check_split=True)
    with pytest.raises(StageError) as info:
        pipe.step(x, target=y)
    text = str(info.value)
    assert text.startswith("stage 1 microbatch 0: check_split: the split backward's weight")
    cause = info.value.__cause__
    assert isinstance(cause, SplitMismatch) and cause.what == "weight"
    (d,) = cause.differences  # lin.weight only: the Linear next to it is split exactly
    assert f"lin.weight: max |split - whole| = {d.error:.3g} (of {d.scale:.3g})" in text
    # the whole backward ran it first, I second, W third: W gave 3x the whole's gradient
    assert d.error == pytest.approx(2 / 3 * d.scale, rel=1e-5) and d.shape == (WIDTH, WIDTH)
    assert "<-- ERROR HERE" in "\n".join(info.value.__notes__)  # the grid, failing cell marked
    for st in pipe.stages:  # a failed step leaves no graph behind
        assert st.held_activations == 0 and st.held_weight_state == 0


def test_check_split_names_the_stage_input_whose_gradient_differs() -> None:
    # a Function whose *input* gradient grows: the check's whole backward ran it first, so
    # I (its second run) differs, and the input is named as it travels between stages, `h`
    x, y = batch()
    with pytest.raises(StageError, match=r"microbatch 0: .* input gradients .*: h: max \|split"):
        LocalPipeline(stateful("input"), zb_h1(), mse, check_split=True).step(x, target=y)


def clean_stages(n: int) -> list[nn.Module]:
    torch.manual_seed(0)
    return [  # LayerNorm: a weight gradient the fast path computes in I
        nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH), nn.Tanh()) for _ in range(n)
    ]


def outputs_of_linears(mods: list[nn.Module], seen: list[weakref.ref]) -> list:
    """Hooks recording each stage's first Linear's outputs (LayerNorm saves them)."""
    return [m[0].register_forward_hook(lambda mod, i, o: seen.append(weakref.ref(o))) for m in mods]


@pytest.mark.parametrize("name,pp", [("zb-h1", 2), ("zb-v", 2)])
def test_clean_stages_train_as_plain_backward_and_leave_nothing(name: str, pp: int) -> None:
    sch = build_schedule(name, pp=pp, microbatches=M)
    mods = clean_stages(sch.num_stages)
    twin = LocalPipeline(copy.deepcopy(mods), sch, mse)  # the same, unchecked
    x, y = batch()
    expected = oracle(mods, x, y)
    pipe = LocalPipeline(mods, sch, mse, check_split=True)
    seen: list[weakref.ref] = []
    hooks = outputs_of_linears(mods, seen)
    pipe.step(x, target=y)
    for h in hooks:
        h.remove()
    twin.step(x, target=y)
    got = {k: v.clone() for k, v in grads(mods).items()}  # .grad itself accumulates below
    plain = grads([st.module for st in twin.stages])
    for key, want in expected.items():
        torch.testing.assert_close(got[key], want, rtol=1e-5, atol=1e-6, msg=key)
        assert torch.equal(got[key], plain[key]), key  # the check changes no gradient
    gc.collect()  # the whole backward kept the graph (retain_graph): it must still be freed
    assert len(seen) == M * sch.num_stages
    assert all(r() is None for r in seen), "a checked step's activations outlived it"
    for st in pipe.stages:
        assert st.held_activations == 0 and st.held_weight_state == 0
        st.assert_clean()
    # nothing stays hooked on the parameters: a plain backward now adds exactly the oracle
    mean_loss(mods, x, y).backward()
    for key, now in grads(mods).items():
        torch.testing.assert_close(now, got[key] + expected[key], msg=key)


def test_a_stages_first_forward_of_a_shape_is_freed_too() -> None:
    mods = clean_stages(2)
    seen: list[weakref.ref] = []
    hooks = outputs_of_linears(mods, seen)
    LocalPipeline(mods, zb_h1(), mse).step(*batch())
    for h in hooks:
        h.remove()
    gc.collect()
    assert len(seen) == 2 * M
    assert all(r() is None for r in seen), "stage 1 microbatch 0's activations outlived the step"


def test_the_check_runs_once_per_stage_and_input_shape() -> None:
    def whole_backwards(check_split: bool) -> tuple[list[list[int]], list[int]]:
        log: dict = {"forwards": 0, "backwards": []}
        torch.manual_seed(0)
        mods = [First(), Head(FnLinear(Logged, log))]
        pipe = LocalPipeline(mods, zb_h1(), mse, check_split=check_split)
        wholes, calls = [], []
        for rows in (8, 8, 12, 12):  # two steps, then a new microbatch shape, twice
            log["backwards"].clear()
            first = log["forwards"]
            pipe.step(*batch(rows))
            wholes.append([i - first for i, whole in log["backwards"] if whole])
            calls.append(len(log["backwards"]))
        return wholes, calls

    # without the check: no whole backward, the split runs each microbatch's twice (I, W)
    assert whole_backwards(False) == ([[], [], [], []], [2 * M] * 4)
    # with it: microbatch 0 of the first step of each shape, one more backward each
    assert whole_backwards(True) == ([[0], [], [0], []], [2 * M + 1, 2 * M, 2 * M + 1, 2 * M])


# ---------------------------------------------------------------- one gloo rank: torch, zbkit


def torch_zbv(mods: list[nn.Module]) -> ScheduleZBVZeroBubble:
    stages = [TorchStage(mod, i, len(mods), torch.device("cpu")) for i, mod in enumerate(mods)]
    return ScheduleZBVZeroBubble(stages, M, loss_fn=mse)


def tensor_first() -> nn.Module:  # torch's stages pass Tensors, not dicts
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())


def test_torchpp_check_split_on_torchs_zero_bubble_v(gloo_world) -> None:
    x, y = batch()
    # clean: the same gradients as plain backward, checked
    torch.manual_seed(0)
    mods = [tensor_first(), Head(nn.Linear(WIDTH, WIDTH, bias=False))]
    expected = oracle(mods, x, y)
    with torchpp.exact_split_backward(check_split=True):
        torch_zbv(mods).step(x, target=y)
    for key, want in grads(mods).items():
        torch.testing.assert_close(want, expected[key], rtol=1e-5, atol=1e-6, msg=key)

    # stateful: silently 2x without the check, SplitMismatch with it
    mods = stateful(first=tensor_first())
    expected = oracle(mods, x, y)
    with torchpp.exact_split_backward():
        torch_zbv(mods).step(x, target=y)
    torch.testing.assert_close(grads(mods)["1.lin.weight"], 2 * expected["1.lin.weight"])
    mods = stateful(first=tensor_first())
    with pytest.raises(SplitMismatch) as info, torchpp.exact_split_backward(check_split=True):
        torch_zbv(mods).step(x, target=y)
    assert not torchpp.is_enabled()  # torch's own functions are back after the failure
    (d,) = info.value.differences
    # torch hands over parameters, not names: the weight is named by position and shape
    # (Head's requires-grad parameters: lin.weight, out.weight, out.bias)
    assert (d.label, d.shape) == ("weights[0]", (WIDTH, WIDTH))
    assert f"weights[0] [{WIDTH}, {WIDTH}]: max |split - whole| = {d.error:.3g}" in str(info.value)
    names = [n for n, _ in mods[1].named_parameters()]
    assert f"lin.weight: max |split - whole| = {d.error:.3g}" in info.value.explain(names)


def test_schedule_runner_check_split_on_one_rank(gloo_world) -> None:
    x, y = batch()
    sch = build_schedule("zb-v", pp=1, microbatches=M)  # rank 0 holds stages 0 and 1
    stages = [PipelineStage(m, i, 2) for i, m in enumerate(stateful())]
    with pytest.raises(StageError, match=r"stage 1 microbatch 0: .*lin\.weight: max \|split"):
        ScheduleRunner(sch, stages, mse, check_split=True).step(x, target=y)


# ---------------------------------------------------------------- splitgrad's own API


def _graph(half: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`Accumulating(x, w) + b` on one microbatch: the module, x, the output, its gradient."""
    torch.manual_seed(3)
    mod = nn.Module()
    mod.bias, mod.lin = nn.Parameter(torch.randn(WIDTH)), FnLinear(Accumulating, half)
    x = torch.randn(4, WIDTH, requires_grad=True)
    out = mod.lin(x) + mod.bias  # (4, WIDTH)
    return mod, x, out, torch.randn_like(out)


def _plain(half: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    mod, x, out, g = _graph(half)
    out.backward(g)
    return x.grad, {n: p.grad for n, p in mod.named_parameters()}


def test_stage_backward_weight_raises_naming_the_weight() -> None:
    x_grad, expected = _plain("weight")
    mod, x, out, g = _graph("weight")
    weights = list(mod.parameters())  # bias, lin.weight
    names = [n for n, _ in mod.named_parameters()]
    result = stage_backward_input([out], [g], [x], weights, check=True)
    assert all(w.grad is None for w in weights)  # the whole backward left .grad alone
    torch.testing.assert_close(result.input_grads[0], x_grad)  # I's half is right
    with pytest.raises(SplitMismatch) as info:
        stage_backward_weight(weights, result.pending_weight)
    exc = info.value
    (d,) = exc.differences  # the bias is split exactly: only the weight differs
    assert (exc.what, d.label, d.index, d.shape) == ("weight", "weights[1]", 1, (WIDTH, WIDTH))
    whole = expected["lin.weight"].abs().max().item()  # W, its third run, gave 3x
    assert d.error == pytest.approx(2 * whole, rel=1e-5)
    assert d.scale == pytest.approx(3 * whole, rel=1e-5)
    assert f"weights[1] [{WIDTH}, {WIDTH}]: max |split - whole|" in str(exc)
    text = exc.explain(names)
    assert f"lin.weight: max |split - whole| = {d.error:.3g} (of {d.scale:.3g})" in text
    assert "bias" not in text and "weights[1]" not in text


def test_stage_backward_input_raises_on_the_input_gradient() -> None:
    x_grad, expected = _plain("input")
    mod, x, out, g = _graph("input")
    with pytest.raises(SplitMismatch) as info:
        stage_backward_input([out], [g], [x], list(mod.parameters()), check=True)
    (d,) = info.value.differences
    assert (info.value.what, d.label, d.shape) == ("input", "inputs[0]", (4, WIDTH))
    assert d.error == pytest.approx(x_grad.abs().max().item(), rel=1e-5)  # I gave 2x
    assert re.search(r"^check_split: .* input gradients .*: h: max", info.value.explain(["h"]))
    # the check is strict: unchecked, I is this backward's first run and W uses only the
    # weight half, so the split happens to be right; the check still refuses the Function
    mod, x, out, g = _graph("input")
    result = stage_backward_input([out], [g], [x], list(mod.parameters()))
    stage_backward_weight(list(mod.parameters()), result.pending_weight)
    torch.testing.assert_close(result.input_grads[0], x_grad)
    for n, p in mod.named_parameters():
        torch.testing.assert_close(p.grad, expected[n], msg=n)


def test_a_clean_graph_checks_silently_and_exactly() -> None:
    torch.manual_seed(4)
    w = nn.Parameter(torch.randn(WIDTH, WIDTH))
    x = torch.randn(4, WIDTH, requires_grad=True)
    g = torch.randn(4, WIDTH)
    torch.tanh(x @ w.T).backward(g)
    x_grad, w_grad = x.grad, w.grad
    w.grad = None
    result = stage_backward_input([torch.tanh(x @ w.T)], [g], [x], [w], check=True)
    stage_backward_weight([w], result.pending_weight)
    assert torch.equal(result.input_grads[0], x_grad) and torch.equal(w.grad, w_grad)


def test_a_grad_already_holding_earlier_microbatches_is_no_mismatch() -> None:
    # float16, .grad holding 8 earlier microbatches' gradients (gradient accumulation over
    # steps, the first of a new shape): the split adds bitwise what a plain backward adds
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(16, 16).half())
    x = torch.randn(8, 16).half().requires_grad_()
    g = torch.randn(8, 16).half()
    torch.tanh(x @ w.T).backward(g)
    earlier = 8 * w.grad
    w.grad = earlier.clone()
    torch.tanh(x @ w.T).backward(g)
    plain, w.grad = w.grad, earlier.clone()
    result = stage_backward_input([torch.tanh(x @ w.T)], [g], [x], [w])
    stage_backward_weight([w], result.pending_weight)
    assert torch.equal(w.grad, plain)  # unchecked: exact
    w.grad = earlier.clone()
    result = stage_backward_input([torch.tanh(x @ w.T)], [g], [x], [w], check=True)
    stage_backward_weight([w], result.pending_weight)  # raises SplitMismatch
