"""Which half of a backward the current pass wants.

A split backward runs every node twice at most: once in the input pass (I),
which only needs gradients flowing towards the stage inputs, and once in the
weight pass (W), which only needs gradients flowing towards parameters.
Built-in ops skip the unneeded half on their own (autograd tells them which
output edges are needed); a custom ``autograd.Function`` cannot see that, so it
asks ``needs_direction``::

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        gx = grad @ w.T if needs_direction(GradDirection.INPUT) else None
        gw = grad.T @ x if needs_direction(GradDirection.WEIGHT) else None
        return gx, gw

INPUT is the half for arguments that depend on the stage inputs (activations),
WEIGHT the half for parameters. Outside any split pass both are wanted. The
input pass asks for INPUT only; the weight pass for WEIGHT only, except for a
parameter group where a custom Function takes an argument computed from
parameters alone (an embedding's output on a first stage, `w * 2`): there W asks
for both, so the Function stays exact whichever half it files that argument in.

The state is a context variable, so threads and async tasks do not see each
other's passes. Backward functions that autograd runs on an accelerator's
worker thread see the default (both directions): exact, just not skipping.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar


class GradDirection(enum.Enum):
    """The half of a backward a pass wants: ``needs_direction(GradDirection.INPUT)``."""

    INPUT = "input"  # gradients towards the stage inputs (activations)
    WEIGHT = "weight"  # gradients towards parameters


_BOTH = frozenset(GradDirection)
_current: ContextVar[frozenset[GradDirection]] = ContextVar("zbkit_grad_directions", default=_BOTH)


@contextmanager
def grad_directions(*dirs: GradDirection) -> Iterator[None]:
    """Within the block, `needs_direction(d)` is True exactly for the given directions."""
    for d in dirs:
        if not isinstance(d, GradDirection):
            raise TypeError(f"grad_directions takes GradDirection members, got {d!r}")
    token = _current.set(frozenset(dirs))
    try:
        yield
    finally:
        _current.reset(token)  # nests: restores whatever the enclosing block set


def needs_direction(direction: GradDirection) -> bool:
    """Whether the backward pass running now wants gradients in `direction`."""
    return direction in _current.get()
