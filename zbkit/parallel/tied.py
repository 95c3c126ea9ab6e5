"""Weights a model ties across pipeline stages, kept equal on the ranks that hold a copy.

A tied embedding and LM head are one `nn.Parameter` in one process. In a pipeline the first
stage and the last are often on two ranks, each with its own copy: each copy then gets only
its own stage's part of the gradient, and the copies drift apart with every optimizer step.
`TiedWeights` keeps them one weight: at the first step the holders' copies are averaged (so
they start equal), and at the end of each step every holder's gradient becomes the sum of all
holders' (what the one parameter gets in one process).

Collective over the pipeline group: every rank names the same weights (`{name: parameter}`,
each rank's own copy, held or not); a rank whose stages do not use a weight adds zeros.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = ["TiedWeights"]


class TiedWeights:
    """The tied weights of one rank: `held` are those its stages' parameters include."""

    def __init__(
        self, tied: Mapping[str, torch.Tensor], mine: Iterable[torch.Tensor], where: str
    ) -> None:
        if not isinstance(tied, Mapping) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in tied.items()
        ):
            raise TypeError(
                f"{where}: tied takes {{name: parameter}}, the same names on every rank, e.g. "
                "zbkit.hf.tied(model)"
            )
        ids = {id(p) for p in mine}
        self.names = sorted(tied)
        self.params = [tied[n] for n in self.names]
        self.held = [id(p) in ids for p in self.params]
        self.where = where

    def describe(self) -> str:
        """Names and shapes, for the ranks' first-step agreement (equal on every rank)."""
        return ",".join(
            f"{n}:{list(p.shape)}" for n, p in zip(self.names, self.params, strict=True)
        )

    def equalize(self, group: dist.ProcessGroup | None, timeout: float) -> None:
        """The holders' copies averaged: they start the run equal."""
        device = self._device(group)
        flags = torch.tensor([float(h) for h in self.held], device=device)
        pairs = zip(self.params, self.held, strict=True)
        values = [self._mine(p, h, p.detach(), device) for p, h in pairs]
        total = self._reduce(torch.cat([flags, *values]), group, timeout, "copies")
        counts, values_sum = total[: len(self.held)], total[len(self.held) :]
        offset = 0
        for p, held, count in zip(self.params, self.held, counts.tolist(), strict=True):
            n = p.numel()
            if held and count > 0:
                with torch.no_grad():
                    mean = values_sum[offset : offset + n] / count
                    p.copy_(mean.view_as(p).to(p.device, p.dtype))
            offset += n

    def sum_grads(self, group: dist.ProcessGroup | None, timeout: float) -> None:
        """Every holder's `.grad` becomes the sum of all holders' (its stages are done)."""
        device = self._device(group)
        pairs = zip(self.params, self.held, strict=True)
        parts = [self._mine(p, h, p.grad, device) for p, h in pairs]
        total = self._reduce(torch.cat(parts), group, timeout, "gradients")
        offset = 0
        for p, held in zip(self.params, self.held, strict=True):
            n = p.numel()
            if held:
                summed = total[offset : offset + n].view_as(p).to(p.device, p.dtype)
                p.grad = summed.clone() if p.grad is None else p.grad.copy_(summed)
            offset += n

    # ---- pieces
    def _mine(
        self, p: torch.Tensor, held: bool, value: torch.Tensor | None, device: torch.device
    ) -> torch.Tensor:
        """This rank's contribution for `p`: its value where it holds `p`, else zeros."""
        if held and value is not None:
            return value.detach().reshape(-1).to(device, torch.float32)
        return torch.zeros(p.numel(), device=device, dtype=torch.float32)

    def _reduce(self, flat: torch.Tensor, group, timeout: float, what: str) -> torch.Tensor:
        work = dist.all_reduce(flat, group=group, async_op=True)
        assert work is not None, "async_op=True returns a Work"
        try:
            work.wait(timedelta(seconds=timeout))
        except RuntimeError as exc:
            raise TimeoutError(
                f"{self.where}: summing the tied weights' {what} over the pipeline did not "
                f"finish within {timeout:g} s: a rank failed, or was not given the same tied= "
                f"[{str(exc).strip()[:200]}]"
            ) from exc
        return flat

    def _device(self, group) -> torch.device:
        if dist.get_backend(group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
