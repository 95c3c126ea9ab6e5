"""What one microbatch's input pass (I) leaves for its weight pass (W).

A `ParamGroup` is what the analysis finds about a graph: which parameters, which
split points. It never changes. What changes per microbatch are tensors: the
gradients I captured at the split points, and the gradients of the outputs W
starts from. Those live here, in a `PendingWeight` that W consumes exactly once:

    result = stage_backward_input(...)   # result.pending_weight: waiting for W
    stage_backward_weight(weights, result.pending_weight)   # consumed
    stage_backward_weight(weights, result.pending_weight)   # RuntimeError: already ran

A `PendingWeight` is also a read-only sequence of its ParamGroups (until W ran),
so `result.param_groups[0].intermediates` reads as it always did.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import overload

import torch
from torch.autograd.graph import GradientEdge

from zbkit.splitgrad._check import SplitCheck
from zbkit.splitgrad._groups import ParamGroup

Captured = tuple[torch.Tensor | None, ...]  # one gradient per output edge of a node


@dataclass(eq=False)
class PendingGroup:
    """One group's share of a PendingWeight: the group plus the tensors W starts from."""

    group: ParamGroup
    tensors: list[torch.Tensor]  # the parameter tensors, in group.param_nodes order
    # per intermediate: the gradients it received in I, one per output edge
    # (None: I never reached it); not in the repr, tensors would flood a notebook
    captured: list[Captured | None] = field(default_factory=list, repr=False)
    # outputs outside the input closure: W starts there, with the caller's gradient
    roots: list[tuple[GradientEdge, torch.Tensor]] = field(default_factory=list, repr=False)
    # a group whose weight half I computed on the way (a LayerNorm's, see
    # _fast.eager_edges): the parameter edges and their gradients, which W only
    # delivers into `.grad`; empty for every other group
    ready: list[tuple[GradientEdge, torch.Tensor | None]] = field(default_factory=list, repr=False)
    # what W frees at the intermediate once it ran (`_free.release_named`), known from
    # the analysis plan; None: find out (`_free.release_saved`)
    free: tuple[str, ...] | None = field(default=None, repr=False)

    def start_edges(self) -> tuple[list[GradientEdge], list[torch.Tensor]]:
        """Where one engine call for this group's W starts, and with which gradients."""
        if self.ready:  # None: no gradient reached that parameter in I
            pairs = [(e, g) for e, g in self.ready if g is not None]
        else:
            pairs = list(self.roots)
            for node, grads in zip(self.group.intermediates, self.captured, strict=True):
                pairs += [
                    (GradientEdge(node, k), g) for k, g in enumerate(grads or ()) if g is not None
                ]
        return [e for e, _ in pairs], [g for _, g in pairs]


class PendingWeight(Sequence[ParamGroup]):
    """One microbatch's W, waiting: `stage_backward_weight` consumes it once.

    Iterating gives the ParamGroups (empty once W ran: nothing is kept that would
    hold the graph alive).
    """

    def __init__(self, groups: list[PendingGroup], check: SplitCheck | None = None) -> None:
        self._groups: list[PendingGroup] | None = groups
        self.check = check  # check_split: W's gradients against a whole backward's

    @property
    def done(self) -> bool:
        """Whether W already ran on it."""
        return self._groups is None

    def take(self) -> list[PendingGroup]:
        """Hand the groups to W, once; a second call raises."""
        if self._groups is None:
            raise RuntimeError(
                "this microbatch's W already ran; run stage_backward_input again "
                "(after a new forward) before another stage_backward_weight"
            )
        groups, self._groups = self._groups, None
        return groups

    @overload
    def __getitem__(self, i: int) -> ParamGroup: ...
    @overload
    def __getitem__(self, i: slice) -> list[ParamGroup]: ...
    def __getitem__(self, i: int | slice) -> ParamGroup | list[ParamGroup]:
        return [p.group for p in self._groups or ()][i]

    def __len__(self) -> int:
        return len(self._groups or ())

    def __repr__(self) -> str:
        if self._groups is None:
            return "PendingWeight(W done)"
        n = len(self._groups)
        return f"PendingWeight({n} param group{'' if n == 1 else 's'}, waiting for W)"
