"""`Schedule`: per-rank compute programs plus the stage placement, and its text forms.

The text form is torch.distributed.pipelining's CSV (`_dump_csv` / `_load_csv`): one rank
per row, comma-separated action strings (`0F0,0F1,0I0,0W0,...`; `B` is a full backward).
torch writes empty cells for idle steps and may include communication actions; loading
skips both, because a compute program plus the placement is all a schedule needs here.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from os import PathLike

from zbkit.schedules._grid import render_grid
from zbkit.schedules.action import Action, _clip

__all__ = ["Schedule", "ScheduleError"]

# torch's non-compute actions (communication, FSDP resharding): dropped on load
_TORCH_NON_COMPUTE = re.compile(
    r"^\d+(UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)\d*$"
)


class ScheduleError(ValueError):
    """A schedule that cannot run: the message names rank, position and action."""


@dataclass(eq=True)
class Schedule:
    """Ordered compute actions per rank and where each stage lives.

    program[rank] is run top to bottom, one action at a time; `stage_to_rank[s]` is the
    rank holding stage s. Communication is not listed: a runtime derives it from the
    placement (an F whose previous stage is on another rank needs a receive, and so on).
    """

    program: dict[int, list[Action]]
    stage_to_rank: list[int]
    microbatches: int
    name: str = field(default="custom", compare=False)

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

    def __repr__(self) -> str:
        return (
            f"Schedule({self.name!r}, pp={self.pp}, num_stages={self.num_stages}, "
            f"microbatches={self.microbatches}, actions={len(self)})"
        )

    def __str__(self) -> str:
        return self.to_grid()

    def to_grid(self, marks: Sequence[tuple[int, int]] = ()) -> str:
        """Rank-by-step grid; `marks` = (rank, position) cells to flag `<-- ERROR HERE`."""
        return render_grid(self.program, marks, window=bool(marks))

    def _repr_pretty_(self, printer, cycle: bool) -> None:  # IPython: show the grid
        printer.text(repr(self) + "\n" + self.to_grid())

    @classmethod
    def from_program(
        cls,
        program: Mapping[int, Sequence[Action | str]] | Sequence[Sequence[Action | str]],
        stage_to_rank: Sequence[int] | None = None,
        microbatches: int | None = None,
        name: str = "custom",
    ) -> Schedule:
        """Build from hand-written programs (actions or strings like "0F1").

        `stage_to_rank` defaults to where each stage's actions appear, `microbatches` to the
        largest microbatch index + 1. Call `validate` to check the result.
        """
        items = program.items() if isinstance(program, Mapping) else enumerate(program)
        parsed: dict[int, list[Action]] = {}
        for rank, actions in items:
            row = []
            for pos, a in enumerate(actions):
                try:
                    row.append(a if isinstance(a, Action) else Action.parse(a))
                except (ValueError, TypeError) as err:
                    raise ScheduleError(f"rank {rank}, position {pos}: {err}") from None
            parsed[int(rank)] = row
        if stage_to_rank is None:
            stage_to_rank = _infer_placement(parsed)
        if microbatches is None:
            microbatches = 1 + max((a.microbatch for r in parsed.values() for a in r), default=-1)
            _check_index(parsed, "microbatch", microbatches)
        return cls(parsed, list(stage_to_rank), int(microbatches), name)

    # --- torch.distributed.pipelining CSV form -------------------------------------------
    def to_csv(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        for rank in range(self.pp):
            writer.writerow([str(a) for a in self.program.get(rank, [])])
        return out.getvalue()

    @classmethod
    def from_csv(
        cls,
        text: str,
        stage_to_rank: Sequence[int] | None = None,
        microbatches: int | None = None,
        name: str = "loaded",
    ) -> Schedule:
        program: dict[int, list[Action]] = {}
        for rank, row in enumerate(csv.reader(io.StringIO(text))):
            program[rank] = []
            for col, cell in enumerate(row):
                program[rank].extend(_read_cell(cell.strip(), rank, col))
        return cls.from_program(program, stage_to_rank, microbatches, name)

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


def _read_cell(cell: str, rank: int, col: int) -> list[Action]:
    if not cell or _TORCH_NON_COMPUTE.match(cell):
        return []  # an idle step, or communication that we derive ourselves
    where = f"row {rank} (rank {rank}), column {col}"
    if cell.startswith("("):  # torch's "(0F1;1B0)OVERLAP_F_B": run the parts in order
        if ")" not in cell:
            raise ScheduleError(
                f"{where}: {_clip(cell)} has no closing ')': write an overlapped pair as "
                "(0F1;0B0)OVERLAP_F_B"
            )
        inner = cell[1 : cell.index(")")]
        return [a for part in inner.split(";") for a in _read_cell(part.strip(), rank, col)]
    try:
        return [Action.parse(cell)]
    except ValueError as err:
        raise ScheduleError(f"{where}: {err}") from None


def _check_index(program: Mapping[int, Sequence[Action]], what: str, count: int) -> None:
    """A schedule runs every stage on every microbatch: an index far above the number of
    actions cannot be right (and would cost memory in proportion to it): one line."""
    total = sum(len(actions) for actions in program.values())
    if count <= total:
        return
    rank, pos, a = max(
        ((r, p, a) for r, acts in program.items() for p, a in enumerate(acts)),
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


def _infer_placement(program: Mapping[int, Sequence[Action]]) -> list[int]:
    where: dict[int, tuple[int, int]] = {}  # stage -> (rank, position) of first sight
    for rank in sorted(program):
        for pos, a in enumerate(program[rank]):
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
