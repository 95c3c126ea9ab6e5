"""Textbook bubble and memory formulas, shown beside the simulator's numbers (by the
`zbkit schedule` command and the ScheduleExplorer widget).

`costs` is one rank's share of the model per microbatch (`Costs`' rule): a rank does
m * (F + I + W) work whatever its number of chunks v, and each of its v stages takes 1/v of
F, I, W and of the activations. A bubble of `b` time units gives the rate b / (b + m(F+I+W)).
Memory is in units of one rank's activations for one microbatch. The formulas ignore `comm`
(the simulator does not). zb-v's are those of the paper's fixed construction (what
`build_schedule("zb-v")` returns); zb-auto searches, so it has none.
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
    if name in ("gpipe", "1f1b"):
        formula, value = "(p-1)(F+I+W)", p1 * (f + i + w)
    elif name == "interleaved-1f1b":  # the same count of steps, each a stage 1/v as long
        formula, value = "(p-1)(F+I+W)/v", p1 * (f + i + w) / v
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
    work = m * (f + i + w)
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
    if name == "interleaved-1f1b" and m >= 2 * pp:  # chunk-microbatches, each 1/v of a share
        return "min(2(p-r-1)+(v-1)p+1, mv)/v", [
            a * min(2 * (pp - r - 1) + (v - 1) * pp + 1, m * v) / v for r in ranks
        ]
    if name == "zb-v" and m >= 2 * pp:  # 2p half-size chunks: p rank shares, like 1F1B's rank 0
        return "p", [a * pp for _ in ranks]
    return None
