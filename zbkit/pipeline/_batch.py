"""A step's batch, checked and cut into microbatches: the one check both executors run.

A batch is ``inputs`` and ``targets``, each a tensor, a tuple of them (stage 0's positional
inputs) or a dict of them (these may nest; a ``None`` inside stays ``None`` in every
microbatch). Every tensor is cut on dim 0 into ``m`` equal parts, and microbatch j takes
part j of each. That pairs the right rows only if every tensor has the same number of rows: were
``x`` 8 rows and ``y`` 4, microbatch j would pair rows 2j..2j+1 of x with row j of y, and
a loss like ``mse_loss`` would broadcast the mismatch without a word. So before cutting:

    every tensor, inputs and targets alike:  rows == the first tensor's rows
    those rows:                               > 0 and divisible by m
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch


def split_batch(
    m: int, inputs: Any, targets: Any = None
) -> tuple[list[Any] | None, list[Any] | None]:
    """``(inputs, targets)`` each as ``m`` microbatches; None stays None (not given here).

    Raises ValueError naming the tensor whose rows disagree, or the rows that do not
    divide into ``m``; TypeError for a value that is not a tensor.
    """
    given = {"inputs": inputs, "targets": targets}
    tensors = [leaf for name, b in given.items() if b is not None for leaf in _leaves(b, name)]
    if not tensors:
        return None, None
    first_name, first = tensors[0]
    rows = first.shape[0]
    for name, t in tensors[1:]:
        if t.shape[0] != rows:
            raise ValueError(
                f"{name} has {t.shape[0]} rows but {first_name} has {rows}: every tensor of a "
                f"batch must have the same first dimension (microbatch j takes part j of each)"
            )
    if rows == 0 or rows % m:
        raise ValueError(
            f"{first_name} has {rows} rows, which do not split into {m} equal microbatches; "
            f"use a batch size that is a positive multiple of schedule.microbatches ({m})"
        )
    return (
        None if inputs is None else _split(inputs, m),
        None if targets is None else _split(targets, m),
    )


def _leaves(batch: Any, name: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor in ``batch``; checks what cannot be cut on dim 0."""
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 0:
            raise ValueError(
                f"{name} is a 0-d tensor: it has no rows to split into "
                f"microbatches; give it a first dimension of the batch size, or pass it to "
                f"the module or loss another way"
            )
        yield name, batch
    elif isinstance(batch, Mapping):
        if not batch:
            raise ValueError(f"{name} is an empty dict: a batch needs at least one tensor")
        for k, v in batch.items():
            if v is not None:
                yield from _leaves(v, f"{name}[{k!r}]")
    elif isinstance(batch, tuple):  # not a list: that may be microbatches split already
        if not any(v is not None for v in batch):
            raise ValueError(f"{name} is a tuple without a tensor")
        for i, v in enumerate(batch):
            if v is not None:
                yield from _leaves(v, f"{name}[{i}]")
    else:
        raise TypeError(
            f"{name} must be a tensor, a tuple or a dict of tensors (each split on dim 0), "
            f"got {type(batch).__name__}"
        )


def _split(batch: Any, m: int) -> list[Any]:
    if batch is None:  # an absent optional input: None in every microbatch
        return [None] * m
    if isinstance(batch, torch.Tensor):
        return list(batch.chunk(m))  # rows % m == 0: m equal views
    if isinstance(batch, tuple):
        columns = [_split(v, m) for v in batch]
        return [tuple(c[j] for c in columns) for j in range(m)]
    parts = {k: _split(v, m) for k, v in batch.items()}
    return [{k: p[j] for k, p in parts.items()} for j in range(m)]
