"""Notebook 05's exercises: real runs, asked as what the simulator or one process says.

A measured time changes from run to run, so no answer here is one: each checker works out in
this process what a run would show. The schedules' speed-ups and the time crowded ranks
compete for cores come from the simulator, with one `Costs` for every schedule (a rank's
share of the model); what stage 0's backward pays from `SyntheticStage.paid` in a
`LocalPipeline` (the ranks' per-action code, in one process); the gradients from
`LocalPipeline` against plain autograd on the same transformer.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from zbkit.exercises._core import as_names, exercise, is_number, schedule_name
from zbkit.models import TinyTransformer, split_stages
from zbkit.pipeline import LocalPipeline, PipelineStage, SyntheticStage
from zbkit.schedules import Costs, Simulation, build_schedule, simulate
from zbkit.schedules.core.costs import TOL

P, M = 4, 8  # the notebook's ranks and microbatches per step
T = 0.020  # seconds per F, I and W of a rank's share, as the notebook's synthetic stages
RACED = ("1f1b", "zb-h1", "zb-h2", "zb-v")  # the notebook's timed schedules
TIE = TOL  # simulated times are sums of floats: closer than this is a tie


def speedups(costs: Costs) -> dict[str, float]:
    """Each timed schedule's simulated speed-up over 1F1B, all simulated with `costs`."""
    spans = {n: simulate(build_schedule(n, pp=P, microbatches=M), costs).makespan for n in RACED}
    return {n: spans["1f1b"] / span for n, span in spans.items()}


# ----------------------------------------------------------------- 05.1: a short W


@exercise("05.1", "the name (a str, e.g. 'zb-h1') of the schedule that gains most with W = 5 ms")
def short_w(answer: Any) -> tuple[bool, str]:
    short, even = speedups(Costs(T, T, T / 4)), speedups(Costs(T, T, T))
    best = max(short, key=short.__getitem__)
    name, why = schedule_name(answer, RACED, "the timed schedules")
    if name is None:
        return False, why
    table = ", ".join(f"{n} {short[n]:.2f}x (was {even[n]:.2f}x)" for n in RACED[1:])
    lost = max(RACED[1:], key=lambda n: even[n] - short[n])
    if name == best:
        return True, (
            f"{best}: over 1F1B, with W = 5 ms: {table}. Every zero-bubble schedule gains less "
            f"with less W, {lost} most: it fills 1F1B's bubble with W's, and a short W fills "
            "little of it. ZB-V's V shape shortens the warm-up and cool-down themselves."
        )
    if name == "1f1b":
        return False, (
            "1F1B is the baseline every speed-up is measured against (1.00x). The zero-bubble "
            "schedules gain by moving W's into its bubble: with W = 5 ms, which of them gains in "
            "a way that does not need a long W?"
        )
    return False, (
        f"{name} gains {short[name]:.2f}x, and another gains more. ZB-H1 and ZB-H2 gain only by "
        "moving W's into 1F1B's bubble, and a 5 ms W fills a quarter of what a 20 ms one did; a "
        "schedule whose shape also shortens the warm-up and cool-down keeps more of its gain"
    )


# ----------------------------------------------------------------- 05.2: stage 0's W


def stage0_paid(split_first_stage: bool) -> list[str]:
    """What each backward call of stage 0 paid for ("I", "W", "IW"), in a ZB-H1 step run by
    `LocalPipeline` on synthetic stages that take no time (`paid` records the kinds anyway)."""
    sch = build_schedule("zb-h1", pp=P, microbatches=M)
    mods = [SyntheticStage(0, 0, 0, width=4) for _ in range(P)]
    stages = [
        PipelineStage(mod, s, P, split_first_stage=split_first_stage) for s, mod in enumerate(mods)
    ]
    x = torch.ones(2 * M, 4)  # 2 rows per microbatch, as in the notebook
    LocalPipeline(stages, sch, lambda out, y: (out["x"] - y).pow(2).mean()).step(x, targets=x)
    return mods[0].paid


def w_ms(split_first_stage: bool) -> float:
    """The set time (ms) one W of stage 0 takes: the parts its backward call paid for."""
    paid = stage0_paid(split_first_stage)
    w_calls = [p for p in paid if "W" in p]  # one per microbatch: the W's own call
    assert len(set(w_calls)) == 1 and len(w_calls) == M, paid
    return 1e3 * T * len(w_calls[0])  # F = I = W = T: each part paid is T


@exercise("05.2", "the milliseconds (a number) of set time one W of stage 0 takes, unsplit")
def first_stage_unsplit(answer: Any) -> tuple[bool, str]:
    unsplit, split = w_ms(False), w_ms(True)
    paid = stage0_paid(False)
    if not is_number(answer):
        return False, f"give a number of milliseconds, got {answer!r}"
    if math.isclose(answer, unsplit, rel_tol=0.05):
        return True, (
            f"{unsplit:.0f} ms: stage 0's input is data, which needs no gradient, so its input "
            "closure is empty (notebook 01, exercise 3) and its I has nothing to send: it only "
            f"records the microbatch. The whole backward runs at W (paid: {paid[0]!r} in each "
            f"of its {len(paid)} backward calls, none at I). On rank 0 the I boxes shrink to "
            f"slivers and the W boxes grow from {split:.0f} to {unsplit:.0f} ms: the rank does "
            "the same work, at other moments than the simulator assumes."
        )
    if math.isclose(answer, unsplit / 1e3, rel_tol=0.05):
        return False, f"{answer} looks like seconds; give milliseconds"
    if math.isclose(answer, split, rel_tol=0.05):
        return False, (
            f"{split:.0f} ms is W with split_first_stage=True, when I paid its own part. Without "
            "it, does stage 0's I backpropagate at all? (SyntheticStage.paid lists each call)"
        )
    if answer < split:
        return False, (
            "less than one part: stage 0's whole backward still runs once per microbatch, its "
            "I part and its W part, at one of the two calls"
        )
    return False, (
        "stage 0's input is data: it has no gradient to send up, so its I call computes "
        "nothing and the whole backward, I's part and W's, runs in one call. Which call, and "
        "how many parts of 20 ms? (SyntheticStage.paid lists what each call paid)"
    )


# ----------------------------------------------------------------- 05.3: spinning ranks


def crowded(sim: Simulation, cores: int = 2) -> float:
    """The share of the makespan during which more ranks compute than there are cores."""
    events = sim.events
    edges = sorted({t for e in events for t in (e.start, e.end)})
    total = 0.0
    for a, b in zip(edges, edges[1:], strict=False):
        computing = {e.rank for e in events if e.start < b and e.end > a}
        total += (b - a) * (len(computing) > cores)
    return total / sim.makespan


@exercise("05.3", "the fraction (0..1) of ZB-V's makespan when more than 2 ranks compute at once")
def spinning_ranks(answer: Any) -> tuple[bool, str]:
    sims = {n: simulate(build_schedule(n, pp=P, microbatches=M), Costs(1, 1, 1)) for n in RACED}
    share = {n: crowded(sim) for n, sim in sims.items()}
    want = share["zb-v"]
    if not is_number(answer):
        return False, f"give a fraction between 0 and 1, got {answer!r}"
    if 1 < answer <= 100 and math.isclose(answer / 100, want, abs_tol=5e-3):
        return False, f"{answer} looks like a percentage; give the fraction ({answer / 100:.3f})"
    if math.isclose(answer, want, abs_tol=5e-3):
        others = ", ".join(f"{n} {share[n]:.0%}" for n in RACED[:-1])
        return True, (
            f"{want:.3f}: for {want:.0%} of its makespan ZB-V wants 3 or 4 cores ({others}). "
            "Spinning ranks must share 2, so there each computes slower than its set time and "
            "the measured run falls behind the simulation, which gives every rank its own "
            "core: run/sim drops below 1, most for the schedules with the smallest bubbles. "
            "Sleeping ranks need a core only to wake up and send."
        )
    for n in RACED[:-1]:
        if math.isclose(answer, share[n], abs_tol=5e-3):
            return False, f"{answer:.3f} is {n}'s share; the question asks ZB-V's"
    busy = 1 - sims["zb-v"].bubble_rate
    if math.isclose(answer, busy, abs_tol=5e-3):
        return False, (
            "that is the share of the time a rank computes; count the moments at which 3 or 4 "
            "ranks compute together (sweep over the events' starts and ends)"
        )
    if not 0 <= answer <= 1:
        return False, f"a share of the makespan lies between 0 and 1, got {answer}"
    return False, (
        "a computing rank wants a core of its own; the ranks slow each other down only while "
        "more than 2 compute together. Between consecutive event starts and ends, count the "
        "ranks with an event running; add up the intervals with more than 2 and divide by "
        "the makespan"
    )


# ----------------------------------------------------------------- 05.4: more schedules

ADDED = ("gpipe", "interleaved-1f1b")  # the schedules the exercise adds to the check
GRAD_TOL = 1e-5  # the notebook's "equal": float32 sums in another order differ by ~1e-7


def lm_loss(outputs: dict[str, torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(outputs["logits"].flatten(0, 1), targets.flatten())


def worst_grad_diff(name: str) -> float:
    """Largest |pipeline grad - plain autograd grad| of a TinyTransformer cut into `name`'s
    stages and run by `LocalPipeline` (4 ranks' programs, 4 microbatches, one process)."""
    with torch.random.fork_rng(devices=[]):  # the learner's random stream stays as it was
        torch.manual_seed(0)
        model = TinyTransformer(layers=8)
        tokens = torch.randint(0, 64, (8, 16))  # (batch, tokens)
        targets = torch.randint(0, 64, (8, 16))
    oracle = copy.deepcopy(model)
    lm_loss({"logits": oracle(tokens)}, targets).backward()  # one process, the full batch
    sch = build_schedule(name, pp=P, microbatches=4)
    LocalPipeline(split_stages(model, sch.num_stages), sch, lm_loss).step(tokens, targets=targets)
    diffs = []
    for p, q in zip(model.parameters(), oracle.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None  # every parameter reaches the loss
        diffs.append((p.grad - q.grad).abs().max().item())
    return max(diffs)


@exercise("05.4", "the set of the added schedules whose gradients differ (set() if none)")
def more_schedules(answer: Any) -> tuple[bool, str]:
    worst = {n: worst_grad_diff(n) for n in ADDED}
    differ = {n for n, w in worst.items() if w > GRAD_TOL}
    got = as_names(answer)
    if got is None:
        return False, f"give a set of schedule names such as {{'gpipe'}} or set(), got {answer!r}"
    if got == differ and differ:  # a schedule that changes the sums would be a zbkit bug
        return True, f"{', '.join(sorted(differ))}: off by more than {GRAD_TOL:g}; report it"
    if got == differ:
        stages = build_schedule("interleaved-1f1b", pp=P, microbatches=4).num_stages
        return True, (
            f"none: every gradient is within {GRAD_TOL:g} of one process's (float32 sums in "
            "another order). GPipe runs every F, then every full backward B; interleaved-1F1B "
            f"cuts the model into {stages} stages, {stages // P} per rank: other orders, other "
            "cuts, the same sums. A schedule decides when, never what."
        )
    unknown = sorted(got - set(ADDED))
    if unknown:
        return False, f"{', '.join(unknown)}: the exercise adds only {' and '.join(ADDED)}"
    wrong = sorted(got - differ) or sorted(differ - got)
    n = wrong[0]
    return (
        False,
        f"{n}: its largest difference is {worst[n]:.1e} (the notebook's 'equal' is < 1e-5)",
    )


# ----------------------------------------------------------------- 05.5: one slow stage

UNEVEN = [Costs(1, 1, 1)] * 3 + [Costs(1.5, 1.5, 1.5)]  # the last stage also projects to vocab
TRIED = ("1f1b", "zb-h1", "zb-h2", "zb-auto")


def makespans(costs: Sequence[Costs]) -> dict[str, float]:
    """Each tried schedule simulated with `costs` per stage (zb-auto built for them)."""
    out = {}
    for n in TRIED:
        built_for = list(costs) if n == "zb-auto" else None  # the others take no costs
        sch = build_schedule(n, pp=P, microbatches=M, costs=built_for)
        out[n] = simulate(sch, costs).makespan
    return out


@exercise("05.5", "the shortest simulated makespan (a number) of the four, last stage 1.5x")
def slow_last_stage(answer: Any) -> tuple[bool, str]:
    spans = makespans(UNEVEN)
    best = min(spans.values())
    slow = UNEVEN[-1]
    work = M * (slow.F + slow.I + slow.W)  # what the slow stage alone must do
    wait = sum(c.F for c in UNEVEN[:-1])  # before its first input can arrive
    if not is_number(answer):
        return False, f"give a makespan (a number), got {answer!r}"
    reach = ", ".join(n for n in TRIED if spans[n] - best < TIE)
    if math.isclose(answer, best, abs_tol=1e-6):
        return True, (
            f"{best:g}, reached by {reach} (1F1B: {spans['1f1b']:g}). No schedule can do better: "
            f"the slow stage alone works {M} x {slow.F + slow.I + slow.W:g} = {work:g} and "
            f"cannot start before the first microbatch's {wait:g} of forwards reaches it, "
            f"{work + wait:g} in all. Its rank is never idle; the bubble moves to the other "
            "ranks, and what shortens the step is a better cut (notebook 09: "
            "`planner.partition` balances the stages by time)."
        )
    if answer < best:
        return False, (
            f"below what any schedule can reach: the slow stage alone works {work:g}, after "
            f"{wait:g} of forwards before it"
        )
    named = [n for n in TRIED if math.isclose(answer, spans[n], abs_tol=1e-6)]
    if named:
        return False, (
            f"{answer:g} is {named[0]}'s makespan, and another of the four is shorter. The slow "
            "stage sets the pace: the best a schedule can do is keep it busy from its first "
            "input to the end, and let the other ranks idle instead"
        )
    return False, (
        "the slow stage sets the pace, so the makespans differ by how well a schedule keeps it "
        "busy: simulate each of the four with costs=costs (zb-auto built with costs=costs)"
    )
