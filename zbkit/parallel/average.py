"""Averaging gradients over a data-parallel group by hand: what DDP does, in one call.

    pending = average_gradients(stage.parameters(), dp_group, timeout=60, label="stage 1")
    ...                  # keep computing: the all-reduce runs in the background
    pending.wait()       # now every replica's .grad holds the mean over the replicas

One flat buffer per call: the gradients are copied into one tensor and all-reduced once
(one message instead of one per parameter, which is also why DDP packs gradients into
buckets), divided by the group's size, and copied back into each `.grad`.
The pipeline runner starts one average per stage right after that stage's last backward
and waits for them all at the end of the step, so the reduce overlaps the other stages.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from zbkit.parallel.process_group import group_device

__all__ = ["PendingAverage", "average_gradients"]


class PendingAverage:
    """An average in flight; `wait()` finishes it (a second `wait()` does nothing)."""

    def __init__(
        self,
        work: Any,
        flat: torch.Tensor,
        grads: list[torch.Tensor],
        group: dist.ProcessGroup | None,
        timeout: float,
        label: str,
    ) -> None:
        self._work, self._flat, self._grads = work, flat, grads
        self.group, self.timeout, self.label = group, timeout, label
        self.done = False

    def wait(self) -> None:
        """Block until the all-reduce is done, then write the mean into each `.grad`.

        Raises TimeoutError naming what it waited for after `timeout` seconds (a replica
        that never started its average, or died).
        """
        if self.done:
            return
        try:
            self._work.wait(timedelta(seconds=self.timeout))
        except RuntimeError as exc:  # how torch reports a timed-out or broken collective
            raise TimeoutError(
                f"rank {dist.get_rank()}: averaging {self.label}'s gradients over the "
                f"data-parallel group did not finish within {self.timeout:g} s ({exc})"
            ) from exc
        flat = self._flat
        flat /= dist.get_world_size(self.group)  # the sum -> the mean
        offset = 0
        for g in self._grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
        self.done = True

    def __repr__(self) -> str:
        state = "done" if self.done else "in flight"
        return f"PendingAverage({self.label!r}, {len(self._grads)} gradients, {state})"


def average_gradients(
    params: Iterable[torch.Tensor],
    group: dist.ProcessGroup | None = None,
    *,
    timeout: float = 60.0,
    label: str = "the model",
) -> PendingAverage:
    """Start averaging the `.grad` of `params` over `group` (default: the world).

    Collective: every rank of `group` calls it with the same parameters (shapes and
    order). Parameters without a gradient are skipped. Returns at once; call `.wait()`
    on the result before reading the gradients. `label` names the parameters in the
    timeout error ("stage 2", "the model").
    """
    grads = [p.grad for p in params if p.grad is not None]
    if grads:
        flat = torch.cat([g.reshape(-1) for g in grads])  # [sum of the numels]
    else:
        # Replicas hold the same parameters, so all of them come here: the empty
        # all-reduce still matches theirs, one call per call.
        flat = torch.zeros(0, device=group_device(group))
    work = dist.all_reduce(flat, group=group, async_op=True)
    return PendingAverage(work, flat, grads, group, timeout, label)
