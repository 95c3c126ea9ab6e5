"""Rank-by-step text grid of a schedule, with marked cells: `<-- ERROR HERE` where the
validator or a runner failed, `<-- WAITING HERE` where `zbkit.debug` found a rank waiting."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

# Errors show a window of steps around the failing cells so a 768-step program stays readable.
_CONTEXT = 6

ERROR = "<-- ERROR HERE"  # a cell the validator rejects or a runner failed in
WAITING = "<-- WAITING HERE"  # the action a rank sits waiting in (zbkit.debug)


def render_grid(
    program: Mapping[int, Sequence[object]],
    marks: Iterable[tuple[int, int]] = (),
    window: bool = False,
    marker: str = ERROR,
) -> str:
    """One row per rank, one column per position in that rank's program.

    `marks` are (rank, position) cells to bracket; their rows end in `marker` (`ERROR` or
    `WAITING`). A position equal to the program's length marks "the end of the program".
    `window`: only the steps around the marks.
    """
    marks = set(marks)
    ranks = sorted(program)
    length = max((len(program[r]) for r in ranks), default=0)
    first, last = 0, length  # columns shown: [first, last)
    if window and marks:
        first = max(0, min(p for _, p in marks) - _CONTEXT)
        last = min(length, max(p for _, p in marks) + _CONTEXT + 1)
    last = max(last, max((p + 1 for _, p in marks), default=0))
    cells = {
        (r, p): str(program[r][p]) for r in ranks for p in range(first, min(last, len(program[r])))
    }
    width = max([len(c) for c in cells.values()] + [len(str(last - 1)), 3])
    label = max(len(f"rank {r}") for r in ranks) if ranks else 4

    def cell(text: str, marked: bool) -> str:
        return f"[{text:^{width}}]" if marked else f" {text:^{width}} "

    lead = "... " if first > 0 else ""
    tail = " ..." if last < length else ""
    header = f"{'step':<{label}} {lead}" + "".join(cell(str(p), False) for p in range(first, last))
    lines = [header.rstrip()]
    for r in ranks:
        row = "".join(
            cell(cells.get((r, p), "." if (r, p) in marks else ""), (r, p) in marks)
            for p in range(first, last)
        )
        line = f"{f'rank {r}':<{label}} {lead}{row}{tail}".rstrip()
        if any(m[0] == r for m in marks):
            line += f"  {marker}"
        lines.append(line)
    return "\n".join(lines)


def as_waiting(text: str) -> str:
    """`text` (a traceback holding a runner's note) with its error-marked grid rows re-marked
    as waiting: a runner marks where its wait failed, which `zbkit.debug` reports as the
    place the rank waited."""
    return text.replace(ERROR, WAITING)
