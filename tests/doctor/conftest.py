"""What the doctor's tests share: the oracle, plain `loss.backward()`, and small models (the
gloo world of one rank, `gloo_world`, is tests/conftest.py's)."""

from __future__ import annotations

import copy

import torch
from torch import nn


def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (out - target).pow(2).mean()


def batch(rows: int = 8, width: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(rows, width, generator=g), torch.randn(rows, width, generator=g)


def oracle(mods: list[nn.Module], x, y, m: int, loss_fn=mse) -> list[dict[str, torch.Tensor]]:
    """Plain autograd on copies: the mean of the m microbatches' losses, as torch's schedule
    (scale_grads=True) and zbkit's (scale_grads=True) average them. Parameters shared
    between stages stay shared in the copy (one deepcopy of the list)."""
    mods = copy.deepcopy(mods)
    total = 0
    for xs, ys in zip(x.tensor_split(m), y.tensor_split(m), strict=True):
        h = xs
        for mod in mods:
            h = mod(h)
        total = total + loss_fn(h, ys)
    (total / m).backward()
    return [{n: p.grad for n, p in mod.named_parameters()} for mod in mods]


def grads(mods: list[nn.Module]) -> list[dict[str, torch.Tensor | None]]:
    return [{n: p.grad for n, p in mod.named_parameters()} for mod in mods]


def same(got, expected, atol: float = 1e-6) -> bool:
    """Every gradient equal (None where the oracle has None)."""
    for g, e in zip(got, expected, strict=True):
        for name, want in e.items():
            have = g[name]
            if (want is None) != (have is None):
                return False
            if want is not None and not torch.allclose(have, want, atol=atol):
                return False
    return True
