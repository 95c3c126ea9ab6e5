"""One microbatch through the stages, each stage's autograd graph kept for the checks.

Stage s > 0 gets the previous stage's outputs as fresh leaves (floating ones require grad),
as both runtimes hand a received activation to a stage. The last stage's backward starts at
`loss_fn(output, target)`; without a loss_fn, at its outputs with ones as their gradients.
The caller restores what the forwards changed (`preserved`): gradients, buffers, RNG.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import Node

from zbkit.doctor._setup import Setup, StageInfo
from zbkit.pipeline.stage import PipelineStage


@dataclass
class Traced:
    stage: StageInfo
    inputs: list[torch.Tensor]  # the leaves the stage received (those requiring grad)
    roots: list[torch.Tensor]  # where its backward starts: the loss, or its outputs
    grads: list[torch.Tensor] | None  # the roots' gradients (None: the roots are the loss)
    nodes: list[Node]  # every node reachable from the roots, nearest first

    def param_names(self) -> dict[int, str]:
        """id(parameter) -> its (first) name in the stage's module."""
        names: dict[int, str] = {}
        for name, p in self.stage.module.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), name)
        return names


def first_microbatch(value: Any, m: int) -> Any:
    """Microbatch 0 of a batch, as torch and zbkit cut it (`tensor_split` on rows)."""
    if isinstance(value, torch.Tensor):
        return value.tensor_split(m)[0] if value.dim() else value
    if isinstance(value, tuple | list):
        return type(value)(first_microbatch(v, m) for v in value)
    if isinstance(value, dict):
        return {k: first_microbatch(v, m) for k, v in value.items()}
    return value


def graph_nodes(roots: list[torch.Tensor]) -> list[Node]:
    seen: dict[Node, None] = {}
    todo = [t.grad_fn for t in roots if t.grad_fn is not None]
    while todo:
        node = todo.pop(0)
        if node in seen:
            continue
        seen[node] = None
        todo += [n for n, _ in node.next_functions if n is not None and n not in seen]
    return list(seen)


def trace(setup: Setup, inputs: Any, target: Any, loss_fn: Any) -> tuple[list[Traced], list[str]]:
    """Each stage's graph for microbatch 0 (stages whose input is unknown here skipped)."""
    m, n = setup.schedule.microbatches, setup.schedule.num_stages
    traced: list[Traced] = []
    skipped: list[str] = []
    message: Any = None
    for s in sorted(setup.stages, key=lambda s: s.index):
        if s.index == 0:
            message = first_microbatch(inputs, m)
        elif message is None or traced[-1].stage.index != s.index - 1:
            skipped.append(f"{setup.where(s)}'s graph: its input comes from another rank")
            message = None
            continue
        stage = PipelineStage(s.module, s.index, n)  # zbkit's forward reads every form
        given = _leaves(message) if s.index else message
        out = stage.forward(0, given)
        stage.reset()  # the graph stays with `out`; the stage object is dropped
        leaves = [v for v in given.values() if _grad_leaf(v)] if s.index else []
        message = dict(out)
        roots, grads = _roots(s.index == n - 1, stage, out, target, loss_fn, m)
        traced.append(Traced(s, leaves, roots, grads, graph_nodes(roots)))
    return traced, skipped


def _grad_leaf(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and v.requires_grad


def _leaves(message: Any) -> dict[str, Any]:
    """A received message: every tensor detached, floating ones requiring grad."""
    out = {}
    for k, v in dict(message).items():
        if isinstance(v, torch.Tensor):
            v = v.detach().requires_grad_(v.is_floating_point() or v.is_complex())
        out[k] = v
    return out


def _roots(
    last: bool, stage: PipelineStage, out: dict, target: Any, loss_fn: Any, m: int
) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    if last and loss_fn is not None:
        return [loss_fn(stage.module_output(out), first_microbatch(target, m))], None
    roots = [t for t in out.values() if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    return roots, [torch.ones_like(t) for t in roots]


@contextlib.contextmanager
def preserved(modules: list[nn.Module]) -> Iterator[None]:
    """Put back every parameter's `.grad`, every buffer and the RNG after the checks."""
    params = {id(p): p for m in modules for p in m.parameters()}
    grads = {k: p.grad for k, p in params.items()}
    buffers = [(b, b.detach().clone()) for m in modules for b in m.buffers()]
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            for k, p in params.items():
                p.grad = grads[k]
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)
