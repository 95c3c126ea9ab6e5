"""A weight tied across two ranks (an embedding and an LM head) stays one weight: each copy
gets the whole gradient one process gives it, and the copies stay equal through training."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zbkit.launch import launch

V, H, B, S, M = 32, 8, 4, 4, 2


class Embed(nn.Module):
    def __init__(self, weight: nn.Parameter) -> None:
        super().__init__()
        self.weight = weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(ids, self.weight)


class Head(nn.Module):
    def __init__(self, weight: nn.Parameter) -> None:
        super().__init__()
        self.block = nn.Linear(H, H)
        self.weight = weight  # the embedding's: tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.block(x)) @ self.weight.T


def _model() -> tuple[Embed, Head]:
    torch.manual_seed(0)
    weight = nn.Parameter(torch.randn(V, H) * 0.1)
    return Embed(weight), Head(weight)


def _loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, V), target.reshape(-1))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, V, (B, S), generator=g), torch.randint(0, V, (B, S), generator=g)


def _ranks(tie: bool) -> tuple[torch.Tensor, torch.Tensor]:
    import torch.distributed as dist  # inside a rank: launch set the process group up

    from zbkit.pipeline import PipelineStage, ScheduleRunner
    from zbkit.schedules import build_schedule

    embed, head = _model()
    rank = dist.get_rank()
    module = embed if rank == 0 else head
    runner = ScheduleRunner(build_schedule("zb-h1", pp=2, microbatches=M),
                            PipelineStage(module, rank, 2), _loss,
                            tied={"tied": module.weight} if tie else None)  # fmt: skip
    opt = torch.optim.SGD(module.parameters(), lr=0.5)
    ids, target = _batch()
    runner.step(ids, targets=target)
    grad = module.weight.grad.clone()
    opt.step()
    opt.zero_grad(set_to_none=True)
    runner.step(ids, targets=target)
    opt.step()
    return grad, module.weight.detach().clone()


def _one_process() -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle: the same model in one process, the one weight's gradient, two SGD steps."""
    embed, head = _model()
    opt = torch.optim.SGD([*embed.parameters(), *head.block.parameters()], lr=0.5)
    ids, target = _batch()
    grads = []
    for _ in range(2):
        _loss(head(embed(ids)), target).backward()
        grads.append(embed.weight.grad.clone())
        opt.step()
        opt.zero_grad(set_to_none=True)
    return grads[0], embed.weight.detach().clone()


@pytest.mark.multiprocess
def test_a_tied_weight_on_two_ranks_is_one_weight():
    want_grad, want_weight = _one_process()
    (grad0, weight0), (grad1, weight1) = launch(_ranks, True, nprocs=2, timeout=300)
    for grad in (grad0, grad1):
        assert torch.allclose(grad, want_grad, atol=1e-6)
    assert torch.allclose(weight0, weight1, atol=1e-7)
    assert torch.allclose(weight0, want_weight, atol=1e-6)
    # without tied=, each copy gets only its own stage's part, and the copies drift
    (part0, apart0), (part1, apart1) = launch(_ranks, False, nprocs=2, timeout=300)
    assert torch.allclose(part0 + part1, want_grad, atol=1e-6)
    assert not torch.allclose(apart0, apart1, atol=1e-4)
