"""Stage modules of the real-code tests, shared with the ranks (which cannot import tests).

The forms users' models take: HF-style tuples with a None in them, several inputs."""

from __future__ import annotations

import torch
from torch import nn

D = 4


def two_stages() -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(D, D), nn.Tanh()), nn.Linear(D, 1)]


def data(rows: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randn(rows, D), torch.randn(rows, 1)


class WithPast(nn.Module):
    """HF-style: returns (hidden, None, mask); the None is the cache this model keeps none of."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x):
        return torch.tanh(self.lin(x)), None, (x > 0).float()


class TakesPast(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, 1)
        self.seen: list = []

    def forward(self, hidden, past, mask):
        self.seen.append(past)
        return self.lin(hidden * mask)


class EndsWithNone(nn.Module):
    """A trailing None: the next stage's arity depends on it arriving."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x):
        return self.lin(x), None


class TakesTwo(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, 1)

    def forward(self, hidden, cache):  # no default: the None must arrive
        assert cache is None
        return self.lin(hidden)


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x, bias, mask=None):
        h = self.lin(x) + bias
        return h if mask is None else h * mask
