"""The fast paths of I, apart from its reference path (`_backward.stage_backward_input`).

I's reference path analyses the graph, hooks each group's split points to record the
gradients arriving there, and makes one engine call to the stage inputs. Where the fast
paths may be used (`_fast.use_fast_paths()`), `FastInput` adds to that, at three points
the reference path calls it:

- `take_group`: the analysis comes from the per-structure cache (`_plan`), so each group
  learns which saved tensors its W may free; a LayerNorm-like group gets its weight
  gradients in I (the same kernel call as its input gradient) instead of hooks;
- `free_early`: hooks that free what only I needs as soon as its node has run;
- `finish`: hands those weight gradients to their groups and frees the rest of what
  only I needed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.autograd.graph import GradientEdge, Node
from torch.utils.hooks import RemovableHandle

from zbkit.splitgrad import _fast, _plan
from zbkit.splitgrad._free import release_named, release_when_run
from zbkit.splitgrad._pending import PendingGroup


class FastInput:
    """I's fast paths for one call; `start` gives None where they may not be used."""

    def __init__(self, plan: _plan.BoundPlan, run_i: bool) -> None:
        self.plan = plan  # the cached analysis, bound to this graph
        self.eager = run_i  # weight halves in I only when I really runs
        self.ready_edges: list[GradientEdge] = []  # parameter edges I also asks for
        self.late: list[tuple[Node, tuple[str, ...]]] = []  # what to free when I returns

    @classmethod
    def start(
        cls,
        out_nodes: list[Node],
        input_nodes: list[Node],
        weights: list[torch.Tensor],
        run_i: bool,
    ) -> FastInput | None:
        if not _fast.use_fast_paths():
            return None
        plan = _plan.analyse_cached(out_nodes, input_nodes, weights)
        return None if plan is None else cls(plan, run_i)

    def take_group(self, i: int, work: PendingGroup) -> bool:
        """Prepare group `i`; True if I computes its weight gradients (nothing to capture)."""
        group = work.group
        if len(group.intermediates) == 1:
            work.free = self.plan.slot_names(group.intermediates[0])
        edges = _fast.eager_edges(self.plan.eager[i]) if self.eager else []
        if not edges:
            return False
        work.ready = [(e, None) for e in edges]
        self.ready_edges += edges
        return True

    def free_early(
        self, works: list[PendingGroup], tensors: Sequence[torch.Tensor]
    ) -> list[RemovableHandle]:
        """Hooks freeing what only I needs as soon as its node ran (the rest: `finish`)."""
        if not self.eager:
            return []
        early, rest = self.plan.input_only(works, tuple(t.shape for t in tensors))
        self.late = [(node, self.plan.slot_names(node)) for node in rest]
        return [release_when_run(node, self.plan.slot_names(node)) for node in early]

    def finish(self, works: list[PendingGroup], ready_grads: Sequence[torch.Tensor | None]) -> None:
        """After I's engine call: the weight gradients it computed go to their groups."""
        found = iter(ready_grads)
        for work in works:
            work.ready = [(e, next(found)) for e, _ in work.ready]
        for node, names in self.late:
            release_named(node, names)
