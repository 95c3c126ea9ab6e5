"""A whole pipeline on one page: any validated schedule, run in one process, in ~60 lines.

What `ScheduleRunner` does on every rank and `LocalPipeline` does in one process, without
their machinery (traces, timeouts, the wire, error grids): stages are plain modules taking and
returning dicts of tensors; F runs a stage, I and W are `splitgrad`'s two halves of its
backward, B both at once. The actions run in the order the simulator starts them, which
respects every dependency; each stage's actions stay in its rank's program order, so the
gradients equal `LocalPipeline`'s and one process's `loss.backward()` on the mean loss.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from zbkit.schedules import Schedule, simulate, validate
from zbkit.splitgrad import (
    PendingWeight,
    stage_backward_full,
    stage_backward_input,
    stage_backward_weight,
)

Tensors = dict[str, torch.Tensor]


def run_schedule(
    schedule: Schedule,
    stages: Sequence[nn.Module],  # stage s: module(**inputs) -> dict of outputs
    inputs: Tensors,  # stage 0's inputs for the whole batch, split along dim 0
    target: torch.Tensor,
    loss_fn: Callable[[Tensors, torch.Tensor], torch.Tensor],
) -> list[torch.Tensor]:
    """Run one training step of `schedule`; returns each microbatch's loss."""
    validate(schedule)
    m, last = schedule.microbatches, schedule.num_stages - 1
    xs = [
        dict(zip(inputs, parts, strict=True))
        for parts in zip(*(v.chunk(m) for v in inputs.values()), strict=True)
    ]
    ys = target.chunk(m)
    held: dict[tuple[int, int], tuple[Tensors, Tensors]] = {}  # F's inputs and outputs
    grad_in: dict[tuple[int, int], Tensors] = {}  # gradients sent up to stage s by s + 1
    pending: dict[tuple[int, int], PendingWeight] = {}  # what W needs, kept from I
    losses: list[torch.Tensor] = [torch.zeros(())] * m

    def forward(s: int, j: int) -> None:
        if s == 0:
            given = xs[j]
        else:  # a received activation: a fresh leaf, as it would arrive over the wire
            sent = held[s - 1, j][1]
            given = {k: v.detach().requires_grad_(v.is_floating_point()) for k, v in sent.items()}
        out = stages[s](**given)
        if s == last:  # the mean of the microbatch losses, as one full-batch step
            losses[j] = loss_fn(out, ys[j])
            out = {"loss": losses[j] / m}
        held[s, j] = (given, out)

    def roots(s: int, j: int) -> tuple[list[torch.Tensor], list | None, list[str], list]:
        """What a backward starts from (outputs, their gradients) and reaches (inputs)."""
        given, out = held.pop((s, j))
        keys = [k for k, v in out.items() if v.requires_grad]
        sent = grad_in.pop((s, j)) if s < last else {}  # the last stage starts from the loss
        grads = None if s == last else [sent[k] for k in keys]
        names = [k for k, v in given.items() if v.requires_grad]
        outs = [out[k] for k in keys]
        return outs, grads, names, [given[k] for k in names]

    def send_up(s: int, j: int, names: list[str], input_grads: Sequence) -> None:
        if s > 0:
            grad_in[s - 1, j] = dict(zip(names, input_grads, strict=True))

    def backward_input(s: int, j: int) -> None:
        outs, grads, names, xs_ = roots(s, j)
        result = stage_backward_input(outs, grads, xs_, stages[s].parameters())
        pending[s, j] = result.pending_weight
        send_up(s, j, names, result.input_grads)

    def backward_weight(s: int, j: int) -> None:
        stage_backward_weight(stages[s].parameters(), pending.pop((s, j)))

    def backward(s: int, j: int) -> None:
        outs, grads, names, xs_ = roots(s, j)
        send_up(s, j, names, stage_backward_full(outs, grads, xs_))

    run = {"F": forward, "I": backward_input, "W": backward_weight, "B": backward}
    for e in sorted(simulate(schedule, check=False).events, key=lambda e: (e.start, e.rank)):
        run[e.kind](e.stage, e.microbatch)
    assert not held and not grad_in and not pending  # nothing left behind
    return losses
