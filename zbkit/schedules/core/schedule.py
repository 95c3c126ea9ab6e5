"""`Schedule`: per-rank compute programs plus the stage placement, and its text forms.

The text form is torch.distributed.pipelining's CSV (`_dump_csv` / `_load_csv`): one rank
per row, comma-separated action strings (`0F0,0F1,0I0,0W0,...`; `B` is a full backward;
`(0F1;1B0)OVERLAP_F_B` an overlapped pair). torch's compute-only form writes empty cells
for idle steps (skipped); its compute_comms form also lists transfers and FSDP actions
(`1SEND_F3`, `0UNSHARD`, ...), kept as `torch_ops` (see `zbkit.schedules.core.torch_ops`) so
the file writes back unchanged.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from os import PathLike
from typing import cast

from zbkit._display import show
from zbkit.schedules.core.action import Action, Overlap, parse_item
from zbkit.schedules.core.costs import TOL, Costs
from zbkit.schedules.core.grid import render_grid
from zbkit.schedules.core.plan import Plan, plan_of
from zbkit.schedules.core.torch_ops import TorchOp, derive_torch_ops, parse_torch_op
from zbkit.schedules.core.torch_schedules import read_torch

__all__ = ["Proof", "Schedule", "ScheduleError", "derive_plan", "expect_schedule"]


class ScheduleError(ValueError):
    """A schedule that cannot run: the message names rank, position and action."""


@dataclass(frozen=True)
class Proof:
    """A certified lower bound on the longest rank span of any schedule of a program's sizes
    and placement that holds at most `memory_limit`, for these per-stage `costs`: what zb-auto
    or the solver found out, carried by the schedule it built. It speaks for that program
    only (`holds`): an edited program, other costs or a higher peak void it."""

    costs: tuple[Costs, ...]
    memory_limit: float
    lower_bound: float
    program: tuple[tuple[Action | Overlap, ...], ...]  # per rank, as proven

    @classmethod
    def of(
        cls,
        program: Mapping[int, Sequence[Action | Overlap]],
        costs: Sequence[Costs],
        memory_limit: float,
        lower_bound: float,
    ) -> Proof:
        return cls(tuple(costs), float(memory_limit), float(lower_bound), _rows(program))

    def holds(self, schedule: Schedule, costs: Sequence[Costs], peak: float) -> bool:
        """Whether it speaks for `schedule` under per-stage `costs` at this `peak`."""
        same_costs = list(self.costs) == list(costs)
        return (
            same_costs
            and peak <= self.memory_limit + TOL
            and _rows(schedule.program) == self.program
        )


def _rows(program: Mapping[int, Sequence[Action | Overlap]]) -> tuple[tuple, ...]:
    return tuple(tuple(program.get(r, ())) for r in range(max(program, default=-1) + 1))


@dataclass(eq=True)
class Schedule:
    """Ordered compute actions per rank and where each stage lives.

    program[rank] is run top to bottom, one action at a time; `stage_to_rank[s]` is the
    rank holding stage s. Communication is not listed: a runtime derives it from the
    placement (an F whose previous stage is on another rank needs a receive, and so on).
    """

    program: Mapping[int, Sequence[Action | Overlap]]
    stage_to_rank: list[int]
    microbatches: int
    name: str = field(default="custom", compare=False)
    # torch's transfers and FSDP actions between the compute items, as loaded: per rank,
    # (slot = compute items before it, op); empty for schedules zbkit builds
    torch_ops: dict[int, list[tuple[int, TorchOp]]] = field(default_factory=dict)
    # what the search or the solver that built it proved (None: nothing): `bound_for` reads it
    proof: Proof | None = field(default=None, compare=False, repr=False)

    @property
    def pp(self) -> int:
        """Number of ranks (pipeline-parallel size)."""
        return max(self.stage_to_rank) + 1 if self.stage_to_rank else len(self.program)

    @property
    def num_stages(self) -> int:
        return len(self.stage_to_rank)

    @property
    def stages_per_rank(self) -> int:
        """`v` in the bubble formulas (1 for 1F1B, 2 for ZB-V)."""
        return max(1, self.num_stages // max(1, self.pp))

    def stages_on(self, rank: int) -> list[int]:
        return [s for s, r in enumerate(self.stage_to_rank) if r == rank]

    def is_first_stage(self, stage: int) -> bool:
        """Stage 0 reads the inputs (its F receives nothing)."""
        return stage == 0

    def is_last_stage(self, stage: int) -> bool:
        """The last stage computes the loss (its I/B receives no gradient)."""
        return stage == self.num_stages - 1

    def __len__(self) -> int:
        return sum(len(actions) for actions in self.program.values())

    def actions(self, rank: int) -> list[Action]:
        """`rank`'s actions in order, an overlapped pair's two halves one after the other."""
        row = self.program.get(rank, [])
        if all(type(item) is Action for item in row):  # no pairs: the common, cheap case
            return list(cast(Sequence[Action], row))
        return [h for item in row for h in item.halves]

    def __repr__(self) -> str:
        return (
            f"Schedule({self.name!r}, pp={self.pp}, num_stages={self.num_stages}, "
            f"microbatches={self.microbatches}, actions={len(self)})"
        )

    def __str__(self) -> str:
        return self.to_grid()

    def to_grid(self, marks: Sequence[tuple[int, int]] = (), comms: bool = False) -> str:
        """Rank-by-step grid; `marks` = (rank, position) cells to flag `<-- ERROR HERE`.
        `comms=True`: torch's lowered rows, its transfers and FSDP actions in their places
        (the loaded `torch_ops`, else the transfers `to_csv(comms=True)` would write)."""
        if comms:
            ops = self.lowered_ops()
            rows = {r: self.row(r, ops.get(r, [])) for r in range(self.pp)}
            return render_grid(rows, marks, window=bool(marks))
        return render_grid(self.program, marks, window=bool(marks))

    def lowered_ops(self) -> dict[int, list[tuple[int, TorchOp]]]:
        """torch's non-compute actions per rank: the loaded `torch_ops`, or else the
        transfers derived from the placement (what torch's own lowering pass makes)."""
        if any(self.torch_ops.values()):
            return self.torch_ops
        return derive_torch_ops(self.program, self.stage_to_rank)

    def _repr_pretty_(self, printer, cycle: bool) -> None:  # IPython: show the grid
        printer.text(repr(self) + "\n" + self.to_grid())

    def _repr_html_(self) -> str:  # a notebook: the grid as a table, kinds coloured
        return show(self)  # zbkit.viz draws it (zbkit._display: data never imports viz)

    @classmethod
    def from_program(
        cls,
        program: Mapping[int, Sequence[Action | Overlap | str]]
        | Sequence[Sequence[Action | Overlap | str]],
        stage_to_rank: Sequence[int] | None = None,
        microbatches: int | None = None,
        name: str = "custom",
    ) -> Schedule:
        """Build from hand-written programs (actions or strings like "0F1", "0F1+1B0").

        `stage_to_rank` defaults to where each stage's actions appear, `microbatches` to the
        largest microbatch index + 1. Call `validate` to check the result.
        """
        items = program.items() if isinstance(program, Mapping) else enumerate(program)
        parsed: dict[int, list[Action | Overlap]] = {}
        for rank, actions in items:
            row = []
            for pos, a in enumerate(actions):
                try:
                    row.append(a if isinstance(a, Action | Overlap) else parse_item(a))
                except (ValueError, TypeError) as err:
                    raise ScheduleError(f"rank {rank}, position {pos}: {err}") from None
            parsed[int(rank)] = row
        if stage_to_rank is None:
            stage_to_rank = _infer_placement(parsed)
        if microbatches is None:
            microbatches = 1 + max(
                (h.microbatch for r in parsed.values() for a in r for h in a.halves), default=-1
            )
            _check_index(parsed, "microbatch", microbatches)
        return cls(parsed, list(stage_to_rank), int(microbatches), name)

    # --- torch.distributed.pipelining CSV form -------------------------------------------
    def to_csv(self, comms: bool | None = None) -> str:
        """torch's CSV text: compute only (`comms=False`), or torch's compute_comms form
        with transfers (`comms=True`: the loaded ones, else derived from the placement as
        `derive_plan` does); by default, as loaded (with its torch_ops if it had any)."""
        if comms is None:
            ops = self.torch_ops  # as loaded
        else:
            ops = self.lowered_ops() if comms else {}
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        for rank in range(self.pp):
            writer.writerow(self.row(rank, ops.get(rank, [])))
        return out.getvalue()

    def row(self, rank: int, ops: Sequence[tuple[int, TorchOp]] | None = None) -> list[str]:
        """`rank`'s actions as torch writes them, its torch_ops (or `ops`) in their places."""
        ops = sorted(self.torch_ops.get(rank, []) if ops is None else ops, key=lambda x: x[0])
        cells, k = [], 0
        for slot, item in enumerate(self.program.get(rank, [])):
            while k < len(ops) and ops[k][0] <= slot:
                cells.append(str(ops[k][1]))
                k += 1
            cells.append(_torch_form(item))
        cells += [str(op) for _, op in ops[k:]]
        return cells

    @classmethod
    def from_csv(
        cls,
        text: str,
        stage_to_rank: Sequence[int] | None = None,
        microbatches: int | None = None,
        name: str = "loaded",
    ) -> Schedule:
        program: dict[int, list[Action | Overlap]] = {}
        ops: dict[int, list[tuple[int, TorchOp]]] = {}
        for rank, row in enumerate(csv.reader(io.StringIO(text))):
            program[rank], ops[rank] = [], []
            for col, cell in enumerate(row):
                item = _read_cell(cell.strip(), rank, col)
                if isinstance(item, TorchOp):
                    ops[rank].append((len(program[rank]), item))
                elif item is not None:
                    program[rank].append(item)
        schedule = cls.from_program(program, stage_to_rank, microbatches, name)
        if any(ops.values()):
            schedule.torch_ops = ops
        return schedule

    def save(self, path: str | PathLike) -> None:
        with open(path, "w", newline="") as f:
            f.write(self.to_csv())

    @classmethod
    def load(
        cls,
        path: str | PathLike,
        stage_to_rank: Sequence[int] | None = None,
        microbatches: int | None = None,
    ) -> Schedule:
        with open(path, newline="") as f:
            return cls.from_csv(f.read(), stage_to_rank, microbatches, name=str(path))

    @classmethod
    def from_torch(
        cls,
        schedule_or_class,
        *,
        pp: int | None = None,
        microbatches: int | None = None,
        stages_per_rank: int | None = None,
    ) -> Schedule:
        """torch.distributed.pipelining's schedule (object, or class with sizes) as a
        `Schedule`, named after zbkit's builder of the same schedule and placed as torch
        places it; torch's transfers and FSDP actions kept as `torch_ops`. Not validated:
        call `validate` (torch 2.13's `Schedule1F1B` draws an order its own validator
        rejects). See `zbkit.schedules.core.torch_schedules`."""
        rows = read_torch(
            schedule_or_class, pp=pp, microbatches=microbatches, stages_per_rank=stages_per_rank
        )
        return cls.from_csv(rows.text, rows.stage_to_rank, rows.microbatches, rows.name)


def derive_plan(schedule: Schedule, rank: int) -> Plan:
    """``rank``'s compute actions with the ``Comm`` each one needs around it
    (``zbkit.schedules.core.plan``): before an action, a receive for each input made on
    another rank; after it, a send for each rank that consumes what it makes.
    ``print(derive_plan(build_schedule("1f1b", pp=2, microbatches=2), 0))`` shows rank 0's;
    ``ScheduleRunner.plan`` is this."""
    expect_schedule(schedule, "derive_plan")
    return plan_of(schedule.program.get(rank, []), schedule.stage_to_rank, rank)


def expect_schedule(value: object, who: str) -> Schedule:
    """``value`` if it is a ``Schedule``; else a TypeError saying how to make one from it."""
    if isinstance(value, Schedule):
        return value
    if isinstance(value, str):
        hint = (
            f"the string {value!r}: build it first, "
            f"build_schedule({value!r}, pp=..., microbatches=...)"
        )
    elif (getattr(value, "__module__", "") or "").startswith("torch.distributed.pipelining"):
        name = getattr(value, "__name__", type(value).__name__)
        hint = (
            f"torch's {name}: convert it with Schedule.from_torch(schedule) (a class needs "
            "its sizes: Schedule.from_torch(cls, pp=..., microbatches=...))"
        )
    else:
        hint = f"{type(value).__name__}"
    raise TypeError(
        f"{who} takes a zbkit Schedule (from build_schedule, Schedule.from_torch or "
        f"Schedule.load), got {hint}"
    )


def _read_cell(cell: str, rank: int, col: int) -> Action | Overlap | TorchOp | None:
    """One CSV cell: None for an idle step (torch's compute-only form leaves it empty)."""
    if not cell:
        return None
    try:
        return parse_torch_op(cell) or parse_item(cell)
    except ValueError as err:
        raise ScheduleError(f"row {rank} (rank {rank}), column {col}: {err}") from None


def _torch_form(item: Action | Overlap) -> str:
    return item.torch_form() if isinstance(item, Overlap) else str(item)


def _check_index(program: Mapping[int, Sequence[Action | Overlap]], what: str, count: int) -> None:
    """A schedule runs every stage on every microbatch: an index far above the number of
    actions cannot be right (and would cost memory in proportion to it): one line."""
    total = sum(len(actions) for actions in program.values())
    if count <= total:
        return
    rank, pos, a = max(
        ((r, p, h) for r, acts in program.items() for p, a in enumerate(acts) for h in a.halves),
        key=lambda x: getattr(x[2], what),
    )
    raise ScheduleError(
        f"rank {rank}, position {pos}: {a} has {what} {getattr(a, what)}, but the schedule "
        f"has only {total} actions: every {what} 0..N-1 must appear, so N is at most {total}"
    )


def _runs(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5' (at most 6 runs shown)."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    text = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:6]]
    return ", ".join(text) + (f", ... ({len(numbers)} in all)" if len(runs) > 6 else "")


def _infer_placement(program: Mapping[int, Sequence[Action | Overlap]]) -> list[int]:
    where: dict[int, tuple[int, int]] = {}  # stage -> (rank, position) of first sight
    for rank in sorted(program):
        for pos, item in enumerate(program[rank]):
            for a in item.halves:
                seen = where.setdefault(a.stage, (rank, pos))
                if seen[0] != rank:
                    raise ScheduleError(
                        f"rank {rank}, position {pos}: {a} runs stage {a.stage}, which rank "
                        f"{seen[0]} also runs (position {seen[1]}); a stage lives on one rank"
                    )
    if not where:
        return []
    _check_index(program, "stage", max(where) + 1)
    missing = [s for s in range(max(where) + 1) if s not in where]
    if missing:
        raise ScheduleError(
            f"no rank runs stage(s) {_runs(missing)}: pass stage_to_rank= explicitly or add "
            "their actions"
        )
    return [where[s][0] for s in range(max(where) + 1)]
