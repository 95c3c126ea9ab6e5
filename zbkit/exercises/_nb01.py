"""Notebook 01's exercises: the autograd graph, the input closure, parameter groups.

Each checker rebuilds the stage the exercise names (same shapes as the notebook's; the
values do not matter, only the graph), analyses it with `analyze` and compares.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch import nn

from zbkit.exercises._core import as_names, block_analysis, exercise, is_count
from zbkit.splitgrad import SplitGradAnalysis, analyze


def op_name(label: str) -> str:
    """'TanhBackward0#1' -> 'tanhbackward0': torch's name, without the number analyze adds."""
    return label.split("#")[0].lower()


def _closure(a: SplitGradAnalysis) -> set[str]:
    return {a.labels[n] for n in a.input_closure}


def _op_counts(a: SplitGradAnalysis) -> Counter[str]:
    """How many nodes carry each op name ('TBackward0': 2); parameters and inputs left out."""
    return Counter(label.split("#")[0] for label in a.labels.values() if "#" in label)


def _mlp_graphs(
    variant: str,
) -> tuple[SplitGradAnalysis, SplitGradAnalysis]:
    """(the notebook's MLP analysed, the same MLP changed as exercise `variant` says)."""
    with torch.random.fork_rng(devices=[]):  # the learner's random stream stays as it was
        mlp = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
        x = torch.randn(4, 3, requires_grad=True)  # (batch, features)
        plain = analyze(mlp(x), x, mlp)
        if variant == "skip":
            return plain, analyze(mlp(x) + x @ torch.ones(3, 2), x, mlp)
        if variant == "frozen":
            mlp[0].requires_grad_(False)
            return plain, analyze(mlp(x), x, mlp)  # a new forward: the graph is recorded then
        data = x.detach()  # "data": a first stage's input, which needs no gradient
        return plain, analyze(mlp(data), data, mlp)


@exercise("01.1", "the set of labels (as analyze prints them) of the nodes that join the closure")
def skip_joins_the_closure(answer: Any) -> tuple[bool, str]:
    plain, skip = _mlp_graphs("skip")
    joined = _closure(skip) - _closure(plain)
    got = as_names(answer)
    if got is None:
        return False, f"give a set of labels such as {{'TanhBackward0#1'}}, got {answer!r}"
    # a label names one node; torch's name alone stands for every node that carries it
    by_name = {label.lower(): {label} for label in skip.labels.values()}
    for label in skip.labels.values():
        by_name.setdefault(op_name(label), set()).add(label)
    unknown = sorted(g for g in got if g not in by_name)
    meant = set().union(*(by_name[g] for g in got if g in by_name))
    if unknown:
        return False, f"{', '.join(unknown)}: no such node; print(analyze(out, x, mlp)) lists them"
    if meant == joined:
        return True, (
            f"{', '.join(sorted(joined))} join: the skip gives x a second path to the output, "
            f"and x.grad needs every node on it; the closure grows from "
            f"{len(plain.input_closure)} to {len(skip.input_closure)} nodes."
        )
    already = sorted(meant & _closure(plain))
    if already:
        return False, (
            f"{', '.join(already)}: in the closure before the skip (x already reached the output "
            "through them); name only the nodes on x's new path"
        )
    outside = sorted(meant - _closure(skip))
    if outside:
        return False, (
            f"{', '.join(outside)}: only on a parameter's path; x.grad never passes through it, "
            "so it stays outside the closure"
        )
    missing = len(joined - meant)
    return False, (
        f"{missing} more {'node joins' if missing == 1 else 'nodes join'}: every op on a path "
        "from x to the output is in the closure; follow x's new path op by op, from `x @ ones` "
        "to the `+` that meets the MLP's output"
    )


@exercise("01.2", "the number of autograd nodes of the frozen MLP's graph (an int)")
def frozen_graph_size(answer: Any) -> tuple[bool, str]:
    plain, frozen = _mlp_graphs("frozen")
    before, after = len(plain.reverse_graph), len(frozen.reverse_graph)
    if not is_count(answer):
        return False, f"give a number of nodes, got {answer!r}"
    if answer == after:
        gone = frozen.frozen_params + sorted(_op_counts(plain) - _op_counts(frozen))
        return True, (
            f"{after} nodes, {before - after} fewer ({', '.join(gone)}): a parameter that needs "
            "no gradient gets no AccumulateGrad node, and an op none of whose inputs needs one "
            "is not recorded at all. "
            f"{len(frozen.groups)} group is left ({', '.join(frozen.groups[0].param_names)}); "
            f"frozen_params lists {', '.join(frozen.frozen_params)}."
        )
    if answer == before:
        return False, (
            f"{before} is the unfrozen graph: autograd records the graph during the forward, "
            "so run the stage again after freezing, then analyse"
        )
    if answer == before - len(frozen.frozen_params):
        return False, (
            "both AccumulateGrad nodes are gone, yes; but an op whose inputs all need no gradient "
            "is not recorded either, and one more node served only 0.weight"
        )
    if answer < after:
        return False, (
            "too few: x still requires grad, so every op on its path is still recorded, and the "
            "second layer's parameters still need their nodes"
        )
    return False, (
        f"{answer} is not it: freezing removes only what served the frozen parameters alone "
        "(their AccumulateGrad nodes and ops fed by them only); print(analysis) starts with "
        "the count"
    )


@exercise("01.3", "the number of nodes in the input closure of a stage fed by data (an int)")
def first_stage_closure(answer: Any) -> tuple[bool, str]:
    plain, first = _mlp_graphs("data")
    size = len(first.input_closure)
    if not is_count(answer):
        return False, f"give a number of nodes, got {answer!r}"
    if answer == size:
        starts = ", ".join(first.groups[0].outputs)
        return True, (
            f"{size} nodes: no input needs a gradient, so the closure is empty and stage 0's "
            f"I pass has nothing to compute. All its backward is W, which starts at the output "
            f"({starts}): {len(first.groups)} group for all "
            f"{sum(len(g.param_names) for g in first.groups)} parameters."
        )
    if answer == len(plain.input_closure):
        return False, (
            f"{answer} is the closure while x requires grad; the walk starts at the input's node, "
            "and a tensor that needs no gradient gets no node"
        )
    return False, (
        "the closure is what the input's gradient needs; data needs no gradient, so autograd "
        "gives it no node to start the walk from"
    )


@exercise("01.4", "the set of op names W runs that I never runs, apart from the parameters")
def ops_only_w_runs(answer: Any) -> tuple[bool, str]:
    _, a = block_analysis()
    params = {name for g in a.groups for name in g.param_names}
    outside = [a.labels[n] for n in a.reverse_graph if n not in a.input_closure]
    ops = [label for label in outside if label not in params]
    want = {op_name(label) for label in ops}
    got = as_names(answer)
    if got is None:
        return False, f"give a set of op names such as {{'TanhBackward0'}}, got {answer!r}"
    got = {op_name(g) for g in got}
    shown = ", ".join(sorted({label.split("#")[0] for label in ops}))
    if got == want:
        return True, (
            f"only {shown} ({len(ops)} of them, the transposes of the Linear weights): with the "
            f"{len(params)} parameters that is all {len(outside)} of {len(a.reverse_graph)} "
            "nodes outside the input closure. Each depth-2 box (a Linear) holds one, so none is "
            "free of W; W also re-enters each split point for its weight half, a node I runs too."
        )
    if got & ({p.lower() for p in params} | {"accumulategrad", "torch::autograd::accumulategrad"}):
        return False, (
            "leave the parameters' own nodes (AccumulateGrad) out: they are where W ends, "
            "the question asks for the ops W runs on the way"
        )
    closure_ops = {op_name(a.labels[n]): a.labels[n].split("#")[0] for n in a.input_closure}
    in_i = sorted(closure_ops[g] for g in got if g in closure_ops)
    if in_i:
        return False, (
            f"{', '.join(in_i)}: in the input closure (on h's path to the output), so I runs it"
        )
    return False, (
        "W alone runs the ops that lie only on parameters' paths, outside the input closure: "
        "some are missing; list the nodes outside block_analysis.input_closure and keep the ops"
    )
