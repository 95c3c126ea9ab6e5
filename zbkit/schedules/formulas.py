"""Textbook bubble and memory formulas, shown beside the simulator's numbers (by the
`zbkit schedule` command and the ScheduleExplorer widget).

`costs` is one rank's share of the model per microbatch (`Costs`' rule): a rank does
m * (F + I + W) work whatever its number of chunks v, and each of its v stages takes 1/v of
F, I, W and of the activations. A bubble of `b` time units gives the rate b / (b + m(F+I+W)).
Memory is in units of one rank's activations for one microbatch. The formulas ignore `comm`
(the simulator does not). zb-v's are those of the paper's fixed construction (what
`build_schedule("zb-v")` returns); zb-auto searches, so it has none.

Each schedule's record (`catalog.ScheduleRecord.formulas`) names its functions below and the
conditions under which they hold; `bubble(name, ...)` and `peak_memory(name, ...)` look them
up by name.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from zbkit.schedules.core.registry import RECORDS

# a bubble formula: (pp, m, v, costs) -> (its text, idle time), or None where it does not hold
Bubble = tuple[str, float]
# a peak-memory formula: (pp, m, v, costs) -> (its text, activations per rank), or None
Peak = tuple[str, list[float]]


class ClosedForm(NamedTuple):
    formula: str  # e.g. "(p-1)(F+I+W)"
    bubble: float  # idle time of the busiest rank, in cost units
    rate: float  # bubble / (bubble + work)


# ---- bubbles, per construction (the record says which is whose) ---------------------------
def one_f_one_b_bubble(pp: int, m: int, v: int, c: Any) -> Bubble:
    """1F1B's (and GPipe's) bubble: p-1 stages' F+I+W at each end of the step."""
    return "(p-1)(F+I+W)", (pp - 1) * (c.F + c.I + c.W)  # GPipe's too


def interleaved_bubble(pp: int, m: int, v: int, c: Any) -> Bubble:
    """Interleaved 1F1B's bubble: 1F1B's, over v chunks per rank."""
    # the same count of steps, each a stage 1/v as long
    return "(p-1)(F+I+W)/v", (pp - 1) * (c.F + c.I + c.W) / v


def zb_h1_bubble(pp: int, m: int, v: int, c: Any) -> Bubble | None:
    """ZB-H1's bubble, where W <= min(F, I) and m >= p: each W fills part of one."""
    if c.W <= min(c.F, c.I) and m >= pp:
        return "(p-1)(F+I-W)", (pp - 1) * (c.F + c.I - c.W)
    return None


def zb_h2_bubble(pp: int, m: int, v: int, c: Any) -> Bubble | None:
    """ZB-H2's bubble: none with equal costs (m >= 2p-1); else (p-1)(F+I-2W), m >= 2p."""
    if c.F == c.I == c.W and m >= 2 * pp - 1:
        return "0 (F = I = W, m >= 2p-1)", 0.0
    if m >= 2 * pp:  # needs enough microbatches to fill the warm-up
        return "max(0, (p-1)(F+I-2W))", max(0.0, (pp - 1) * (c.F + c.I - 2 * c.W))
    return None


def zb_v_bubble(pp: int, m: int, v: int, c: Any) -> Bubble | None:
    """ZB-V's bubble: none with equal costs and m >= 2p (no closed form otherwise)."""
    if c.F == c.I == c.W and m >= 2 * pp:
        return "0 (F = I = W)", 0.0
    return None


# ---- peak activations per rank (valid when mem_weight = 0) ---------------------------------
def gpipe_peak(pp: int, m: int, v: int, c: Any) -> Peak:
    """GPipe's peak per rank: every microbatch's activations, m."""
    return "m", [c.mem_activation * m for _ in range(pp)]


def one_f_one_b_peak(pp: int, m: int, v: int, c: Any) -> Peak:  # ZB-H1's too
    """1F1B's peak on rank r: the p-r microbatches in flight (at most m)."""
    return "min(p-r, m)", [c.mem_activation * min(pp - r, m) for r in range(pp)]


def zb_h2_peak(pp: int, m: int, v: int, c: Any) -> Peak:
    """ZB-H2's peak on rank r: 2(p-r)-1 microbatches (at most m)."""
    return "min(2(p-r)-1, m)", [c.mem_activation * min(2 * (pp - r) - 1, m) for r in range(pp)]


def interleaved_peak(pp: int, m: int, v: int, c: Any) -> Peak | None:
    """Interleaved 1F1B's steady-state peak per rank (m >= 2p), in rank shares."""
    if m < 2 * pp:  # the steady-state formula: chunk-microbatches, each 1/v of a share
        return None
    held = [min(2 * (pp - r - 1) + (v - 1) * pp + 1, m * v) / v for r in range(pp)]
    return "min(2(p-r-1)+(v-1)p+1, mv)/v", [c.mem_activation * x for x in held]


def zb_v_peak(pp: int, m: int, v: int, c: Any) -> Peak | None:
    """ZB-V's steady-state peak (m >= 2p): p on every rank."""
    if m < 2 * pp:  # steady state only
        return None
    return "p", [c.mem_activation * pp for _ in range(pp)]  # 2p half-size chunks: p shares


# ---- by name ------------------------------------------------------------------------------
def _formulas(name: str) -> Any:
    """The record's `Formulas` (None for a search, or a loaded schedule's unknown name)."""
    found = RECORDS.get(name)
    return found.formulas if found is not None else None


def bubble(name: str, pp: int, m: int, v: int, costs: Any) -> ClosedForm | None:
    """The paper's bubble for `name`, or None where it has no closed form (or its
    assumptions fail: `conditions(name)` says which)."""
    forms = _formulas(name)
    got = forms.bubble(pp, m, v, costs) if forms is not None else None
    if got is None:
        return None
    formula, value = got
    work = m * (costs.F + costs.I + costs.W)
    return ClosedForm(formula, value, value / (value + work) if value + work > 0 else 0.0)


def conditions(name: str) -> str:
    """Where `name`'s closed forms hold ("" where always, or where it has none)."""
    forms = _formulas(name)
    return forms.conditions if forms is not None else ""


def peak_memory(name: str, pp: int, m: int, v: int, costs: Any) -> Peak | None:
    """Activations held at the peak, per rank (valid when mem_weight = 0), or None.

    The interleaved and ZB-V formulas are the steady-state ones, so they need m >= 2p.
    """
    forms = _formulas(name)
    if costs.mem_weight != 0 or forms is None or forms.peak is None:
        return None
    return forms.peak(pp, m, v, costs)
