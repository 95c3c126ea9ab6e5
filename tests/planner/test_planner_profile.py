"""`planner.profile`: each layer's bytes against the tensors' own sizes, its times, JSON, and
the errors for what it cannot measure."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from zbkit import planner

B, S, H, V = 4, 8, 32, 64
F32 = 4  # bytes per element


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(H, 4 * H), nn.GELU(), nn.Linear(4 * H, H))


def _gpt_like() -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Embedding(V, H), _mlp(), _mlp(), nn.Linear(H, V)]


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out.reshape(-1, V), target.reshape(-1))


def _sample(batch: int = B) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, V, (batch, S), generator=g), torch.randint(
        0, V, (batch, S), generator=g
    )


def test_a_blocks_bytes_are_the_tensors_autograd_and_the_split_backward_hold():
    prof = planner.profile(_gpt_like(), _sample(), loss_fn=_loss, repeats=2)
    block = prof.layers[1]
    rows, hidden = B * S, 4 * H
    # F holds the first linear's output (GELU saves it), GELU's output (the second linear
    # saves it) and the block's output (the runtime keeps it for the backward)
    assert block.activation_bytes == (2 * rows * hidden + rows * H) * F32
    # I leaves W what the weight gradients need: GELU's output and the gradient at each
    # linear's output (the seed of the second, the first's computed in I)
    assert block.weight_state_bytes == (rows * hidden + rows * H + rows * hidden) * F32
    params = sum(p.numel() for p in _mlp().parameters())
    assert block.params == params and block.param_bytes == params * F32
    assert block.grad_bytes == block.param_bytes  # W fills every .grad once
    assert block.output_bytes == rows * H * F32
    # Adam keeps two moments in the parameters' dtype and one float32 step per tensor
    assert block.optimizer_bytes == 2 * block.param_bytes + 4 * 4
    embed, head = prof.layers[0], prof.layers[-1]
    assert embed.activation_bytes == embed.output_bytes == rows * H * F32
    assert head.output_bytes == rows * V * F32
    # the loss runs in F, as on a runtime's last stage: cross entropy keeps its log-softmax
    # (one more logits-sized tensor) until I, and I makes the logits' gradient on the way
    assert head.activation_bytes >= head.output_bytes + rows * V * F32
    assert head.input_grad_extra_bytes >= rows * V * F32


def test_activation_bytes_grow_with_the_microbatch_and_the_parameters_do_not():
    small = planner.profile(_gpt_like(), _sample(2), loss_fn=_loss, repeats=1)
    large = planner.profile(_gpt_like(), _sample(8), loss_fn=_loss, repeats=1)
    for a, b in zip(small.layers[1:3], large.layers[1:3], strict=True):
        assert b.activation_bytes == 4 * a.activation_bytes
        assert b.weight_state_bytes == 4 * a.weight_state_bytes
        assert (a.param_bytes, a.optimizer_bytes) == (b.param_bytes, b.optimizer_bytes)


@pytest.mark.parametrize(("name", "per_param"), [("sgd", 0), ("sgd-momentum", 1), ("adamw", 2)])
def test_the_optimizers_state_is_its_own(name, per_param):
    layer = planner.profile([_mlp()], torch.randn(B, H), optimizer=name, repeats=1).layers[0]
    steps = 4 * 4 if name == "adamw" else 0  # AdamW's step counters, one float32 per tensor
    assert layer.optimizer_bytes == per_param * layer.param_bytes + steps


def test_times_are_measured_and_ordered_and_the_model_is_left_as_it_was():
    layers = _gpt_like()
    kept = torch.full_like(layers[1][0].weight, 3.0)  # a gradient the user already holds
    layers[1][0].weight.grad = kept
    weights = [p.detach().clone() for m in layers for p in m.parameters()]
    prof = planner.profile(layers, _sample(), loss_fn=_loss, repeats=3)
    for layer in prof.layers:
        for t in (layer.forward, layer.input_grad, layer.weight_grad):
            assert 0 < t.fastest <= t.median <= t.slowest
    assert layers[1][0].weight.grad is kept and torch.equal(kept, torch.full_like(kept, 3.0))
    others = [p for m in layers for p in m.parameters() if p is not layers[1][0].weight]
    assert all(p.grad is None for p in others)
    after = [p.detach() for m in layers for p in m.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(weights, after, strict=True))
    assert (prof.device, prof.dtype, prof.optimizer, prof.repeats) == ("cpu", "float32", "adam", 3)
    assert prof.sample == {"shape": [B, S], "dtype": "int64"}


def test_a_profile_saves_and_loads_as_json(tmp_path):
    prof = planner.profile(_gpt_like(), _sample(), loss_fn=_loss, repeats=1)
    prof.save(tmp_path / "p.json")
    again = planner.Profile.load(tmp_path / "p.json")
    assert again == prof and again.layers[1].forward.median == prof.layers[1].forward.median


def test_layers_fed_tuples_and_dicts():
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(H, H)

        def forward(self, x: torch.Tensor, scale: torch.Tensor) -> dict:
            return {"x": self.lin(x) * scale}

    class Last(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(H, H)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x)

    prof = planner.profile([Two(), Last()], (torch.randn(B, H), torch.full((1,), 2.0)))
    assert [layer.output_bytes for layer in prof.layers] == [B * H * F32] * 2


def test_bad_input_gets_one_clear_line():
    with pytest.raises(ValueError, match=r"layer 1 \(Linear\) cannot take layer 0's output"):
        planner.profile([nn.Linear(H, 2 * H), nn.Linear(H, H)], torch.randn(B, H))
    with pytest.raises(ValueError, match="loss_fn returned no graph"):
        planner.profile([nn.Linear(H, H)], (torch.randn(B, H), None), loss_fn=lambda o, t: 1.0)
    meta = nn.Linear(H, H, device="meta")
    with pytest.raises(ValueError, match="several devices: cpu .layer 0 first., meta"):
        planner.profile([nn.Linear(H, H), meta], torch.randn(B, H))
    with pytest.raises(ValueError, match="the sample is on meta, the layers on cpu"):
        planner.profile([nn.Linear(H, H)], torch.randn(B, H, device="meta"))
    with pytest.raises(ValueError, match=r"with a loss_fn, sample is \(inputs, target\)"):
        planner.profile([nn.Linear(H, H)], torch.randn(B, H), loss_fn=_loss)
    with pytest.raises(TypeError, match="an nn.Sequential or a list of modules"):
        planner.profile(nn.Linear(H, H), torch.randn(B, H))
    with pytest.raises(ValueError, match="unknown optimizer 'lamb'"):
        planner.profile([nn.Linear(H, H)], torch.randn(B, H), optimizer="lamb")
    with pytest.raises(ValueError, match="repeats must be an int >= 1"):
        planner.profile([nn.Linear(H, H)], torch.randn(B, H), repeats=0)
    with pytest.raises(ValueError, match="no layers given"):
        planner.profile([], torch.randn(B, H))


_RSS_AFTER_FREE = """
import psutil, torch
from zbkit.planner.allocator import settle
if {settle}:
    settle(torch.device("cpu"))
rss = lambda: psutil.Process().memory_info().rss
before = rss()
block = torch.empty(4 * 2**20)  # 16 MiB, written so its pages are in
block.fill_(1)
del block
print((rss() - before) // 2**20)
"""


@pytest.mark.parametrize("settled", [False, True])
def test_settle_keeps_freed_memory_for_reuse_where_glibc_would_hand_it_back(settled):
    # a fresh process each: settle is process-wide. Unsettled, glibc returns a freed 16 MiB
    # chunk to the system (the next one is faulted in again); settled, it keeps it
    code = _RSS_AFTER_FREE.format(settle=settled)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    kept = int(out.stdout.split()[-1])
    assert (kept >= 15) if settled else (kept <= 1), out.stdout


def test_a_profile_prints_nothing_to_stderr():
    """torch's Kineto prints a line per profiler start and stop unless its log level is
    above them: a notebook cell that profiles shows no pages of them (a fresh process)."""
    code = (
        "import torch\nfrom zbkit import planner\n"
        "planner.profile([torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)], torch.randn(2, 8), "
        "repeats=2)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "profiler_start" not in done.stderr and done.stderr.strip() == "", done.stderr[:500]
