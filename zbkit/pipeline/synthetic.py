"""Synthetic stages whose F, I and W take set times: bubbles you can see on any machine.

A real model's F/I/W times depend on the hardware; a ``SyntheticStage`` takes exactly the
times you give it, so a real multi-process run shows the bubbles the simulator predicts for
``Costs(F, I, W)``, and the two can be drawn side by side.

The stage computes ``y = x * weight`` through a custom autograd Function. Its backward asks
``needs_direction`` which half the current pass wants: the input pass (I) pays only the I
time and returns only the input gradient, the weight pass (W) pays only the W time and
returns only the weight gradient, a full backward (B) pays both. The arithmetic is real, so
the gradients can still be checked against plain autograd. The input may have any shape
whose last dimension is ``width`` (e.g. a real stage's ``(batch, tokens, dim)`` activations, so
the messages between ranks are as large as the real model's).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from zbkit.schedules import Costs
from zbkit.splitgrad import GradDirection, needs_direction


@dataclass(frozen=True, slots=True)
class _Times:
    F: float
    I: float  # noqa: E741
    W: float
    mode: str
    paid: list[str]  # one entry per backward call: "I", "W" or "IW" (what it spent time on)


def _take(seconds: float, mode: str) -> None:
    """Occupy ``seconds``: sleep (leaves the CPU to other ranks) or spin (keeps it busy)."""
    if seconds <= 0:
        return
    if mode == "sleep":
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class _Timed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, times: _Times) -> torch.Tensor:
        _take(times.F, times.mode)
        ctx.save_for_backward(x, weight)
        ctx.times = times
        return x * weight  # (batch, width) * (width,)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        times: _Times = ctx.times
        grad_x = grad_w = None
        paid = ""
        # The I time is paid even when x needs no gradient (stage 0): a real first stage
        # still backpropagates through its inner layers before their weights' W.
        if needs_direction(GradDirection.INPUT):
            _take(times.I, times.mode)
            paid += "I"
            if ctx.needs_input_grad[0]:
                grad_x = grad * weight
        if needs_direction(GradDirection.WEIGHT):
            _take(times.W, times.mode)
            paid += "W"
            if ctx.needs_input_grad[1]:
                grad_w = (grad * x).reshape(-1, weight.numel()).sum(0)
        times.paid.append(paid)
        return grad_x, grad_w, None


class SyntheticStage(nn.Module):
    """``forward(x) -> {"x": x * weight}`` taking ``F`` seconds; its I and W take ``I``, ``W``.

    ``mode="sleep"`` (default) frees the CPU while "computing", so several ranks on few cores
    still keep to the set times; ``mode="spin"`` burns the CPU like real compute.
    """

    def __init__(
        self,
        F: float = 0.02,
        I: float = 0.02,  # noqa: E741
        W: float = 0.02,
        width: int = 8,
        mode: str = "sleep",
    ) -> None:
        super().__init__()
        if mode not in ("sleep", "spin"):
            raise ValueError(f"mode must be 'sleep' or 'spin', got {mode!r}")
        if min(F, I, W) < 0:
            raise ValueError(f"times must be >= 0 seconds, got F={F}, I={I}, W={W}")
        self.times = _Times(F, I, W, mode, [])
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, width))

    @classmethod
    def from_costs(cls, costs: Costs, width: int = 8, mode: str = "sleep") -> SyntheticStage:
        """A stage taking ``costs.F``, ``costs.I`` and ``costs.W`` seconds (e.g. costs measured
        from a real stage with ``zbkit.schedules.measure.measured_costs``, then scaled)."""
        return cls(costs.F, costs.I, costs.W, width=width, mode=mode)

    @property
    def paid(self) -> list[str]:
        """What each backward call spent time on, in order: "I", "W", or "IW" (a full B)."""
        return self.times.paid

    def extra_repr(self) -> str:
        t = self.times
        return f"F={t.F}, I={t.I}, W={t.W}, width={self.weight.numel()}, mode={t.mode!r}"

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"x": _Timed.apply(x, self.weight, self.times)}
