"""How many bytes of activations a stage's forward keeps for its backward.

The simulator counts memory in microbatches (``Costs.mem_activation`` per F); a real run can
also say what that is in bytes. While a forward runs, autograd hands every tensor it saves
for the backward to ``saved_tensors_hooks``; their bytes, minus the parameters' (weights are
held anyway), are the activations that microbatch keeps until its I or B. A tensor counts
its own elements (a microbatch that is a slice of the batch counts its rows, not the whole
batch's storage), and a tensor saved twice counts once.

Counting costs a Python call per saved tensor, so a stage counts once per input signature
(names, shapes, dtypes) and reuses the number: microbatches of one shape save the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

Signature = tuple


def signature(inputs: Mapping[str, Any] | torch.Tensor) -> Signature:
    items = inputs.items() if isinstance(inputs, Mapping) else [("", inputs)]
    return tuple(
        (k, tuple(v.shape), v.dtype, v.requires_grad)
        for k, v in items
        if isinstance(v, torch.Tensor)
    )


def count_saved(module: nn.Module, run: Callable[[], Any]) -> tuple[Any, int]:
    """``run()``'s result and the bytes of the distinct tensors autograd saved meanwhile."""
    weights = {p.untyped_storage().data_ptr() for p in module.parameters()}
    saved: set[tuple[int, int]] = set()  # (address, bytes) of each tensor counted

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in weights:
            saved.add((t.data_ptr(), t.numel() * t.element_size()))
        # only counted; detached, as a hook must keep it: a saved output returned as is
        # would hold its own grad_fn, a cycle through C++ that gc cannot free
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = run()
    return result, sum(nbytes for _, nbytes in saved)
