"""Notebook 04's exercises: memory peaks, zb-auto's smallest limit, a real run's peak, a sweep.

Each checker works its answer out with zbkit: the simulator (04.1, 04.4), zb-auto's own
builder tried limit by limit (04.2) and a real `LocalPipeline` run (04.3). The sizes and
costs are the notebook's: p = 4, m = 8, memory in rank-microbatches (`MEMORY_UNIT`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from zbkit.exercises._core import exercise, is_count, is_number
from zbkit.pipeline import LocalPipeline
from zbkit.schedules import Costs, Simulation, build_schedule, simulate
from zbkit.schedules.core.costs import TOL

P, M = 4, 8  # the notebook's pipeline
EQUAL = Costs(F=1, I=1, W=1, mem_activation=1.0, mem_weight=0.3)  # its first costs
SWEEP = Costs(F=1, I=1, W=0.5, mem_activation=1.0, mem_weight=0.3)  # the sweep's


def as_numbers(answer: Any) -> list[float] | None:
    """A list or tuple of numbers as floats; None if it is not one."""
    if not isinstance(answer, list | tuple) or not all(is_number(x) for x in answer):
        return None
    return [float(x) for x in answer]


def _same(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) < 1e-6 for x, y in zip(a, b, strict=True))


def _shown(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"


def _peaks(name: str, costs: Costs, pp: int = P, m: int = M) -> list[float]:
    return simulate(build_schedule(name, pp=pp, microbatches=m), costs).peak_memory


@exercise("04.1", "ZB-H1's peaks per rank, rank 0 first, with mem_weight = mem_activation = 1")
def zb_h1_peaks_when_w_holds_all(answer: Any) -> tuple[bool, str]:
    heavy = Costs(F=1, I=1, W=1, mem_activation=1.0, mem_weight=1.0)  # I frees nothing
    want, before = _peaks("zb-h1", heavy), _peaks("zb-h1", EQUAL)
    got = as_numbers(answer)
    if got is None:
        return (
            False,
            f"give a list of {P} numbers, rank 0 first, such as [4, 3, 2, 1]; got {answer!r}",
        )
    if len(got) != len(want):
        return False, f"{len(got)} numbers: give one peak per rank, {len(want)} of them"
    if _same(got, want):
        h2, f1 = _peaks("zb-h2", heavy), _peaks("1f1b", heavy)
        return True, (
            f"{_shown(want)} (with mem_weight 0.3: {_shown(before)}). An I now frees nothing "
            "(+mem_weight - mem_activation = 0), so a microbatch is held from its F to its W, "
            "and ZB-H1 postpones Ws to fill its bubbles, the later ranks the most: every rank "
            f"reaches p. ZB-H2 holds {_shown(h2)}. 1F1B's stays {_shown(f1)}: it runs B, "
            "I and W in one action, so nothing is ever held between them."
        )
    if _same(got, before):
        return False, (
            "those are the peaks with mem_weight = 0.3. With mem_weight = mem_activation an I "
            "frees nothing, so a microbatch stays held from its F until its W, not its I: "
            "the ranks where ZB-H1 runs its Ws late hold more"
        )
    if _same(got, _peaks("1f1b", heavy)):
        return False, (
            "1F1B's peaks: its B frees a microbatch at once, but ZB-H1 splits it, and with an I "
            "that frees nothing a microbatch is held until its W, which ZB-H1 runs late"
        )
    wrong = [r for r, (g, w) in enumerate(zip(got, want, strict=True)) if abs(g - w) >= 1e-6]
    return False, (
        f"rank {wrong[0]}'s peak is not {got[wrong[0]]:g}. An I frees nothing now, so a rank "
        "holds every microbatch whose F has run and whose W has not: count them where the "
        "rank holds most, or read simulate(...).peak_memory"
    )


def _refusal(limit: float) -> str | None:
    """zb-auto's error under `limit` (the sweep's costs), None if it builds a schedule."""
    try:
        build_schedule("zb-auto", pp=P, microbatches=M, costs=SWEEP, memory_limit=limit)
    except ValueError as error:
        lines = str(error).splitlines()
        # the greedies say how small is too small; the first line only that nothing fits
        return next((line.strip() for line in lines if "must be at least" in line), lines[0])
    return None


def _smallest_limit() -> float:
    """The smallest limit zb-auto builds under, found by halving [0, 1F1B's peak]."""
    lo, hi = 0.0, P * SWEEP.mem_activation  # nothing fits under 0; 1F1B's peak always does
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _refusal(mid) else (lo, mid)
    return hi


@exercise("04.2", "the smallest memory_limit (a number, in rank-microbatches) zb-auto builds under")
def smallest_auto_limit(answer: Any) -> tuple[bool, str]:
    least = _smallest_limit()
    if not is_number(answer):
        return False, f"give a limit, a number such as 2.5; got {answer!r}"
    if answer <= 0:
        return False, f"a memory limit is > 0, got {answer:g}"
    refused = _refusal(answer)
    if refused:
        return False, f"under {answer:g} zb-auto builds nothing; it says: {refused}"
    if answer > least + 0.01:
        return False, (
            f"{answer:g} builds, but so does a smaller limit: a rank can always run a "
            "microbatch's W before its next F, so it needs room only for what one microbatch "
            "holds at once. Lower the limit until zb-auto refuses, and read why"
        )
    sim = simulate(
        build_schedule("zb-auto", pp=P, microbatches=M, costs=SWEEP, memory_limit=answer), SWEEP
    )
    what = (
        " = mem_activation, one forward's activations"
        if abs(least - SWEEP.mem_activation) < 1e-5
        else ""
    )
    alone = SWEEP.mem_weight + SWEEP.mem_activation > least  # after an I, no room for an F
    return True, (
        f"{least:.4g}{what}. Just under it zb-auto says: {_refusal(least * 0.99)}. "
        + (
            f"At {least:.4g} a rank never holds two microbatches (after an I, "
            f"{SWEEP.mem_weight:g} + {SWEEP.mem_activation:g} does not fit, so the W runs "
            "before the next F): "
            if alone
            else f"At {least:.4g} "
        )
        + f"the bubble is {sim.bubble_rate:.1%}, against {_auto(P, M, P).bubble_rate:.1%} "
        f"under p = {P}."
    )


def _run_peaks(name: str) -> tuple[list[float], list[float]]:
    """A real LocalPipeline step of `name`: (peaks per rank in rank-microbatches, in chunk
    microbatches), the measured counts weighted as the notebook weighs them."""

    class Stage(nn.Module):  # the notebook's stage: one Linear and a tanh
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:  # x: (rows, 8)
            return {"x": torch.tanh(self.lin(x))}

    def mse(outputs: dict[str, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
        return (outputs["x"] - target).pow(2).mean()

    schedule = build_schedule(name, pp=P, microbatches=M)
    with torch.random.fork_rng(devices=[]):  # the learner's random stream stays as it was
        pipe = LocalPipeline([Stage() for _ in range(schedule.num_stages)], schedule, mse)
        pipe.step(torch.randn(2 * M, 8), torch.randn(2 * M, 8))  # M microbatches of 2 rows
    one = Costs(mem_activation=EQUAL.mem_activation, mem_weight=EQUAL.mem_weight)
    # one Costs: a rank's share, halved per chunk; a list: per stage, so each chunk counts 1
    return pipe.trace.peak_for(one), pipe.trace.peak_for([one] * schedule.num_stages)


@exercise("04.3", "rank 0's peak (a number, rank-microbatches) a LocalPipeline run of "
          "interleaved-1f1b measures")  # fmt: skip
def interleaved_run_peak(answer: Any) -> tuple[bool, str]:
    run, chunks = _run_peaks("interleaved-1f1b")
    sim = simulate(build_schedule("interleaved-1f1b", pp=P, microbatches=M), EQUAL).peak_memory
    if not is_number(answer):
        return False, f"give rank 0's peak, a number such as 4; got {answer!r}"
    if abs(answer - run[0]) < 1e-6:
        match = "they match" if _same(run, sim) else "they DIFFER"
        return True, (
            f"{run[0]:g}: rank 0 holds {chunks[0]:g} microbatches over its two chunks at its "
            f"peak, each chunk half the rank's share. The run measures {_shown(run)}, the "
            f"simulator says {_shown(sim)}: {match}. 1F1B holds {_peaks('1f1b', EQUAL)[0]:g} "
            "on rank 0: interleaving buys its smaller bubble with more warm-up forwards."
        )
    if abs(answer - chunks[0]) < 1e-6:
        return False, (
            f"{answer:g} counts a chunk's microbatch as a whole rank's; a chunk is half of "
            "rank 0's share of the model, so weigh each by half (one Costs does that)"
        )
    if abs(answer - _peaks("1f1b", EQUAL)[0]) < 1e-6:
        return False, (
            f"{answer:g} is 1F1B's rank-0 peak. Interleaving's warm-up runs forwards on both "
            "of a rank's chunks before its first backward, more than 1F1B's p - r, so it "
            "holds more"
        )
    return False, (
        f"not {answer:g}: rank 0 holds the microbatches of both its chunks, each half a "
        f"rank's share. Run it (LocalPipeline with {len(chunks) * 2} Stages) and read "
        "pipe.trace.peak_for(Costs(mem_activation=1.0, mem_weight=0.3))[0]"
    )


def _auto(pp: int, m: int, limit: float) -> Simulation:
    schedule = build_schedule("zb-auto", pp=pp, microbatches=m, costs=SWEEP, memory_limit=limit)
    return simulate(schedule, SWEEP)


@exercise("04.4", "the whole limit from p to 2p (p = 8, m = 32) from which zb-auto's bubble "
          "stops falling (an int)")  # fmt: skip
def where_the_sweep_stops(answer: Any) -> tuple[bool, str]:
    pp, m = 8, 32
    bubble = {limit: _auto(pp, m, limit).bubble_rate for limit in range(pp, 2 * pp + 1)}
    # from `stops` on, every larger limit gives the same bubble
    stops = min(x for x in bubble if all(abs(bubble[y] - bubble[x]) < TOL for y in bubble if y > x))
    if is_number(answer) and answer == int(answer):
        answer = int(answer)  # 15.0 is 15
    if not is_count(answer):
        return False, f"give a whole limit between {pp} and {2 * pp}; got {answer!r}"
    if answer not in bubble:
        return False, f"the sweep runs from p = {pp} to 2p = {2 * pp}; {answer} is outside it"
    if answer == stops:
        h2 = simulate(build_schedule("zb-h2", pp=pp, microbatches=m), SWEEP)
        steady = all(bubble[x + 1] < bubble[x] for x in range(pp, stops))
        return True, (
            f"from {stops} = 2p - {2 * pp - stops} on the bubble is {bubble[stops]:.2%}; at "
            f"p = {pp} it is {bubble[pp]:.2%}"
            + (", and it falls at every step until then" if steady else "")
            + (f" ({bubble[stops - 1]:.2%} at {stops - 1})" if stops > pp else "")
            + ". With room for 2p - 1 forwards rank 0 keeps working through microbatch 0's "
            "trip down the pipeline and back, so nothing is left to fill. ZB-H2 holds "
            f"{max(h2.peak_memory):g} for a bubble of {h2.bubble_rate:.2%}: with these costs "
            "the search does better with the same memory."
        )
    if answer > stops:
        return False, (
            f"at {answer} the bubble is {bubble[answer]:.2%}, no lower than at {answer - 1}: "
            "it stopped falling before. More memory helps only while there is a bubble left "
            "for extra warm-up forwards to fill"
        )
    return False, (
        f"at {answer} the bubble is {bubble[answer]:.2%}, and it still falls after "
        f"({min(bubble.values()):.2%} further on): each more unit of memory lets a rank run "
        "one more forward before its first backward, filling part of the bubble, until none "
        "is left"
    )
