"""torch.distributed.pipelining's schedules as zbkit `Schedule`s, and one-call comparisons.

`from_torch(obj)` (also `Schedule.from_torch`) reads a torch schedule object's
`pipeline_order` (`zbkit.schedules.core.torch_schedules`) and returns the zbkit schedule of
the same actions, with torch's stage placement; torch's transfers and FSDP actions are kept
as `torch_ops`. `from_torch(ScheduleZBVZeroBubble, pp=4, microbatches=8)` builds the torch
object first, on stand-in stages, so no process group is needed.

`compare_with_torch("zb-v", pp=4, microbatches=8)` puts torch's schedule next to zbkit's
builder of the same name: whether each validates (zbkit's message and grid when not), their
simulated makespan, bubble and peak memory, and the first position per rank where the two
programs differ.

torch is imported inside the functions: `zbkit.schedules` stays torch-free at import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from zbkit.schedules.builders import build_schedule
from zbkit.schedules.core.costs import MEMORY_UNIT, Costs
from zbkit.schedules.core.registry import torch_names
from zbkit.schedules.core.schedule import Schedule, ScheduleError
from zbkit.schedules.core.torch_schedules import resolve_class
from zbkit.schedules.sim.simulate import Simulation, simulate
from zbkit.schedules.sim.validate import validate

__all__ = ["TorchComparison", "compare_with_torch", "from_torch", "torch_names"]


def from_torch(
    schedule_or_class: Any,
    *,
    pp: int | None = None,
    microbatches: int | None = None,
    stages_per_rank: int | None = None,
) -> Schedule:
    """torch's schedule (an object, or a class or its name with `pp` and `microbatches`) as a
    `Schedule`.

    Named after zbkit's builder of the same schedule (`torch_names()`), placed as torch places
    it; torch's transfers and FSDP actions kept as `torch_ops`. Not validated: call
    `validate` (torch 2.13's `Schedule1F1B` draws an order its own validator rejects).
    """
    return Schedule.from_torch(
        schedule_or_class, pp=pp, microbatches=microbatches, stages_per_rank=stages_per_rank
    )


# ---------------------------------------------------------------------------- comparison
@dataclass
class TorchComparison:
    """torch's schedule beside zbkit's builder of the same name (`compare_with_torch`)."""

    name: str  # zbkit's builder name
    torch: Schedule
    zbkit: Schedule
    torch_error: str | None  # zbkit's validator on torch's program (None: valid)
    zbkit_error: str | None
    torch_sim: Simulation | None  # None where the program does not validate
    zbkit_sim: Simulation | None
    # rank -> (position, torch's item, zbkit's item) at the first difference ("-": none)
    differences: dict[int, tuple[int, str, str]] = field(default_factory=dict)

    @property
    def equal(self) -> bool:
        """Whether the two compute programs are equal, action for action, on every rank."""
        return not self.differences and self.torch.stage_to_rank == self.zbkit.stage_to_rank

    def __repr__(self) -> str:
        return (
            f"TorchComparison({self.name!r}, pp={self.torch.pp}, "
            f"m={self.torch.microbatches}, equal={self.equal}, "
            f"torch_valid={self.torch_error is None}, zbkit_valid={self.zbkit_error is None})"
        )

    def __str__(self) -> str:
        lines = [f"{self.name}: torch's schedule vs zbkit's, pp={self.torch.pp}, "
                 f"m={self.torch.microbatches}"]  # fmt: skip
        lines.append(f"{'':14}{'torch':>12}{'zbkit':>12}")
        lines.append(f"{'valid':14}{_yes(self.torch_error):>12}{_yes(self.zbkit_error):>12}")
        for label, get in (
            ("makespan", lambda s: f"{s.makespan:.4g}"),
            ("bubble rate", lambda s: f"{s.bubble_rate:.4f}"),
            ("peak memory", lambda s: f"{max(s.peak_memory):.4g}"),  # MEMORY_UNIT, said below
        ):
            cells = [get(s) if s is not None else "-" for s in (self.torch_sim, self.zbkit_sim)]
            lines.append(f"{label:14}{cells[0]:>12}{cells[1]:>12}")
        lines.append(f"{'':14}(peak memory: the busiest rank's, in {MEMORY_UNIT})")
        if self.torch.stage_to_rank != self.zbkit.stage_to_rank:
            lines.append(f"placement differs: torch {self.torch.stage_to_rank}, "
                         f"zbkit {self.zbkit.stage_to_rank}")  # fmt: skip
        if self.equal:
            lines.append("programs: equal, action for action")
        for rank, (pos, theirs, ours) in sorted(self.differences.items()):
            lines.append(f"rank {rank} differs first at position {pos}: torch {theirs}, "
                         f"zbkit {ours}")  # fmt: skip
        for who, err in (("torch", self.torch_error), ("zbkit", self.zbkit_error)):
            if err is not None:
                lines += ["", f"{who}'s program does not validate:", err]
        return "\n".join(lines)

    def _repr_pretty_(self, printer, cycle: bool) -> None:  # IPython: the table
        printer.text(str(self))


def _yes(error: str | None) -> str:
    return "yes" if error is None else "NO"


def _first_differences(a: Schedule, b: Schedule) -> dict[int, tuple[int, str, str]]:
    out = {}
    for rank in sorted(set(a.program) | set(b.program)):
        mine, theirs = a.program.get(rank, []), b.program.get(rank, [])
        for pos in range(max(len(mine), len(theirs))):
            x = mine[pos] if pos < len(mine) else None
            y = theirs[pos] if pos < len(theirs) else None
            if x != y:
                out[rank] = (pos, "-" if x is None else str(x), "-" if y is None else str(y))
                break
    return out


def _check(schedule: Schedule, costs: Costs | Sequence[Costs]) -> tuple[str | None, Any]:
    try:
        validate(schedule)
    except ScheduleError as err:
        return str(err), None
    return None, simulate(schedule, costs, check=False)


def compare_with_torch(
    name_or_class: str | type,
    *,
    pp: int,
    microbatches: int,
    costs: Costs | Sequence[Costs] | None = None,
    stages_per_rank: int | None = None,
) -> TorchComparison:
    """torch's schedule (a zbkit name like "zb-v", a torch class or its name) next to
    zbkit's builder of the same schedule: validity, simulated numbers, first differences."""
    cls_name, cls = resolve_class(name_or_class)
    theirs = from_torch(cls, pp=pp, microbatches=microbatches, stages_per_rank=stages_per_rank)
    name = torch_names()[cls_name]
    options: dict[str, Any] = (
        {} if stages_per_rank is None else {"stages_per_rank": stages_per_rank}
    )
    ours = build_schedule(name, pp=pp, microbatches=microbatches, **options)
    costs = Costs() if costs is None else costs
    torch_error, torch_sim = _check(theirs, costs)
    zbkit_error, zbkit_sim = _check(ours, costs)
    return TorchComparison(
        name, theirs, ours, torch_error, zbkit_error, torch_sim, zbkit_sim,
        _first_differences(theirs, ours),
    )  # fmt: skip
