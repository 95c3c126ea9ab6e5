"""Notebook 08's exercises: torch's programs through zbkit's lens, and torch's split backward.

Each checker asks torch and zbkit themselves: `compare_with_torch` for where two programs
part, the simulator for what overlapping buys, the communication plan for the messages of a
step, and torch's own `stage_backward_input` / `stage_backward_weight` for where its split
fails on the notebook's `TiedStage` returning a view.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from zbkit.exercises._core import exercise, is_count
from zbkit.schedules import Action, Costs, Schedule, compare_with_torch, derive_plan, simulate
from zbkit.schedules.core.plan import CommOp


def torch_schedule(name: str, pp: int, microbatches: int) -> Schedule:
    import torch.distributed.pipelining.schedules as torch_schedules

    return Schedule.from_torch(getattr(torch_schedules, name), pp=pp, microbatches=microbatches)


@exercise("08.1", "torch's action (e.g. '3F1') where its program first parts from zbkit's")
def interleaved_differs(answer: Any) -> tuple[bool, str]:
    c = compare_with_torch("interleaved-1f1b", pp=2, microbatches=2)
    rank, (pos, theirs, ours) = min(c.differences.items())
    try:
        got = answer if isinstance(answer, Action) else Action.parse(str(answer).strip())
    except ValueError:
        return False, f"give an action such as '3F1', got {answer!r}"
    valid = "both validate" if c.torch_error is None and c.zbkit_error is None else "not both valid"
    if str(got) == theirs:
        spans = {s.makespan for s in (c.torch_sim, c.zbkit_sim) if s is not None}
        same = f"the same makespan {spans.pop():g}" if len(spans) == 1 else "different makespans"
        return True, (
            f"rank {rank}, position {pos}: torch runs {theirs} where zbkit runs {ours}. Yet "
            f"{valid}, with {same}: two valid orders of one schedule (with m=4 they are equal, "
            "action for action)."
        )
    if str(got) == ours:
        return False, (
            f"{ours} is zbkit's action there: the two programs part at that position, and the "
            "question asks for torch's side of it"
        )
    return False, (
        "compare_with_torch walks both programs rank by rank and reports the first position "
        "where they part: print(compare_with_torch('interleaved-1f1b', pp=2, microbatches=2))"
    )


@exercise("08.2", "the makespan DualPipeV saves (a number) with Costs(overlap=0.5) over overlap=0")
def overlap_saves(answer: Any) -> tuple[bool, str]:
    dualpipe = torch_schedule("ScheduleDualPipeV", pp=2, microbatches=4)
    apart, overlapped = (simulate(dualpipe, Costs(overlap=v)).makespan for v in (0.0, 0.5))
    saved = apart - overlapped
    if isinstance(answer, bool) or not isinstance(answer, int | float):
        return False, f"give a number of time units, got {answer!r}"
    if math.isclose(answer, saved, rel_tol=1e-6, abs_tol=1e-9):
        pairs = sum(1 for item in dualpipe.program[0] if len(item.halves) == 2)
        return True, (
            f"{saved:g} time units: the makespan goes from {apart:g} to {overlapped:g} "
            f"({saved / apart:.1%} faster). Each OVERLAP_F_B pair ({pairs} on rank 0) runs a "
            "forward and a backward at once, hiding part of one behind the other; the rest "
            "of the program is unchanged."
        )
    if math.isclose(answer, saved / apart, rel_tol=1e-3) or math.isclose(
        answer, 100 * saved / apart, rel_tol=1e-3
    ):
        return False, "that is the saving as a fraction: give it in time units (makespans apart)"
    return False, (
        "overlap hides part of a forward behind a backward in each OVERLAP_F_B pair and "
        "changes nothing else, so the saving is the difference of two makespans: simulate it "
        "with Costs(overlap=0) and Costs(overlap=0.5), and subtract them"
    )


@exercise("08.3", "the messages (an int) crossing between the ranks in one step of torch's ZBV")
def zbv_messages(answer: Any) -> tuple[bool, str]:
    zbv = torch_schedule("ScheduleZBVZeroBubble", pp=2, microbatches=4)
    sends = [c for r in range(zbv.pp) for c in derive_plan(zbv, r).comms if c.op is CommOp.SEND]
    if not is_count(answer):
        return False, f"give a number of messages, got {answer!r}"
    if answer == len(sends):
        per_edge = len(sends) // zbv.microbatches
        return True, (
            f"{len(sends)}: {per_edge} per microbatch (activations 0->1 and 2->3, gradients 3->2 "
            "and 1->0; stages 1 and 2 share a rank, so nothing crosses between them). Each is a "
            "gloo message of a few milliseconds on a busy machine; the simulation charges each "
            "one median hop, the run pays what each really took."
        )
    if answer == 2 * len(sends):
        return False, "a send and its receive are one message: count one side only"
    if answer == len(sends) + 2 * zbv.microbatches:
        return False, "stages 1 and 2 share rank 1 (the V's turn): nothing crosses between them"
    return False, (
        "each message crossing the ranks is one SEND on one rank and one RECV on the other: "
        "count the SEND ops in torch's lowered programs, zbv.row(0) and zbv.row(1)"
    )


class TiedView(nn.Module):
    """The notebook's TiedStage, returning a view of its output (the first 4 columns)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.mid = nn.Linear(6, 6), nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.lin(torch.tanh(self.mid(self.lin(x))))  # self.lin used twice
        return out[:, :4]  # a view


def split_with_torch(stage: nn.Module, reached: list[str]) -> dict[str, torch.Tensor | None]:
    """torch's two split calls, looked up at call time as its PipelineStage does (so
    `exact_split_backward` swaps them in), each named in `reached` as it starts; returns
    each parameter's gradient, or raises where torch fails."""
    from torch.distributed.pipelining import stage as torch_stage

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        x = torch.randn(4, 6, requires_grad=True)
    out = stage(x)
    reached.append("stage_backward_input")
    _, groups = torch_stage.stage_backward_input(
        [out], [torch.ones_like(out)], [x], stage.parameters()
    )
    reached.append("stage_backward_weight")
    torch_stage.stage_backward_weight(stage.parameters(), groups)
    return {n: p.grad for n, p in stage.named_parameters()}


def torch_split_fails_in() -> tuple[str | None, str]:
    """Which of torch's two split calls raises on `TiedView`, and the root cause's words."""
    reached: list[str] = []
    with torch.random.fork_rng(devices=[]):
        stage = TiedView()
    try:
        split_with_torch(stage, reached)
    except RuntimeError as err:
        cause = err.__cause__ or err
        return reached[-1], str(cause).split(". ")[0]
    return None, ""


def exact_matches_plain() -> bool:
    """Under zbkit's exact_split_backward(), torch's calls give plain backward's gradients."""
    # lazily: torchpp loads torch.distributed.pipelining (most of a second), and the first
    # check() of any notebook's exercise loads every _nbNN module
    import zbkit.torchpp

    with torch.random.fork_rng(devices=[]):
        stage, reference = TiedView(), TiedView()
    reference.load_state_dict(stage.state_dict())
    with zbkit.torchpp.exact_split_backward():
        split = split_with_torch(stage, [])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        x = torch.randn(4, 6)
    reference(x).sum().backward()  # the view's gradient is all ones, as in the split
    for name, p in reference.named_parameters():
        got = split[name]
        if got is None or p.grad is None or not torch.allclose(got, p.grad):
            return False
    return True


@exercise("08.4", "the torch function (a name) whose call fails when TiedStage returns a view")
def view_output(answer: Any) -> tuple[bool, str]:
    call, cause = torch_split_fails_in()
    if call is None:
        return False, "torch's split backward does not fail here any more: nothing to name"
    if not isinstance(answer, str):
        return False, f"give the function's name as a string, got {answer!r}"
    got = answer.strip().split(".")[-1].removesuffix("()")
    if got == call:
        exact = "still equals" if exact_matches_plain() else "no longer equals"
        return True, (
            f"{call}: torch now fails in its input pass, before the tied weights matter. Its "
            f"error lists the stage's outputs; the cause under it (err.__cause__) is '{cause}': "
            "after the input pass torch detaches the stage output in place to free its graph, "
            "which a view forbids. zbkit's "
            f"exact_split_backward() {exact} plain backward."
        )
    other = {"stage_backward_input", "stage_backward_weight"} - {call}
    if got in other:
        return False, (
            f"{got} is where the tied weights fail (the notebook's error); with a view output "
            "torch's split fails one call earlier"
        )
    return False, (
        "give one of torch's two calls: stage_backward_input or stage_backward_weight. Its input "
        "pass ends by detaching the stage's output in place to free the graph: what does that "
        "do to a view?"
    )
