"""Notebook 02's exercises: split backward, I now and W later.

02.1 and 02.2 ask how the notebook's naive split fares on a graph. To work that out, this
module holds the same naive split and the same two graphs (`Twice`, `Gate`) and sets
their gradients against plain autograd's; the exercise tests check these copies against
the notebook's own code.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import GradientEdge

from zbkit.exercises._core import as_names, block_analysis, exercise, is_count
from zbkit.models import TiedLM
from zbkit.splitgrad import (
    build_reverse_graph,
    grad_node,
    reverse_closure,
    stage_backward_input,
)
from zbkit.viz.graph import output_shapes

# ----------------------------------------------------------------- the notebook's graphs


class Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(torch.tanh(self.lin(x)))  # one weight, twice along one path


class TwoOut(torch.autograd.Function):
    """(h * s, sin(h)): two outputs, one parameter s."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(h, s)
        return h * s, torch.sin(h)

    @staticmethod
    def backward(ctx: Any, grad_a: torch.Tensor, grad_b: torch.Tensor) -> tuple[Any, Any]:
        h, s = ctx.saved_tensors
        return grad_a * s + grad_b * torch.cos(h), (grad_a * h).sum(0)


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = TwoOut.apply(self.lin(x), self.scale)
        return a + 2 * b


def float_tied_lm() -> nn.Module:
    """Exercise 02.1's stage: TiedLM fed floats, `x @ E` standing for the lookup `E[ids]`."""

    class FloatTiedLM(TiedLM):
        def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (batch, vocab)
            return self.block(x @ self.embed.weight) @ self.embed.weight.T

    return FloatTiedLM(vocab=4)  # vocab 4: the notebook's compare feeds (3, 4) tensors


# ----------------------------------------------------------------- the naive split


def _naive_split(
    model: nn.Module, x: torch.Tensor, grad_out: torch.Tensor, per_output: bool
) -> None:
    """The notebook's naive I then W on `model(x)`; per_output: exercise 02.2's change."""
    xi = x.clone().requires_grad_()
    out, weights = model(xi), list(model.parameters())
    reverse = build_reverse_graph([grad_node(out)])
    closure, _ = reverse_closure([grad_node(xi)], set(), reverse)
    splits = {p: reverse_closure([grad_node(p)], closure, reverse)[1] for p in weights}
    captured: dict[Any, tuple] = {}  # split node -> the gradients arriving at its outputs
    nodes = set().union(*splits.values())
    hooks = [n.register_prehook(lambda g, n=n: captured.__setitem__(n, g)) for n in nodes]
    torch.autograd.backward([out], [grad_out], inputs=[xi], retain_graph=True)
    for hook in hooks:
        hook.remove()
    for p in weights:  # W, parameter by parameter
        edges, grads = [], []
        for n in splits[p]:
            arrived = [(k, g) for k, g in enumerate(captured[n]) if g is not None]
            if per_output:  # each recorded gradient back on the output it arrived at
                edges += [GradientEdge(n, k) for k, _ in arrived]
                grads += [g for _, g in arrived]
            else:  # the notebook's version: all of them summed onto output 0
                edges.append(GradientEdge(n, 0))
                grads.append(sum(g for _, g in arrived))
        torch.autograd.backward(edges, grads, inputs=[p], retain_graph=True)


def naive_errors(make_stage: Callable[[], nn.Module], per_output: bool = False) -> dict[str, float]:
    """Parameter name -> max |naive .grad - plain autograd's|, for the wrong ones only."""
    with torch.random.fork_rng(devices=[]):  # the learner's random stream stays as it was
        torch.manual_seed(0)
        model = make_stage()
        x, grad_out = torch.randn(3, 4), torch.randn(3, 4)
    reference = copy.deepcopy(model)
    reference(x).backward(grad_out)  # the oracle
    _naive_split(model, x, grad_out, per_output)
    errors = {}
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        if (diff := (p.grad - q.grad).abs().max().item()) > 1e-6:
            errors[name] = diff
    return errors


# ----------------------------------------------------------------- the exercises


@exercise("02.1", "the set of parameter names whose naive-split gradient is wrong (set() if none)")
def naive_on_tied_weights(answer: Any) -> tuple[bool, str]:
    wrong = naive_errors(float_tied_lm)
    got = as_names(answer)
    if got is None:
        return False, f"give a set of parameter names such as {{'lin.weight'}}, got {answer!r}"
    if got == {n.lower() for n in wrong}:
        if not wrong:
            return True, "the naive split gets every gradient right on this stage"
        worst = max(wrong, key=wrong.__getitem__)
        return True, (
            f"{', '.join(sorted(wrong))} (off by up to {wrong[worst]:.3f}): the tied weight is "
            "used twice along one path, x @ E at the input and h @ E.T at the output, as in "
            "Twice: the naive W counts the inner use twice. The weights used once come out right."
        )
    with torch.random.fork_rng(devices=[]):
        names = {n.lower() for n, _ in float_tied_lm().named_parameters()}
    if unknown := sorted(got - names):
        return False, f"{', '.join(unknown)}: no such parameter; compare's rows name them"
    if extra := sorted(got - {n.lower() for n in wrong}):
        return False, (
            f"{', '.join(extra)}: the naive split gets this one right (compare says): it is used "
            "once, so its one path is counted once"
        )
    if not got:
        return False, (
            "the naive split does not survive: a tied weight is used at the input and again at "
            "the output, two uses along one path as in Twice; run compare on it and read its rows"
        )
    return False, (
        "a gradient is missing: a weight used twice along one path has its inner use counted "
        "twice by the naive W; which weight does the model use twice?"
    )


_GRAPHS = {"twice": Twice, "gate": Gate}
_ALIASES = {"twice": "twice", "gate": "gate", "twoout": "gate", 1: "twice", 2: "gate"}


@exercise("02.2", "the name of the graph the per-output change fixes: 'Twice' or 'Gate'")
def per_output_fixes(answer: Any) -> tuple[bool, str]:
    before = {name: naive_errors(make) for name, make in _GRAPHS.items()}
    after = {name: naive_errors(make, per_output=True) for name, make in _GRAPHS.items()}
    fixed = {name for name in _GRAPHS if before[name] and not after[name]}
    key = answer.strip().lower() if isinstance(answer, str) else answer
    if is_count(key) or isinstance(key, str):
        got = _ALIASES.get(key)
    else:
        got = None
    if got is None:
        return False, f"give one graph's name, 'Twice' or 'Gate', got {answer!r}"
    if {got} == fixed:
        (still,) = set(_GRAPHS) - fixed
        worst = max(after[still].values())
        return True, (
            f"{got.capitalize()}: with each recorded gradient back on its own output, its "
            f"gradients come out right. {still.capitalize()} stays wrong (off by {worst:.3f}): "
            "its fault is where W starts (two split points on one path, the inner one fed "
            "twice), not how a node's gradients are fed in."
        )
    return False, (
        f"with the change, compare({got.capitalize()}) still says WRONG: the change only feeds "
        "each output of a split node its own gradient, it does not change where W starts; "
        "which of the two faults is about a node with several outputs?"
    )


@exercise("02.3", "the set of the stepper's rows whose .grad is filled after F and I")
def filled_after_i(answer: Any) -> tuple[bool, str]:
    with torch.random.fork_rng(devices=[]):
        stage = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))  # as the stepper's
        x = torch.randn(4, 3, requires_grad=True)
    out = stage(x)  # F
    weights = list(stage.parameters())
    result = stage_backward_input([out], [torch.ones_like(out)], [x], weights)  # I
    rows = {"input[0]": result.input_grads[0]} | {n: p.grad for n, p in stage.named_parameters()}
    filled = {name for name, g in rows.items() if g is not None}
    got = as_names(answer)
    if got is None:
        return False, f"give a set of row names such as {{'0.bias'}}, got {answer!r}"
    got = {"input[0]" if g in ("x", "input", "input x") else g for g in got}
    if got == filled:
        return True, (
            f"only {', '.join(sorted(filled))}: I runs the input closure and hands x's gradient "
            f"back at once; the {len(weights)} parameters stay empty until W. A second W is "
            "refused: what I captured for W is used up by the first, and running it again "
            "would add every weight gradient a second time."
        )
    if unknown := sorted(got - set(rows)):
        return False, f"{', '.join(unknown)}: no such row; the table names {', '.join(rows)}"
    if early := sorted(got - filled):
        return False, f"{', '.join(early)}: still empty after I, which leaves every parameter to W"
    return False, (
        "I runs the input closure only, to hand one gradient back at once: which one does the "
        "previous stage wait for?"
    )


@exercise("02.4", "the index (an int) of the parameter group holding the most numbers")
def biggest_group(answer: Any) -> tuple[bool, str]:
    block, a = block_analysis()
    params = dict(block.named_parameters())
    numbers = [sum(params[n].numel() for n in g.param_names) for g in a.groups]
    best = max(range(len(numbers)), key=numbers.__getitem__)
    if not is_count(answer):
        return False, f"give a group's index, an int from 0 to {len(numbers) - 1}, got {answer!r}"
    if answer == best:
        # the gradient I captures at each split point: one tensor per output of the node
        captured = {
            (g.index, label): sum(torch.Size(s).numel() for s in output_shapes(node))
            for g in a.groups
            for label, node in zip(g.intermediates, g.group.intermediates, strict=True)
        }
        (group, label) = max(captured, key=captured.__getitem__)
        same = "this group's too" if group == best else f"group {group}'s, another group"
        return True, (
            f"group {best} ({', '.join(a.groups[best].param_names)}): {numbers[best]} numbers "
            f"of {sum(numbers)}. The largest gradient captured at a split point, "
            f"{captured[(group, label)]} numbers at {label}, is {same}."
        )
    if not 0 <= answer < len(numbers):
        return False, f"there are {len(numbers)} groups, 0 to {len(numbers) - 1}"
    return False, (
        f"group {answer} holds {numbers[answer]} numbers; another holds more. A group's size "
        "is the sum of its weights' and biases' sizes, and a transformer's MLP is wider than "
        "its attention: multiply out each shape"
    )
