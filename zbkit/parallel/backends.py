"""Training backends: one loop, run on one process ("single") or data-parallel ("ddp";
"fsdp" lives in fsdp.py).

    backend = create_backend("ddp", grad_accum_steps=4)
    model, optimizer, loader, scheduler = backend.prepare(model, optimizer, loader, scheduler)
    for batch in loader:
        with backend.accumulate(model):          # no_sync() unless this micro-step syncs
            backend.backward(loss_fn(model(batch)))   # loss / (length of this window)
            optimizer.step(); scheduler.step(); optimizer.zero_grad()  # only when syncing

After each window every rank holds the gradient of the mean loss over the window's
micro-batches from all ranks, which is what one process would get on all that data.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim import Optimizer
from torch.utils.hooks import RemovableHandle

from zbkit.parallel._comm_stats import CommStats, counting_allreduce_hook
from zbkit.parallel._placement import place_replica
from zbkit.parallel.accumulate import (
    AccumOptimizer,
    AccumScheduler,
    AccumulatingLoader,
    GradientWindow,
)
from zbkit.parallel.process_group import get_world_size, require_process_group


class TrainingBackend:
    """Shared logic: accumulation windows, loss scaling, optimizer/scheduler wrappers."""

    name: ClassVar[str] = "base"

    def __init__(self, grad_accum_steps: int = 1) -> None:
        if isinstance(grad_accum_steps, bool) or not isinstance(grad_accum_steps, int):
            raise TypeError(
                f"grad_accum_steps must be an int (micro-batches per optimizer step), "
                f"got {type(grad_accum_steps).__name__} {grad_accum_steps!r}"
            )
        if grad_accum_steps < 1:
            raise ValueError(
                f"grad_accum_steps must be >= 1 (1 = step after every batch), "
                f"got {grad_accum_steps}"
            )
        self._window = GradientWindow(grad_accum_steps)
        self._device = torch.device("cpu")
        self._hooks: dict[int, RemovableHandle] = {}  # id(parameter) -> its window hook

    @classmethod
    def options(cls) -> list[str]:
        """Keyword options `create_backend(name, ...)` accepts for this backend."""
        params = inspect.signature(cls.__init__).parameters.values()
        named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        return sorted(p.name for p in params if p.name != "self" and p.kind in named)

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        """Raise TypeError naming any option this backend does not accept."""
        unknown = sorted(set(options) - set(cls.options()))
        if unknown:
            raise TypeError(
                f"backend {cls.name!r} got unknown option(s) {', '.join(unknown)}; "
                f"it accepts: {', '.join(cls.options())}"
            )

    # --- state a training loop reads -------------------------------------------------
    @property
    def grad_accum_steps(self) -> int:
        return self._window.steps

    @property
    def sync_gradients(self) -> bool:
        """True on the micro-step that ends a window: gradients are all-reduced, we step."""
        return self._window.sync_gradients

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps taken through the prepared optimizer."""
        return self._window.optimizer_steps

    @property
    def window_length(self) -> int:
        """Micro-batches in the current window (k, or fewer for an epoch's last window)."""
        return self._window.length

    @property
    def world_size(self) -> int:
        return get_world_size()

    @property
    def device(self) -> torch.device:
        """Where the prepared model lives: move each batch there (`x.to(backend.device)`)."""
        return self._device

    # --- setup ---------------------------------------------------------------------------
    def prepare(
        self,
        model: nn.Module,
        optimizer: Optimizer | None = None,
        dataloader: Iterable[Any] | None = None,
        scheduler: Any | None = None,
    ) -> tuple[nn.Module, Any, Any, Any]:
        """Wrap the pieces; returns (model, optimizer, dataloader, scheduler) in that order.

        Arguments left as None come back as None. Build the optimizer and scheduler on
        the plain model before calling this (DDP and our wrappers keep the same
        parameters, so they stay valid). Calling prepare again starts counting afresh.
        """
        if not isinstance(model, nn.Module):
            raise TypeError(f"prepare() expects an nn.Module as model, got {type(model).__name__}")
        if isinstance(model, DDP):
            raise TypeError(
                "prepare() got a model already wrapped in DistributedDataParallel; "
                "pass the plain module and let the backend wrap it"
            )
        self._window.reset()
        model = self._prepare_model(model)
        for handle in self._hooks.values():  # a fresh prepare: the old model's hooks go
            handle.remove()
        self._hooks.clear()
        self._hook_parameters(model)
        first = next(model.parameters(), None)
        self._device = first.device if first is not None else torch.device("cpu")
        wrapped = AccumOptimizer(optimizer, self._window) if optimizer is not None else None
        if dataloader is not None:
            if not hasattr(dataloader, "__iter__"):
                raise TypeError(
                    f"prepare() expects an iterable dataloader, got {type(dataloader).__name__}"
                )
            dataloader = AccumulatingLoader(dataloader, self._window)
        if scheduler is not None:
            scheduler = AccumScheduler(scheduler, self._window)
        return model, wrapped, dataloader, scheduler

    def _prepare_model(self, model: nn.Module) -> nn.Module:
        return model

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """The plain module inside whatever `prepare` wrapped it in."""
        return model

    def _hook_parameters(self, model: nn.Module) -> None:
        # Every gradient bound for a parameter passes the window first (counted, and
        # divided when it comes from a plain loss.backward()); parameters unfrozen after
        # prepare are hooked when the next micro-step begins.
        for p in model.parameters():
            if p.requires_grad and id(p) not in self._hooks:
                self._hooks[id(p)] = p.register_hook(self._window.parameter_grad)

    # --- one micro-step ------------------------------------------------------------------
    @contextlib.contextmanager
    def accumulate(self, model: nn.Module) -> Iterator[None]:
        """Context for one micro-step (forward and backward both go inside).

        Sets `sync_gradients`; on micro-steps that don't end their window it turns off
        gradient synchronisation (DDP's `no_sync`) so only the last one communicates.
        """
        if self._window.in_micro_step:
            raise RuntimeError("backend.accumulate() is already active; do not nest it")
        self._check_model(model)
        self._hook_parameters(model)
        self._window.begin_micro_step()
        try:
            if self._window.sync_gradients:
                yield
            else:
                with self._no_sync(model):
                    yield
        finally:
            self._window.end_micro_step()

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """`(loss / window length).backward()`: the window's gradients add up to a mean.

        A plain `loss.backward()` inside the context gives the same gradients (the
        parameters' hooks divide them); this one also divides loss terms that reach
        tensors other than the prepared model's parameters.
        """
        if not self._window.in_micro_step:
            raise RuntimeError(
                "backend.backward() must run inside `with backend.accumulate(model):` so it "
                "knows the window it belongs to (and DDP knows whether to synchronise)"
            )
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"backend.backward() expects a loss tensor, got {type(loss).__name__}")
        if loss.numel() != 1:
            raise ValueError(
                f"backend.backward() expects a scalar loss, got shape {tuple(loss.shape)}: "
                f"reduce it first (e.g. loss.mean())"
            )
        self._window.grads_pending = True  # even if no prepared parameter gets a gradient
        self._window.loss_divided = True  # the parameters' hooks must not divide again
        try:
            (loss / self._window.length).backward(**kwargs)
        finally:
            self._window.loss_divided = False

    def _check_model(self, model: nn.Module) -> None:
        pass

    def _no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(grad_accum_steps={self.grad_accum_steps})"


class SingleBackend(TrainingBackend):
    """One process, no communication; accumulation only."""

    name = "single"


_DDP_CHOSEN_BY_BACKEND = ("module", "device_ids", "output_device")


class DDPBackend(TrainingBackend):
    """DistributedDataParallel: each rank holds a replica; gradients are averaged.

    `ddp_options` go to `DistributedDataParallel` (e.g. `bucket_cap_mb`,
    `find_unused_parameters`); `device_ids` come from LOCAL_RANK. `comm_stats` counts
    the gradient all-reduces and bytes this rank has issued since `prepare`.
    """

    name = "ddp"

    def __init__(self, grad_accum_steps: int = 1, **ddp_options: Any) -> None:
        super().__init__(grad_accum_steps)
        self.check_options(ddp_options)
        self._ddp_options = ddp_options
        self.comm_stats = CommStats(process_group=ddp_options.get("process_group"))

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        chosen = sorted(set(options) & set(_DDP_CHOSEN_BY_BACKEND))
        if chosen:
            raise TypeError(
                f"the ddp backend sets {', '.join(chosen)} itself (the device comes from "
                f"LOCAL_RANK); remove {', '.join(chosen)} from the options"
            )
        super().check_options(options)

    @classmethod
    def options(cls) -> list[str]:
        ddp_params = inspect.signature(DDP.__init__).parameters
        extra = [n for n in ddp_params if n != "self" and n not in _DDP_CHOSEN_BY_BACKEND]
        return sorted(["grad_accum_steps", *extra])

    def _prepare_model(self, model: nn.Module) -> nn.Module:
        require_process_group("the ddp backend", alone="create_backend('single')")
        device = place_replica(model, self._ddp_options.get("process_group"))
        if device is None:  # CPU replica: gloo, and no device_ids at all
            ddp = DDP(model, **self._ddp_options)
        else:  # one GPU per process: cuda:LOCAL_RANK
            ddp = DDP(
                model,
                device_ids=[device.index],
                output_device=device.index,
                **self._ddp_options,
            )
        self.comm_stats.reset()
        ddp.register_comm_hook(self.comm_stats, counting_allreduce_hook)
        return ddp

    def _check_model(self, model: nn.Module) -> None:
        if not isinstance(model, DDP):
            raise TypeError(
                f"backend.accumulate() needs the model returned by backend.prepare() (a "
                f"DistributedDataParallel), got {type(model).__name__}: without it gradients "
                f"would not be synchronised"
            )

    def _no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        # Skip the all-reduce on this micro-step; gradients pile up locally in .grad and
        # the window's last backward all-reduces the sum (nanoGPT's
        # `require_backward_grad_sync` trick, through DDP's public no_sync()).
        assert isinstance(model, DDP)
        return model.no_sync()

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DDP) else model
