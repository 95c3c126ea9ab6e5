"""check_split: one microbatch's split gradients against a whole backward of the same graph.

zbkit's split is exact on every graph it knows how to split, and runs whole the graphs it
knows it cannot (see _whole). A graph it does not know (a custom Function whose backward
keeps state between calls, a new kind of compiled node) could still make I then W differ
from one backward. ``stage_backward_input(..., check=True)`` finds out on real data: before
I, one whole backward of the same graph (kept for I and W) gives the reference gradients
of the inputs and of every weight, without touching ``.grad``; I's input gradients are
compared at once, and W's contribution to each ``.grad`` (after minus before) when W runs.
A difference beyond the dtype's tolerance raises `SplitMismatch`, naming what differs.
The cost is that one extra backward, on the microbatches checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from zbkit.splitgrad._directions import GradDirection, grad_directions
from zbkit.splitgrad._whole import explain_refusals

# relative to the larger of the two gradients' magnitudes: what two orders of the same sums
# may differ by in that dtype, with room; a wrong gradient is off by far more
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


@dataclass(frozen=True)
class Difference:
    """One tensor whose split gradient differs from the whole backward's."""

    label: str  # "inputs[0]", "weights[3]"; a caller may put its own names on (`named`)
    index: int  # its position among the inputs or the weights
    error: float  # max |split - whole|
    scale: float  # max |whole| (or |split|, the larger)
    shape: tuple[int, ...]

    def describe(self, name: str | None = None) -> str:
        what = name or f"{self.label} {list(self.shape)}"
        return f"{what}: max |split - whole| = {self.error:.3g} (of {self.scale:.3g})"


class SplitMismatch(RuntimeError):
    """I then W gave other gradients than one whole backward of the same microbatch."""

    def __init__(self, what: str, differences: Sequence[Difference]) -> None:
        self.what = what  # "input" or "weight"
        self.differences = list(differences)
        super().__init__(self.explain())

    def explain(self, names: Sequence[str] | None = None) -> str:
        """The message, with `names[d.index]` in place of the labels when given."""
        rows = "; ".join(d.describe(names[d.index] if names else None) for d in self.differences)
        return (
            f"check_split: the split backward's {self.what} gradients differ from a whole "
            f"backward of the same microbatch: {rows}. A node in this graph does not give the "
            "same gradients when its backward is split into I and W (a custom autograd "
            "Function keeping state between calls, a compiled or fused region zbkit does not "
            "recognise). Run this stage with a schedule without I/W (B only: 1f1b, gpipe), or "
            "report the graph to zbkit"
        )


def _compare(
    label: str, found: Sequence, expected: Sequence, held: Sequence[float] = ()
) -> list[Difference]:
    """Each found gradient against the expected one, beyond the dtype's tolerance. ``held``:
    per gradient, the largest value its `.grad` held before (W's addition is read as a
    difference of `.grad`s, rounded at their size, not at this microbatch's)."""
    out = []
    for i, (a, b) in enumerate(zip(found, expected, strict=True)):
        if a is None and b is None:
            continue
        a = torch.zeros_like(b) if a is None else a
        b = torch.zeros_like(a) if b is None else b
        error = (a - b).abs().max().item() if a.numel() else 0.0
        scale = max(a.abs().max().item(), b.abs().max().item()) if a.numel() else 0.0
        scale = max(scale, held[i] if i < len(held) else 0.0)
        if error > TOLERANCE.get(b.dtype, 1e-5) * scale + 1e-12:
            out.append(Difference(f"{label}[{i}]", i, error, scale, tuple(b.shape)))
    return out


@dataclass(eq=False)
class SplitCheck:
    """One microbatch's reference gradients, waiting for its I and W to be compared."""

    weights: list[torch.Tensor]
    expected: list[torch.Tensor | None]  # per weight: the whole backward's gradient
    before: list[torch.Tensor | None] = field(default_factory=list)  # .grad before W

    @classmethod
    def start(
        cls,
        tensors: list[torch.Tensor],
        grads: list[torch.Tensor],
        inputs: list[torch.Tensor],
        weights: list[torch.Tensor],
    ) -> tuple[SplitCheck, list[torch.Tensor | None]]:
        """The whole backward (graph kept), as (the weights' check, the inputs' gradients)."""
        wanted = [w for w in weights if w.requires_grad]  # a frozen one gets no gradient
        with grad_directions(GradDirection.INPUT, GradDirection.WEIGHT), explain_refusals():
            found = torch.autograd.grad(
                tensors, [*inputs, *wanted], grads, retain_graph=True, allow_unused=True
            )
        of_weight = iter(found[len(inputs) :])
        expected = [next(of_weight) if w.requires_grad else None for w in weights]
        return cls(list(weights), expected), list(found[: len(inputs)])

    @staticmethod
    def inputs(found: Sequence, expected: Sequence) -> None:
        """I's input gradients against the whole backward's; raises SplitMismatch."""
        wrong = _compare("inputs", found, expected)
        if wrong:
            raise SplitMismatch("input", wrong)

    def before_weight(self) -> None:
        self.before = [None if w.grad is None else w.grad.detach().clone() for w in self.weights]

    def after_weight(self) -> None:
        """What W added to each `.grad` against the whole backward's; raises SplitMismatch."""
        added = [
            None if w.grad is None else (w.grad if b is None else w.grad - b)
            for w, b in zip(self.weights, self.before, strict=True)
        ]
        held = [0.0 if b is None or not b.numel() else b.abs().max().item() for b in self.before]
        self.before = []
        wrong = _compare("weights", added, self.expected, held)
        if wrong:
            raise SplitMismatch("weight", wrong)
