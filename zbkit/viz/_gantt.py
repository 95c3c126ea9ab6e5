"""What a schedule plot shades, computed apart from the drawing so tests can name it.

A rank's *span* runs from its first action's start to its last action's end: the bubble rate
(`zbkit.schedules.bubble_rate`, the paper's definition) counts the idle time inside it. The
time before the first action (warm-up) and after the last (cool-down) lies outside the span:
a rank that has not started yet, or is done, is not a bubble, so it gets its own shade.
"""

from __future__ import annotations

from collections.abc import Iterable

from matplotlib.colors import to_rgb

from zbkit.schedules import Event

Gap = tuple[float, float]  # (start, end) of idle time on one rank


def idle_gaps(events: Iterable[Event], rank: int, end: float) -> tuple[list[Gap], list[Gap]]:
    """(in-span gaps, edge gaps) of `rank`, on a timeline that runs from 0 to `end`.

    In-span gaps are what the bubble rate counts; edges are [0, first start) and
    (last end, `end`]. Gaps shorter than a millionth of the timeline are float noise.
    """
    mine = sorted((e.start, e.end) for e in events if e.rank == rank)
    if not mine:  # a rank with nothing to do: all of it is outside any span
        return [], [(0.0, end)] if end > 0 else []
    eps = 1e-6 * max(end, 1e-300)
    inside: list[Gap] = []
    free = mine[0][1]
    for start, stop in mine[1:]:
        if start - free > eps:
            inside.append((free, start))
        free = max(free, stop)
    edges = [(0.0, mine[0][0])] if mine[0][0] > eps else []
    if end - free > eps:
        edges.append((free, end))
    return inside, edges


def chunks(events: Iterable[Event]) -> dict[tuple[int, int], int]:
    """(rank, stage) -> which of the rank's stages it is (0 = its lowest stage).

    ZB-V's rank r holds stages r and 2p-1-r: chunk 0 on the way down, chunk 1 on the way back
    up; interleaved 1F1B's rank r holds r, r+p, ... The chunk is what makes the V visible.
    """
    stages: dict[int, set[int]] = {}
    for e in events:
        stages.setdefault(e.rank, set()).add(e.stage)
    return {(r, s): i for r, held in stages.items() for i, s in enumerate(sorted(held))}


def text_color(fill: str) -> str:
    """Black on light boxes, white on dark ones (a later chunk's colour)."""
    r, g, b = to_rgb(fill)
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.45 else "white"


def box_texts(e: Event) -> list[str]:
    """What a box may say, longest first; the plot writes the first that fits.

    `5F3` (stage, kind, microbatch: the same text as the program), then on two lines `5F`
    over `3`, then `F` over `3` (the box's colour still tells the chunk), then `3`. The kind
    letter outlasts the stage: colours alone are what a learner could not tell apart.
    """
    return [
        e.label,
        f"{e.stage}{e.kind}\n{e.microbatch}",
        f"{e.kind}\n{e.microbatch}",
        str(e.microbatch),
    ]


def pair_spans(events: Iterable[Event]) -> list[Gap]:
    """(start, end) of each overlapped pair (torch's OVERLAP_F_B): its two halves are
    consecutive paired events of one rank, drawn as one box around both."""
    spans, half = [], None
    for e in sorted((e for e in events if e.paired), key=lambda e: (e.rank, e.start)):
        if half is not None and half.rank == e.rank:
            spans.append((half.start, e.end))
            half = None
        else:
            half = e
    return spans
