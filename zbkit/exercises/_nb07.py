"""Notebook 07's exercises: a W out of place, a mismatched hang, a bug a plain backward hides,
and where a crash leaves the other rank waiting.

07.1 and 07.2 judge what the learner made (a program; the error a hang raised): the
validator and the stacks say whether it is what was asked. 07.3 holds the notebook's buggy
`FusedLinear` and sets it against `nn.Linear`; 07.4 walks the 1F1B program with the
dependency engine the validator and the simulator use.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from zbkit.exercises._core import as_names, exercise
from zbkit.launch import LaunchError
from zbkit.schedules import (
    KINDS,
    Action,
    Schedule,
    ScheduleError,
    build_schedule,
    validate,
)
from zbkit.schedules.core.plan import CommOp
from zbkit.schedules.core.schedule import derive_plan
from zbkit.schedules.sim import engine
from zbkit.splitgrad import (
    GradDirection,
    needs_direction,
    stage_backward_input,
    stage_backward_weight,
)

# ------------------------------------------------------------------ 07.1: a W before its I


def as_program(answer: Any) -> Schedule | str:
    """The learner's program as a Schedule, or why it cannot be read as one."""
    if isinstance(answer, Schedule):
        return answer
    if not isinstance(answer, Mapping | list | tuple):
        return f"give a Schedule or a program {{rank: ['0F0', ...]}}, got {type(answer).__name__}"
    try:
        return Schedule.from_program(answer)
    except (ScheduleError, ValueError, TypeError) as err:
        return f"cannot read it as a program: {err}"


def early_weights(s: Schedule) -> list[tuple[int, int, Action, int]]:
    """(rank, position, W, position of its I) for each W placed before its own I."""
    found = []
    for rank, row in s.program.items():
        where = {a: pos for pos, item in enumerate(row) for a in item.halves}
        for a, pos in where.items():
            its_i = Action(a.stage, "I", a.microbatch)
            if a.kind == "W" and where.get(its_i, -1) > pos:
                found.append((rank, pos, a, where[its_i]))
    return found


def first_line(err: Exception) -> str:
    return str(err).splitlines()[0]


@exercise(
    "07.1", "a 3-rank program (a Schedule or {rank: [actions]}), valid but for a W before its I"
)
def w_before_i(answer: Any) -> tuple[bool, str]:
    s = as_program(answer)
    if isinstance(s, str):
        return False, s
    if s.pp != 3:
        return False, f"write it for 3 ranks; this program has {s.pp}"
    try:
        validate(s)
    except ScheduleError as err:
        said = first_line(err)
    else:
        return False, (
            "validate accepts it: every W comes after its I, as it must (a W uses the output "
            "gradient its I received). Move one W before its I"
        )
    early = early_weights(s)
    if not early:
        return False, f"validate rejects it, but not for a W before its I: {said}"
    if len(early) > 1:
        shown = ", ".join(str(a) for _, _, a, _ in early)
        return False, f"{len(early)} Ws come before their I ({shown}): leave only one out of place"
    rank, pos, w, i_pos = early[0]
    row = list(s.program[rank])
    row.insert(i_pos, row.pop(pos))  # the W back to just after its I
    fixed = Schedule({**s.program, rank: row}, s.stage_to_rank, s.microbatches)
    try:
        validate(fixed)
    except ScheduleError as err:
        return False, f"{w} is out of place, but more is wrong: with it after its I, validate "\
                      f"still says: {first_line(err)}"  # fmt: skip
    return True, (
        f"validate says: {said}. A fault in one rank's own order, found before any look across "
        "ranks, with that cell marked in the grid: a W needs what its I leaves behind (the "
        "output gradient the I pass received), so it comes after its I on the same rank."
    )


# ------------------------------------------------------------------ 07.2: barrier vs recv

_FRAME = re.compile(r'File "([^"]*)", line \d+, in (\w+)')


def waiting_call(stack: str) -> str | None:
    """The torch.distributed function a stack waits in (the first frame in its c10d module)."""
    for path, name in _FRAME.findall(stack):
        if path.replace("\\", "/").endswith("torch/distributed/distributed_c10d.py"):
            return name
    return None


@exercise("07.2", "the LaunchError the barrier/recv hang raised (`except LaunchError as err`)")
def barrier_against_recv(answer: Any) -> tuple[bool, str]:
    if not isinstance(answer, LaunchError):
        return False, (
            f"give the error itself (`except LaunchError as err: answer = err`), got "
            f"{type(answer).__name__}"
        )
    if "timed out" not in str(answer).split("\n", 1)[0]:
        return False, "this error is not a timeout report: give the run a timeout (a few seconds)"
    calls = {rank: waiting_call(stack) for rank, stack in sorted(answer.tracebacks.items())}
    shown = ", ".join(f"rank {r} in {c or 'no torch.distributed call'}" for r, c in calls.items())
    if sorted(c or "" for c in calls.values()) == ["barrier", "recv"]:
        return True, (
            f"the stacks show {shown}: not the same call any more. barrier is a collective, it "
            "returns once every rank has entered it; recv waits for a message the other rank "
            "never sends. Stacks that end in different calls mean the ranks disagree on what "
            "comes next (a collective one rank skips): every rank must make the same "
            "collectives in the same order."
        )
    if list(calls.values()) == ["recv", "recv"]:
        return False, (
            "both ranks wait in recv: that is the notebook's hang, two receives and no send. "
            "Make rank 0 call dist.barrier() instead of its recv, so the stacks end in "
            "different calls"
        )
    return False, (
        f"the stacks show {shown}: a stack ends in the call its rank is blocked in, and the "
        "exercise's hang has rank 0 blocked in barrier and rank 1 in recv"
    )


# ------------------------------------------------------------------ 07.3: a plain backward


class BuggyLinear(torch.autograd.Function):
    """The notebook's FusedLinear, bug included: the weight gradient under INPUT."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> Any:
        ctx.save_for_backward(x, weight)
        return x @ weight.T + bias

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, Any, Any]:
        x, weight = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        if needs_direction(GradDirection.INPUT):
            grad_x = grad @ weight
            grad_w = grad.T @ x  # BUG: a weight gradient computed in the input pass
        if needs_direction(GradDirection.WEIGHT):
            grad_b = grad.sum(0)
        return grad_x, grad_w, grad_b


class BuggyMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> Any:
        h = torch.tanh(BuggyLinear.apply(x, self.fc1.weight, self.fc1.bias))
        return BuggyLinear.apply(h, self.fc2.weight, self.fc2.bias)


def wrong_gradients(split: bool) -> set[str]:
    """The tensors whose gradient differs from nn.Linear's (or is None) after a split backward
    (I then W) or a plain one, as `compare_with_autograd` names them."""
    with torch.random.fork_rng(devices=[]):  # the learner's random stream stays as it was
        torch.manual_seed(0)
        stage, x, grad_out = BuggyMLP(), torch.randn(5, 4), torch.randn(5, 4)
        reference = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4))
    reference[0].load_state_dict(stage.fc1.state_dict())
    reference[2].load_state_dict(stage.fc2.state_dict())
    x_stage, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = stage(x_stage)
    if split:
        weights = list(stage.parameters())
        result = stage_backward_input([out], [grad_out], [x_stage], weights)
        stage_backward_weight(weights, result.param_groups)
        x_grad = result.input_grads[0]
    else:
        out.backward(grad_out)
        x_grad = x_stage.grad
    reference(x_ref).backward(grad_out)
    rows = [("input x", x_grad, x_ref.grad)]
    pairs = zip(stage.named_parameters(), reference.parameters(), strict=True)
    rows += [(name, p.grad, q.grad) for (name, p), q in pairs]
    return {
        n
        for n, got, want in rows
        if got is None or want is None or not torch.allclose(got, want, atol=1e-6)
    }


@exercise("07.3", "the set of tensors compare_with_autograd finds wrong after a plain backward")
def plain_backward_hides_it(answer: Any) -> tuple[bool, str]:
    wrong, split_wrong = wrong_gradients(split=False), wrong_gradients(split=True)
    got = as_names(answer)
    if got is None:
        return False, f"give a set of names such as {{'fc1.bias'}} (set() for none), got {answer!r}"
    got = {"input x" if g in ("x", "input") else g for g in got}
    if got == wrong:
        return True, (
            f"{sorted(wrong) or 'none'}: a plain backward asks for both directions at once "
            "(needs_direction is True for INPUT and for WEIGHT), so the weight gradient under "
            "the wrong `if` still runs and reaches .grad. Only the split W pass, which asks for "
            f"WEIGHT alone, loses it ({', '.join(sorted(split_wrong))}): the bug hides from "
            "every test that uses loss.backward()."
        )
    if got == split_wrong:
        return False, (
            "that is the split backward (I then W), where W asks for WEIGHT alone. "
            "out.backward(grad_out) asks for both directions in one pass: which branches of "
            "the buggy backward run then?"
        )
    return False, (
        "the bug only matters in a pass that asks for one direction alone; replace the two "
        "split calls by out.backward(grad_out) and read the five rows"
    )


# ------------------------------------------------------------------ 07.4: who is left waiting


def crash_leaves_waiting(crashed: int, forwards_done: int) -> tuple[list[str], Action, str]:
    """In 2-rank 1F1B with 4 microbatches, rank `crashed` fails in its forward number
    `forwards_done + 1`. Returns what it ran (the failing action last), the action the other
    rank waits at for good, and that action's receive in words (as the runner's error says)."""
    s = build_schedule("1f1b", pp=2, microbatches=4)
    row, other = list(s.program[crashed]), 1 - crashed
    forwards = [pos for pos, a in enumerate(row) if isinstance(a, Action) and a.kind == "F"]
    failed = forwards[forwards_done]
    cut = Schedule({crashed: row[:failed], other: s.program[other]}, s.stage_to_rank, 4)
    unit = {(st, kind): 1.0 for st in range(s.num_stages) for kind in KINDS}
    try:
        engine.run(cut, unit, [0.0] * s.num_stages)  # each rank runs while its inputs exist
    except engine.Stuck as stuck:
        waiting = stuck.blocked[other][1]
    else:
        raise AssertionError("the other rank finished without the crashed rank")
    recv = next(c for c in derive_plan(s, other).comms
                if c.op is CommOp.RECV and c.action == str(waiting))  # fmt: skip
    assert isinstance(waiting, Action)
    return [str(a) for a in row[: failed + 1]], waiting, recv.explain()


@exercise("07.4", "the action (e.g. '1B0') rank 1 waits at when rank 0's third forward raises")
def crash_on_rank_0(answer: Any) -> tuple[bool, str]:
    ran, waiting, recv = crash_leaves_waiting(crashed=0, forwards_done=2)
    try:
        got = answer if isinstance(answer, Action) else Action.parse(str(answer).strip())
    except ValueError:
        return False, f"give an action of rank 1 such as '1B0', got {answer!r}"
    if got == waiting:
        return True, (
            f"rank 1 waits at {waiting}: rank 0 ran {', '.join(ran[:-1])} and failed in "
            f"{ran[-1]}, so rank 1 runs on until an action needs what rank 0 never made. Rank 0 "
            f"tells it at once, and its own error says so, {recv}: it names the wait, and the "
            "rank 0 error it carries is the cause."
        )
    if got.stage == 0:
        return False, "that is rank 0's program (stage 0): where does rank 1 (stage 1) stop?"
    if got.kind == "B":
        return False, (
            f"{got} only sends rank 0 a gradient, and a send does not wait for its receiver: "
            "rank 1 goes on until an action needs something from rank 0"
        )
    if got.kind == "F" and got.microbatch < waiting.microbatch:
        return False, (
            f"{got} ran: rank 0 sent stage 0's output for microbatch {got.microbatch} before "
            f"it failed in {ran[-1]}. A stage-1 forward waits only for its own microbatch"
        )
    return False, (
        f"rank 1 runs its row in order until an action needs something rank 0 never made; "
        f"a stage-1 forward needs stage 0's output of its microbatch: which one needs "
        f"{ran[-1]}'s?"
    )
