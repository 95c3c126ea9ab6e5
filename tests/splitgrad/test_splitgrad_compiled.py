"""torch.compile regions: zbkit never runs a compiled backward twice; autograd is the oracle.

A split backward runs the split points twice (I, then W from what I captured). A compiled
region's backward is one opaque call returning input and weight gradients together: two calls
reuse (or have donated) its buffers and were seen to give wrong weight gradients (pytorch
issue 161904, issue 32). What torch's split (two engine calls) does is counted here on the
compiled node itself; zbkit's I runs that stage whole, once, and its gradients are plain
`loss.backward()`'s: on splitgrad's functions, and in zb-v and dualpipev pipelines of HF
Llama decoder layers compiled with inductor.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from zbkit import splitgrad
from zbkit.pipeline import LocalPipeline
from zbkit.schedules import build_schedule

transformers = pytest.importorskip("transformers")  # a [dev] dependency: always there in CI
from transformers import LlamaConfig  # noqa: E402
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaDecoderLayer,
    LlamaRotaryEmbedding,
)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8), nn.LayerNorm(8))


def _compiled_nodes(root: torch.autograd.graph.Node) -> list:
    seen, stack, found = set(), [root], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == "CompiledFunctionBackward":
            found.append(node)
        stack += [n for n, _ in node.next_functions]
    return found


def _count_runs(node) -> list[int]:
    runs = [0]

    def count(grad_outputs):
        runs[0] += 1

    node.register_prehook(count)
    return runs


def test_torchs_two_calls_run_the_compiled_backward_twice_zbkits_split_once() -> None:
    mlp = _mlp()
    compiled = torch.compile(mlp, backend="aot_eager")
    x = torch.randn(4, 8, requires_grad=True)

    # what torch's split does: the input gradient (graph kept), then the weights'
    loss = compiled(x).square().sum()
    (node,) = _compiled_nodes(loss.grad_fn)
    runs = _count_runs(node)
    torch.autograd.grad(loss, [x], retain_graph=True)
    torch.autograd.grad(loss, list(mlp.parameters()))
    assert runs[0] == 2

    # zbkit's I then W: once, and the gradients are one backward's
    loss = compiled(x).square().sum()
    (node,) = _compiled_nodes(loss.grad_fn)
    runs = _count_runs(node)
    with pytest.warns(splitgrad.WholeBackwardWarning, match="torch.compile region"):
        result = splitgrad.stage_backward_input([loss], None, [x], list(mlp.parameters()))
    assert result.whole == "CompiledFunctionBackward"
    assert all(p.grad is None for p in mlp.parameters())  # I only computed them
    splitgrad.stage_backward_weight(list(mlp.parameters()), result.pending_weight)
    assert runs[0] == 1

    ref = copy.deepcopy(mlp)
    xr = x.detach().requires_grad_()
    ref(xr).square().sum().backward()
    torch.testing.assert_close(result.input_grads[0], xr.grad, rtol=0, atol=1e-6)
    for (name, p), q in zip(mlp.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-6, msg=name)


def test_whole_stage_delivers_at_w_and_hooks_fire_there() -> None:
    mlp = _mlp()
    compiled = torch.compile(mlp, backend="aot_eager")
    seen: list[str] = []
    for name, p in mlp.named_parameters():
        p.register_post_accumulate_grad_hook(lambda _p, n=name: seen.append(n))
    x = torch.randn(4, 8, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", splitgrad.WholeBackwardWarning)
        result = splitgrad.stage_backward_input(
            [compiled(x).sum()], None, [x], list(mlp.parameters())
        )
    assert seen == []  # nothing reached .grad in I
    for p in mlp.parameters():
        p.grad = torch.ones_like(p)  # W adds, as AccumulateGrad does
    before = {n: p.grad.clone() for n, p in mlp.named_parameters()}
    splitgrad.stage_backward_weight(list(mlp.parameters()), result.pending_weight)
    assert sorted(seen) == sorted(n for n, _ in mlp.named_parameters())
    ref = copy.deepcopy(mlp)
    ref(x.detach()).sum().backward()
    for (name, p), q in zip(mlp.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad - before[name], q.grad, rtol=0, atol=1e-6, msg=name)


def test_a_compiled_region_outside_the_input_closure_keeps_the_split() -> None:
    """A compiled part that only parameters feed runs in W alone, once: nothing to unsplit."""
    torch.manual_seed(0)
    table = nn.Linear(8, 8)
    make_weight = torch.compile(lambda w: torch.tanh(w) * 2, backend="aot_eager")
    x = torch.randn(4, 8, requires_grad=True)
    loss = (x @ make_weight(table.weight)).square().sum()
    with warnings.catch_warnings():
        warnings.simplefilter("error", splitgrad.WholeBackwardWarning)
        result = splitgrad.stage_backward_input([loss], None, [x], [table.weight])
    assert result.whole is None
    splitgrad.stage_backward_weight([table.weight], result.pending_weight)
    w = table.weight.detach().requires_grad_()
    xr = x.detach().requires_grad_()
    (xr @ (torch.tanh(w) * 2)).square().sum().backward()
    torch.testing.assert_close(table.weight.grad, w.grad, rtol=0, atol=1e-5)
    torch.testing.assert_close(result.input_grads[0], xr.grad, rtol=0, atol=1e-5)


# ---------------------------------------------------------------- HF Llama layers, inductor
class LlamaBlock(nn.Module):
    """One HF LlamaDecoderLayer as a pipeline stage: SDPA, is_causal (no mask tensor)."""

    def __init__(self, config: LlamaConfig, index: int) -> None:
        super().__init__()
        self.layer = LlamaDecoderLayer(config, index)
        self.rotary = LlamaRotaryEmbedding(config)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(h.shape[1], device=h.device)[None].expand(h.shape[0], -1)
        out = self.layer(
            h, attention_mask=None, position_embeddings=self.rotary(h, pos), position_ids=pos
        )
        return out[0] if isinstance(out, tuple) else out


def _llama_blocks(n: int) -> list[LlamaBlock]:
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=n,
        vocab_size=64,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return [LlamaBlock(config, i) for i in range(n)]


@pytest.mark.parametrize("name", ["zb-v", "dualpipev"])
def test_compiled_llama_layers_in_a_v_pipeline_equal_one_backward(name: str) -> None:
    blocks = _llama_blocks(4)
    reference = copy.deepcopy(blocks)
    x, y = torch.randn(4, 16, 32), torch.randn(4, 16, 32)
    nn.functional.mse_loss(nn.Sequential(*reference)(x), y).backward()

    compiled = [torch.compile(b) for b in blocks]  # inductor, as users compile
    schedule = build_schedule(name, pp=2, microbatches=4)
    pipe = LocalPipeline(compiled, schedule, nn.MSELoss(), check_split=True)
    with pytest.warns(splitgrad.WholeBackwardWarning) as seen:
        losses = pipe.step(x, target=y)
    assert len(losses) == 4
    said = " ".join(str(w.message) for w in seen)
    for s in range(1, 4):  # each split stage names itself (stage 0 runs whole at W anyway)
        assert f"stage {s}'s backward ran whole at I" in said, said
    for i, (b, r) in enumerate(zip(blocks, reference, strict=True)):
        for (pname, p), q in zip(b.named_parameters(), r.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=f"{i}.{pname}")
