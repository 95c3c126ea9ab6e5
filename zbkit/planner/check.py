"""`check(plan, layers, batch, loss_fn=)`: the plan's top candidates run for real, side by side.

Each of the plan's `top` fastest candidates that fit is measured (`measure`: its own program,
stages and microbatches on `pp` real ranks) and compared with its prediction (`compare`).
A candidate with data parallelism runs one replica's pipeline on its share of the batch; the
gradients' all-reduce between replicas is the plan's price, not measured here (one host has
no second replica to reduce with). The `Check` says whether the chosen candidate measured the
fastest of them, and by how much it missed where it did not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

import torch
from torch import nn

from zbkit.planner.choose import Candidate, Plan
from zbkit.planner.compare import Comparison, compare
from zbkit.planner.measure import Measured, measure
from zbkit.planner.profile import map_tensors

__all__ = ["Check", "check"]


@dataclass(frozen=True)
class Check:
    """The top candidates, each predicted (`comparisons[i].prediction`) and measured."""

    candidates: list[Candidate]
    comparisons: list[Comparison]  # each against its candidate's fastest run
    runs: list[list[Measured]]  # per candidate, every run (one per round)

    @property
    def measured_seconds(self) -> list[float]:
        """Each candidate's measured step, the plan's all-reduce price added where dp > 1."""
        return [
            c.measured.step_seconds + (cand.step_seconds - c.prediction.step_seconds)
            for cand, c in zip(self.candidates, self.comparisons, strict=True)
        ]

    @property
    def chosen_ratio(self) -> float:
        """The chosen candidate's measured step over the fastest measured among them
        (1.0: it was the fastest)."""
        secs = self.measured_seconds
        return secs[0] / min(secs)

    def __str__(self) -> str:
        head = (f"{'schedule':<17} {'pp':>3} {'dp':>3} {'m':>3} {'predicted ms':>13} "
                f"{'measured ms':>12} {'ratio':>6} {'peak ratio':>11}")  # fmt: skip
        lines = [head]
        for cand, comp, secs in zip(self.candidates, self.comparisons, self.measured_seconds,
                                    strict=True):  # fmt: skip
            peak = max(comp.peak_ratios, key=lambda r: abs(r - 1))
            lines.append(
                f"{cand.schedule:<17} {cand.pp:>3} {cand.dp:>3} {cand.microbatches:>3} "
                f"{cand.step_seconds * 1e3:>13.4g} {secs * 1e3:>12.4g} "
                f"{cand.step_seconds / secs:>6.3f} {peak:>11.3f}"
            )
        fastest = min(range(len(self.candidates)), key=lambda i: self.measured_seconds[i])
        if fastest == 0:
            verdict = f"the chosen plan measured the fastest of these {len(self.candidates)}"
        else:
            other = self.candidates[fastest]
            verdict = (
                f"the chosen plan measured {self.chosen_ratio - 1:.1%} slower than "
                f"{other.schedule} pp={other.pp} m={other.microbatches}, the fastest measured"
            )
        if any(c.dp > 1 for c in self.candidates):
            verdict += " (dp > 1: one replica's pipeline measured, the all-reduce priced)"
        return "\n".join([verdict, *lines])

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        first, *rest = str(self).splitlines()
        return f"<p>{escape(first)}</p><pre>{escape(chr(10).join(rest))}</pre>"


def check(
    plan: Plan,
    layers: nn.Sequential | Sequence[nn.Module],
    batch: Any,
    *,
    loss_fn: Callable[..., torch.Tensor],
    top: int = 3,
    rounds: int = 1,
    steps: int = 3,
    warmup: int = 3,
    backend: str = "gloo",
    progress: Callable[[str], None] | None = None,
) -> Check:
    """Measure the `top` fastest candidates of `plan` that fit on `layers` (the model the
    plan's profile was taken of) over `batch`, the global batch `(inputs, targets)`, and
    compare each with its prediction (module docstring). With `rounds` > 1 each candidate
    is measured that many times, taking turns (a host's drift falls on all of them alike),
    and its fastest run is kept. `progress` is called with a line before each run."""
    if not isinstance(plan, Plan):
        raise TypeError(f"check takes a planner.plan(...) result, got {type(plan).__name__}")
    for what, value in (("top", top), ("rounds", rounds)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"check: {what} must be an int >= 1, got {value!r}")
    chosen = plan.top(top)
    if not chosen:
        raise ValueError("check: nothing in the plan fits its memory, so there is nothing to run")
    if not isinstance(batch, tuple | list) or len(batch) != 2:
        raise ValueError("check: batch is (inputs, targets), the plan's whole global batch")
    rows = _rows(batch)
    if rows != plan.global_batch:
        raise ValueError(
            f"check: the batch has {rows} rows but the plan is for a global batch of "
            f"{plan.global_batch}: give the batch the plan divided"
        )
    runs: list[list[Measured]] = [[] for _ in chosen]
    for turn in range(rounds):
        for i, cand in enumerate(chosen):
            if progress is not None:
                progress(f"measuring {turn * len(chosen) + i + 1} of {rounds * len(chosen)}: "
                         f"{cand.schedule} pp={cand.pp} m={cand.microbatches}")  # fmt: skip
            runs[i].append(_measure(cand, layers, batch, rows, loss_fn, steps, warmup, backend))
    comparisons = [
        compare(cand.prediction, min(got, key=lambda run: run.step_seconds))  # type: ignore[arg-type]
        for cand, got in zip(chosen, runs, strict=True)
    ]
    return Check(chosen, comparisons, runs)


def _measure(cand: Candidate, layers, batch, rows, loss_fn, steps, warmup, backend) -> Measured:
    """One run of the candidate's own program and stages on one replica's share."""
    pred = cand.prediction
    assert pred is not None  # top() holds candidates that were built
    share = rows // cand.dp
    replica = tuple(map_tensors(lambda t: t[:share], x) for x in batch)
    return measure(layers, replica, pred.schedule, pp=cand.pp, microbatches=cand.microbatches,
                   stages=pred.stages, loss_fn=loss_fn, optimizer=pred.profile.optimizer,
                   steps=steps, warmup=warmup, backend=backend)  # fmt: skip


def _rows(batch: Any) -> int:
    inputs = batch[0]
    while isinstance(inputs, tuple | list | dict):
        inputs = next(iter(inputs.values())) if isinstance(inputs, dict) else inputs[0]
    if not isinstance(inputs, torch.Tensor):
        raise ValueError("check: the batch's inputs hold no tensor to count rows in")
    return int(inputs.shape[0])
