"""Closed-form bubble rates from the papers, for the CLI to print beside the simulation.

They assume comm = 0 and, for ZB-H2 and ZB-V, T_F = T_I = T_W.
"""

from __future__ import annotations

from zbkit.schedules.simulate import Costs


def closed_form(name: str, p: int, m: int, costs: Costs, v: int = 1) -> tuple[str, float] | None:
    """(formula text, bubble rate), or None where no closed form applies."""
    F, I, W = costs.F, costs.I, costs.W  # noqa: E741
    work = m * (F + I + W)
    if costs.comm:
        return None
    if name in ("gpipe", "1f1b"):
        return "(p-1)(F+I+W) idle per rank", (p - 1) / (m + p - 1)
    if name == "interleaved-1f1b":
        return "(p-1)(F+I+W)/v idle per rank", (p - 1) / (v * m + p - 1)
    if name == "zb-h1" and I >= W:
        bubble = (p - 1) * (F + I - W)
        return "(p-1)(F+I-W) idle per rank", bubble / (work + bubble)
    equal = F == I == W
    if name == "zb-h2" and equal and m >= 2 * p - 1:
        return "0 for m >= 2p-1 with F = I = W", 0.0
    if name == "zb-v" and equal and m >= 2 * p:
        return "0 for m >= 2p with F = I = W", 0.0
    return None
