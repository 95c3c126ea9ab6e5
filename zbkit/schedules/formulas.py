"""Textbook bubble and memory formulas, shown beside the simulator's numbers (by the
`zbkit schedule` command and the ScheduleExplorer widget).

Costs are per stage and microbatch; a rank holding v stages does m * v * (F + I + W) work,
so a bubble of `b` time units gives the rate b / (b + m * v * (F + I + W)). The formulas
ignore `comm` (the simulator does not). zb-v's are those of the paper's fixed construction
(what `build_schedule("zb-v")` returns); zb-auto searches, so it has none.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class ClosedForm(NamedTuple):
    formula: str  # e.g. "(p-1)(F+I+W)"
    bubble: float  # idle time of the busiest rank, in cost units
    rate: float  # bubble / (bubble + work)


def bubble(name: str, pp: int, m: int, v: int, costs: Any) -> ClosedForm | None:
    """The paper's bubble for `name`, or None where it has no closed form (or its
    assumptions fail)."""
    f, i, w = costs.F, costs.I, costs.W
    p1 = pp - 1
    if name in ("gpipe", "1f1b", "interleaved-1f1b"):
        # interleaving shrinks the stage, not the count: costs here are per stage already
        formula, value = "(p-1)(F+I+W)", p1 * (f + i + w)
    elif name == "zb-h1" and w <= min(f, i) and m >= pp:
        formula, value = "(p-1)(F+I-W)", p1 * (f + i - w)
    elif name == "zb-h2" and f == i == w and m >= 2 * pp - 1:
        formula, value = "0 (F = I = W, m >= 2p-1)", 0.0
    elif name == "zb-h2" and m >= 2 * pp:  # needs enough microbatches to fill the warm-up
        formula, value = "max(0, (p-1)(F+I-2W))", max(0.0, p1 * (f + i - 2 * w))
    elif name == "zb-v" and f == i == w and m >= 2 * pp:
        formula, value = "0 (F = I = W)", 0.0
    else:
        return None
    work = m * v * (f + i + w)
    return ClosedForm(formula, value, value / (value + work) if value + work > 0 else 0.0)


# where each closed form holds: said instead of a number when `bubble` returns None
CONDITIONS = {
    "zb-h1": "W <= min(F, I) and m >= p",
    "zb-h2": "m >= 2p (or F = I = W and m >= 2p-1)",
    "zb-v": "F = I = W and m >= 2p",
}


def peak_memory(name: str, pp: int, m: int, v: int, costs: Any) -> tuple[str, list[float]] | None:
    """Activations held at the peak, per rank (valid when mem_weight = 0), or None.

    The interleaved and ZB-V formulas are the steady-state ones, so they need m >= 2p.
    """
    if costs.mem_weight != 0:
        return None
    a = costs.mem_activation
    ranks = range(pp)
    if name == "gpipe":
        return "m", [a * m for _ in ranks]
    if name in ("1f1b", "zb-h1"):
        return "min(p-r, m)", [a * min(pp - r, m) for r in ranks]
    if name == "zb-h2":
        return "min(2(p-r)-1, m)", [a * min(2 * (pp - r) - 1, m) for r in ranks]
    if name == "interleaved-1f1b" and m >= 2 * pp:
        return "min(2(p-r-1)+(v-1)p+1, mv)", [
            a * min(2 * (pp - r - 1) + (v - 1) * pp + 1, m * v) for r in ranks
        ]
    if name == "zb-v" and m >= 2 * pp:
        return "2p", [a * 2 * pp for _ in ranks]
    return None
