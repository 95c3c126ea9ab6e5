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

from zbkit.parallel.process_group import group_device

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
        flags = torch.tensor([float(h) for h in self.held], device=group_device(group))
        counts, totals = self._sum([p.detach() for p in self.params], group, timeout, "copies",
                                   flags)  # fmt: skip
        for p, count, total in zip(self.params, counts.tolist(), totals, strict=True):
            if total is not None and count > 0:
                with torch.no_grad():
                    p.copy_(total / count)

    def sum_grads(self, group: dist.ProcessGroup | None, timeout: float) -> None:
        """Every holder's `.grad` becomes the sum of all holders' (its stages are done)."""
        _, totals = self._sum([p.grad for p in self.params], group, timeout, "gradients")
        for p, total in zip(self.params, totals, strict=True):
            if total is not None:
                p.grad = total.to(p.dtype) if p.grad is None else p.grad.copy_(total)

    # ---- pieces
    def _sum(
        self,
        values: list[torch.Tensor | None],
        group: dist.ProcessGroup | None,
        timeout: float,
        what: str,
        head: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """Every rank's `values` (one per tied weight: this rank's where it holds the weight
        and has one, else zeros) summed over `group` in float32, after `head` (summed too);
        per weight, the sum in its shape and on its device where this rank holds it, else
        None."""
        device = group_device(group)
        parts = [torch.zeros(0, device=device) if head is None else head]
        for p, held, value in zip(self.params, self.held, values, strict=True):
            if held and value is not None:
                parts.append(value.detach().reshape(-1).to(device, torch.float32))
            else:
                parts.append(torch.zeros(p.numel(), device=device))
        flat = self._reduce(torch.cat(parts), group, timeout, what)
        start = len(parts[0])
        summed: list[torch.Tensor | None] = []
        for p, held in zip(self.params, self.held, strict=True):
            piece = flat[start : start + p.numel()]
            summed.append(piece.view_as(p).to(p.device).clone() if held else None)
            start += p.numel()
        return flat[: len(parts[0])], summed

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
