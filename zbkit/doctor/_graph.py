"""Checks that read one traced microbatch's autograd graph (see `_trace`).

- a torch.compile region (a backward node of a custom Function of torch._functorch's, like
  `CompiledFunctionBackward`, splitgrad's `opaque_node`) in the input closure of a stage
  whose backward is split;
- a reentrant activation checkpoint (`CheckpointFunctionBackward`) in such a stage;
- under torch's own split: torch's `stage_backward_input` then `stage_backward_weight`, run
  on the traced graph (the installed torch's own functions), and what they did: raised (a
  weight used twice, with another weight between) or left weight gradients out (no stage
  input reaches the outputs, so torch finds no parameter group).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.utils.checkpoint
from torch.autograd.graph import Node
from torch.distributed.pipelining import _backward as torch_backward

from zbkit.doctor._setup import Setup
from zbkit.doctor._trace import Traced
from zbkit.doctor.findings import Finding
from zbkit.splitgrad import build_reverse_graph, opaque_node, reverse_closure

SECOND_TIME = "backward through the graph a second time"


def compiled_node(t: Traced) -> str | None:
    """The first compiled region's backward in the stage's input closure: the nodes a split
    runs at I and again at W (one only the weights feed runs at W alone, once)."""
    inputs = [n for n in map(_node, t.inputs) if n is not None]
    reverse = build_reverse_graph(r.grad_fn for r in t.roots)
    closure, _ = reverse_closure(inputs, set(), reverse)
    return opaque_node(n for n in t.nodes if n in closure)


def reentrant_node(nodes: list[Node]) -> str | None:
    for node in nodes:
        if getattr(node, "_forward_cls", None) is torch.utils.checkpoint.CheckpointFunction:
            return type(node).__name__
    return None


def check_compiled(setup: Setup, t: Traced) -> list[Finding]:
    node = compiled_node(t)
    if node is None or not setup.splits(t.stage):
        return []
    where = f"{setup.where(t.stage)}, node {node}"
    if setup.exact:
        return [Finding(
            "compiled-region", where,
            "zbkit runs this stage's backward whole at I (input and weight gradients in one "
            "call, exact) and warns once (zbkit.splitgrad.WholeBackwardWarning): its I costs "
            "I + W and W only adds the gradients, so the schedule loses its split here",
            "compile only the blocks' parameter-free parts, or leave this stage uncompiled; "
            "a schedule without I/W (1F1B, GPipe) loses nothing",
            "slower", t.stage.index, setup.rank_of(t.stage),
        )]  # fmt: skip
    return [Finding(
        "compiled-region", where,
        "torch's split runs the compiled backward twice, once at I and once at W: with "
        "inductor a 'donated buffers' error, otherwise possibly wrong weight gradients "
        "(pytorch/pytorch issue 161904); torch refuses a compiled wrapper (OptimizedModule) "
        "in its zero-bubble schedules, not a module compiled in place or a compiled function",
        "run the step inside zbkit.torchpp.exact_split_backward() (the stage then runs "
        "whole at I, exact), or a schedule without I/W (Schedule1F1B, ScheduleGPipe)",
        "wrong", t.stage.index, setup.rank_of(t.stage),
    )]  # fmt: skip


def check_reentrant(setup: Setup, t: Traced) -> list[Finding]:
    node = reentrant_node(t.nodes)
    if node is None or not setup.splits(t.stage):
        return []
    happens = (
        "its I raises: zbkit names the cause (a reentrant checkpoint cannot be split into I "
        "and W: its backward reruns the forward and a whole backward of its own)"
        if setup.exact
        else "torch's I raises RuntimeError 'When use_reentrant=True, torch.utils.checkpoint "
        "is incompatible with .grad() or passing an `inputs` parameter to .backward()'"
    )
    return [Finding(
        "reentrant-checkpoint", f"{setup.where(t.stage)}, node {node}", happens,
        "checkpoint(..., use_reentrant=False) (HF: gradient_checkpointing_enable("
        "gradient_checkpointing_kwargs={'use_reentrant': False})); the gradients are the same",
        "fails", t.stage.index, setup.rank_of(t.stage),
    )]  # fmt: skip


def check_torch_split(setup: Setup, t: Traced) -> list[Finding]:
    """torch's own I and W on the traced microbatch (the caller restores `.grad`)."""
    if setup.runtime != "torch" or not setup.splits(t.stage):
        return []
    if compiled_node(t) or reentrant_node(t.nodes):
        return []  # reported above, with their own fix
    params = [p for p in t.stage.module.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    try:
        _, groups = torch_backward.stage_backward_input(t.roots, t.grads, t.inputs, iter(params))
        torch_backward.stage_backward_weight(iter(params), groups)
    except RuntimeError as exc:
        text = f"{exc} {exc.__cause__ or ''}"
        if SECOND_TIME not in text:
            raise
        return [_reused(setup, t)]
    return _missing(setup, t, params)


def _reused(setup: Setup, t: Traced) -> Finding:
    names = t.param_names()
    uses: dict[int, int] = {}
    for node in t.nodes:
        for nxt, _ in node.next_functions:
            var = getattr(nxt, "variable", None)
            if var is not None:
                uses[id(var)] = uses.get(id(var), 0) + 1
    twice = [names[k] for k, n in uses.items() if n > 1 and k in names]
    return Finding(
        "weight-reused-in-stage",
        f"{setup.where(t.stage)}, parameter(s) used more than once: {', '.join(twice) or '?'}",
        "torch's stage_backward_weight raises RuntimeError 'Trying to backward through the "
        "graph a second time': its parameter groups walk the shared part of the graph once "
        "per group and free it after the first",
        "run the step inside zbkit.torchpp.exact_split_backward() (exact on any graph), or "
        "zbkit's runtimes",
        "fails", t.stage.index, setup.rank_of(t.stage),
    )  # fmt: skip


def _missing(setup: Setup, t: Traced, params: Sequence[torch.Tensor]) -> list[Finding]:
    reached = {id(getattr(n, "variable", None)) for n in t.nodes}
    lost = [p for p in params if id(p) in reached and p.grad is None]
    if not lost:
        return []
    names = t.param_names()
    dead = [i for i, x in enumerate(t.inputs) if _node(x) not in set(t.nodes)]
    inputs = f"input(s) {dead} require grad but do not reach the outputs; " if dead else ""
    return [Finding(
        "input-not-reaching-loss",
        f"{setup.where(t.stage)}, {inputs}parameters without a gradient: "
        f"{', '.join(names.get(id(p), '?') for p in lost)}",
        "torch's split finds its parameter groups between the stage's inputs and outputs; "
        "these parameters are in none, so torch silently computes no gradient for them "
        "(.grad stays None) and the optimizer skips them",
        "run the step inside zbkit.torchpp.exact_split_backward() (exact), or zbkit's "
        "runtimes; or make the stage's output depend on its input",
        "wrong", t.stage.index, setup.rank_of(t.stage),
    )]  # fmt: skip


def _node(x: torch.Tensor) -> Node | None:
    if x.grad_fn is not None:
        return x.grad_fn
    view = x.view_as(x)  # a leaf's AccumulateGrad, made on demand
    return view.grad_fn.next_functions[0][0] if view.grad_fn is not None else None
