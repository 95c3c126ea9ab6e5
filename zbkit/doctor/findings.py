"""What the doctor found: one `Finding` per trap met, gathered in a `Report`.

A finding is data a learner can act on: which trap, where (stage, rank, parameter, module
or autograd node), what will happen on this torch, and the fix. A `Report` prints as text,
shows as a table in Jupyter, and is falsy-free: ask `report.ok` (no findings).
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["TRAPS", "Finding", "Report"]

# trap -> one line saying what it is; every finding's `trap` is one of these keys
TRAPS = {
    "compiled-region": "a torch.compile region in a stage whose backward is split",
    "shared-param-scaled-twice": "one parameter in two stages of one rank, grads scaled per stage",
    "shared-param-across-ranks": "one parameter in stages on different ranks, each with a copy",
    "weight-reused-in-stage": "a weight used twice in one stage, under torch's split backward",
    "input-not-reaching-loss": "a stage input that requires grad but does not reach the outputs",
    "ddp-under-split": "a DistributedDataParallel stage under a split backward or zbkit's runtimes",
    "reentrant-checkpoint": "checkpoint(use_reentrant=True) in a stage whose backward is split",
    "too-few-microbatches": "fewer microbatches (or rows) than the schedule needs",
    "stage-off-placement": "a stage on a rank the schedule's stage-to-rank map does not put it",
    "batch-indivisible": "a batch the microbatch count does not divide",
    "invalid-schedule": "a torch program zbkit's validator rejects (it would hang or fail)",
}


@dataclass(frozen=True)
class Finding:
    """One trap a run would fall into. `severity`: "fails" (it raises or hangs), "wrong"
    (it runs with wrong gradients) or "slower" (exact, but the split is lost)."""

    trap: str  # a key of TRAPS
    where: str  # "stage 2 (rank 0), parameter lin.weight", ...
    happens: str  # what the run will do
    fix: str
    severity: str = "fails"
    stage: int | None = None
    rank: int | None = None
    torch_version: str = field(default_factory=lambda: torch.__version__)

    def __post_init__(self) -> None:
        if self.trap not in TRAPS:
            raise ValueError(f"unknown trap {self.trap!r}: one of {', '.join(TRAPS)}")
        if self.severity not in ("fails", "wrong", "slower"):
            raise ValueError(f"severity must be fails/wrong/slower, got {self.severity!r}")

    def __str__(self) -> str:
        return (
            f"[{self.trap}] {self.where}: {self.happens} (torch {self.torch_version}). "
            f"Fix: {self.fix}"
        )


@dataclass(frozen=True)
class Report:
    """Every finding of one `check`, what was checked, and what could not be (and why)."""

    findings: tuple[Finding, ...]
    runtime: str  # "zbkit", "torch" or "torch+zbkit"
    schedule: str  # its name, pp and microbatches
    skipped: tuple[str, ...] = ()  # checks that did not run, each with its reason

    @property
    def ok(self) -> bool:
        """No finding: the run meets none of the traps the doctor knows."""
        return not self.findings

    def __len__(self) -> int:
        return len(self.findings)

    def __iter__(self) -> Iterator[Finding]:
        return iter(self.findings)

    def traps(self) -> list[str]:
        """The traps found, each once, in the order found."""
        return list(dict.fromkeys(f.trap for f in self.findings))

    def __repr__(self) -> str:
        return f"Report({self.schedule}, runtime={self.runtime!r}, findings={len(self)})"

    def __str__(self) -> str:
        head = (
            f"zbkit doctor: {self.schedule} on runtime {self.runtime!r}, torch {torch.__version__}"
        )
        lines = [head, f"  {len(self)} finding(s)" if self.findings else "  no findings"]
        lines += [f"- {f}" for f in self.findings]
        lines += [f"  (not checked: {s})" for s in self.skipped]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        esc = html.escape
        rows = "".join(
            f"<tr><td><code>{esc(f.trap)}</code></td><td>{esc(f.severity)}</td>"
            f"<td>{esc(f.where)}</td><td>{esc(f.happens)}</td><td>{esc(f.fix)}</td></tr>"
            for f in self.findings
        )
        table = (
            "<table><tr><th>trap</th><th>severity</th><th>where</th><th>what happens</th>"
            f"<th>fix</th></tr>{rows}</table>"
            if rows
            else "<p>no findings</p>"
        )
        notes = "".join(f"<li>not checked: {esc(s)}</li>" for s in self.skipped)
        title = esc(
            f"zbkit doctor: {self.schedule}, runtime {self.runtime!r}, torch {torch.__version__}"
        )
        return f"<div><b>{title}</b>{table}{f'<ul>{notes}</ul>' if notes else ''}</div>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": str(self), "text/html": self._repr_html_()}
