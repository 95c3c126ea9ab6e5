"""Gradient accumulation: which micro-step we are on, and wrappers that respect it.

With `grad_accum_steps = k` the optimizer steps once per *window* of k micro-batches.
Gradients of a window add up in `.grad`; to make the sum a mean, each micro-batch's
loss is divided by the window's length. The last window of an epoch can be shorter
(10 batches, k = 4 -> windows of 4, 4, 2): it is still stepped, and its losses are
divided by 2, not 4, so every optimizer step sees a mean gradient.

    epoch:   b0 b1 b2 b3 | b4 b5 b6 b7 | b8 b9
    pos:      0  1  2  3 |  0  1  2  3 |  0  1
    sync:     .  .  .  S |  .  .  .  S |  .  S      S: all-reduce + optimizer step
    scale:   1/4 ...     | 1/4 ...     | 1/2 1/2

`GradientWindow` holds that state; the prepared dataloader announces each batch's
position, the backend's `accumulate()` turns it into `sync_gradients`, and the
optimizer/scheduler wrappers only act when `sync_gradients` is True.

A plain `loss.backward()` inside the context trains the same as `backend.backward(loss)`:
`prepare` hooks every parameter (`GradientWindow.parameter_grad`), so each gradient that
reaches one is seen (zero_grad then keeps it for the window's step) and, unless
`backend.backward` already divided its loss, divided by the window's length.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

import torch
from torch.optim import Optimizer


class GradientWindow:
    """Position inside the current accumulation window (one per backend)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps  # k: micro-batches per optimizer step
        self.reset()

    def reset(self) -> None:
        """Back to before the first micro-step (a fresh `prepare`)."""
        self.sync_gradients = True  # True on a window's last micro-step
        self.length = self.steps  # length of the current window (shorter at an epoch's end)
        self.position = 0  # index of the current micro-step inside its window
        self.optimizer_steps = 0  # optimizer steps actually taken
        self.grads_pending = False  # gradients reached .grad since the optimizer last stepped
        self.in_micro_step = False  # inside `with backend.accumulate(model):`
        self.loss_divided = False  # inside backend.backward(), whose loss is already divided
        self._announced: tuple[int, int] | None = None  # (position, length) from the loader
        self._counted = 0  # micro-steps counted when no prepared loader announces them

    def announce(self, position: int, length: int) -> None:
        """Called by the prepared dataloader just before it yields a batch."""
        self._announced = (position, length)

    def begin_micro_step(self) -> None:
        if self._announced is not None:
            self.position, self.length = self._announced
            self._announced = None
        else:
            # No prepared dataloader: fixed windows of k, counted across calls.
            self.position, self.length = self._counted % self.steps, self.steps
            self._counted += 1
        self.sync_gradients = self.position == self.length - 1
        self.in_micro_step = True

    def end_micro_step(self) -> None:
        self.in_micro_step = False

    def parameter_grad(self, grad: torch.Tensor) -> torch.Tensor:
        """Hook on every prepared parameter: runs on each gradient before it enters `.grad`.

        Dividing the gradient by the window's length is dividing the loss by it (the
        gradient is linear in the loss), so a plain `loss.backward()` adds the same mean
        as `backend.backward(loss)`, whichever loss terms reach the parameter.
        (`torch.autograd.grad` on parameters inside the context is divided too.)
        """
        if not self.in_micro_step:
            if self.steps > 1:
                raise RuntimeError(self.outside_message())
            return grad  # k = 1: every batch is a window of its own
        self.grads_pending = True
        if self.loss_divided or self.length == 1:
            return grad
        return grad / self.length

    def outside_message(self) -> str:
        return (
            f"loss.backward() ran outside `with backend.accumulate(model):` with "
            f"grad_accum_steps={self.steps}: the backend cannot tell which window this "
            f"gradient belongs to (the optimizer would step on it alone); run the forward "
            f"and the backward inside `with backend.accumulate(model):`"
        )


class AccumulatingLoader:
    """Wraps a dataloader; each epoch is cut into windows of `steps` batches.

    It reads a whole window ahead (at most `steps` batches) so it knows that window's
    length before its first micro-step, even for loaders without `len()`. Each new
    iteration (epoch) starts a new first window. Under DDP every rank must see the same
    number of batches (DistributedSampler ensures it), or the windows' all-reduces would
    not line up across ranks.
    """

    def __init__(self, loader: Iterable[Any], window: GradientWindow) -> None:
        self.loader = loader
        self._window = window

    def __iter__(self) -> Iterator[Any]:
        if not self._window.sync_gradients:
            # The last epoch was left mid-window (a `break`): its gradients were never
            # stepped and still sit in .grad, so they would leak into the first window.
            warnings.warn(
                f"a new epoch starts with {self._window.position + 1} micro-step(s) "
                f"of gradients not yet stepped (the previous loop stopped mid-window); call "
                f"the optimizer's step() or zero the gradients before iterating again",
                RuntimeWarning,
                stacklevel=2,
            )
        batches = iter(self.loader)
        while chunk := list(islice(batches, self._window.steps)):
            for position, batch in enumerate(chunk):
                self._window.announce(position, len(chunk))
                yield batch

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # dataset, sampler, batch_size, ... come from the wrapped loader
        if name == "loader":  # not set yet (copy/unpickle): don't recurse
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __repr__(self) -> str:
        return f"AccumulatingLoader({self.loader!r}, steps={self._window.steps})"


class AccumOptimizer:
    """Optimizer wrapper: `step()` acts only on a window's synchronising micro-step.

    `zero_grad()` never discards gradients the optimizer has not used yet, so both loop
    orders work: `backward; step; zero_grad` and `zero_grad; backward; step`. (The
    parameters' hooks say when gradients arrived, from `backend.backward(loss)` or a
    plain `loss.backward()` alike.)
    """

    def __init__(self, optimizer: Optimizer, window: GradientWindow) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(
                f"prepare() expects a torch.optim.Optimizer, got {type(optimizer).__name__}"
            )
        self.optimizer = optimizer
        self._window = window

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        if not self._window.sync_gradients:
            return None  # mid-window: keep accumulating
        self._window.optimizer_steps += 1
        self._window.grads_pending = False
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        # Clearing is safe only when no gradient is waiting for an optimizer step:
        # right after step(), or before a window's first backward (zero_grad-first loops).
        if not self._window.grads_pending:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        return self.optimizer.state

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        if name == "optimizer":  # not set yet (copy/unpickle): don't recurse
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def __repr__(self) -> str:
        return f"AccumOptimizer({self.optimizer!r})"


class AccumScheduler:
    """LR-scheduler wrapper: steps once per optimizer step (not per micro-step or rank).

    Each rank holds its own scheduler and steps it once when its optimizer steps; there
    is no multiplying by the world size (some libraries do, which shortens the schedule).
    """

    def __init__(self, scheduler: Any, window: GradientWindow) -> None:
        if not callable(getattr(scheduler, "step", None)):
            raise TypeError(
                f"prepare() expects an LR scheduler with a step() method, "
                f"got {type(scheduler).__name__}"
            )
        self.scheduler = scheduler
        self._window = window

    def step(self) -> None:
        if self._window.sync_gradients:
            self.scheduler.step()

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        if name == "scheduler":  # not set yet (copy/unpickle): don't recurse
            raise AttributeError(name)
        return getattr(self.scheduler, name)

    def __repr__(self) -> str:
        return f"AccumScheduler({self.scheduler!r})"
