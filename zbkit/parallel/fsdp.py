"""FSDP2 backend: `fully_shard` each child module, accumulate with gradient sync off.

Where DDP keeps a full replica per rank and all-reduces gradients, FSDP keeps 1/world of
every parameter (dim-0 shards, padded) and, per sharded module:

    forward:  all-gather the shards -> full weights -> compute -> free the full weights
    backward: all-gather again -> gradients -> reduce-scatter -> each rank its shard's mean

Accumulation: `set_requires_gradient_sync(False)` on the micro-steps that don't end a
window keeps full, unreduced gradients locally; the window's last backward reduce-scatters
their sum once. Parameters become DTensors; `p.full_tensor()` gathers one back.

Backward runs on gathered copies of the parameters, not on the sharded ones `prepare`
hooks, so a plain `loss.backward()` cannot be divided by the window's length here: with
grad_accum_steps > 1 it is caught where its gradient leaves the model's output, and
refused (use `backend.backward(loss)`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.optim import Optimizer

from zbkit.parallel._comm_stats import CommStats, count_reduce_scatter
from zbkit.parallel._placement import place_replica
from zbkit.parallel.backends import TrainingBackend
from zbkit.parallel.process_group import require_process_group


def _tensors(output: Any) -> Iterator[torch.Tensor]:
    """The tensors in a forward's output (a tensor, or tuples, lists and dicts of them)."""
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, (tuple, list)):
        for item in output:
            yield from _tensors(item)
    elif isinstance(output, dict):
        for item in output.values():
            yield from _tensors(item)


class FSDPBackend(TrainingBackend):
    """Fully sharded data parallel (FSDP2) with the same loop as "ddp".

    `shard_children`: also shard each direct child that holds parameters (so only one
    child's full weights exist at a time), not just the root. `reshard_after_forward`:
    free the gathered weights after forward (less memory, one more all-gather in
    backward). `comm_stats` counts the gradient reduce-scatters and their payload.
    """

    name = "fsdp"

    def __init__(
        self,
        grad_accum_steps: int = 1,
        *,
        shard_children: bool = True,
        reshard_after_forward: bool = True,
    ) -> None:
        super().__init__(grad_accum_steps)
        self.shard_children = shard_children
        self.reshard_after_forward = reshard_after_forward
        self.comm_stats = CommStats(op="reduce_scatter")

    def prepare(
        self,
        model: nn.Module,
        optimizer: Optimizer | None = None,
        dataloader: Iterable[Any] | None = None,
        scheduler: Any | None = None,
    ) -> tuple[nn.Module, Any, Any, Any]:
        """As `TrainingBackend.prepare`; the optimizer is pointed at the sharded parameters.

        fully_shard replaces each parameter by a new (DTensor) one, so an optimizer built
        on the plain model would update tensors the model no longer uses: we swap them in
        its param_groups, matched by parameter name.
        """
        if isinstance(optimizer, Optimizer) and optimizer.state:
            raise ValueError(
                "the optimizer already has state (it has stepped); prepare() must come "
                "before the first optimizer step so its state is built on the shards"
            )
        name_of = {id(p): n for n, p in model.named_parameters()}
        prepared = super().prepare(model, optimizer, dataloader, scheduler)
        if optimizer is not None:
            sharded = dict(prepared[0].named_parameters())
            for group in optimizer.param_groups:
                group["params"] = [sharded.get(name_of.get(id(p), ""), p) for p in group["params"]]
        return prepared

    def _prepare_model(self, model: nn.Module) -> nn.Module:
        require_process_group("the fsdp backend", alone="create_backend('single')")
        if isinstance(model, FSDPModule):
            raise TypeError(
                "prepare() got a model already sharded with fully_shard; pass the plain module"
            )
        device = place_replica(model, None)
        mesh = init_device_mesh("cpu" if device is None else "cuda", (dist.get_world_size(),))
        shard = partial(fully_shard, mesh=mesh, reshard_after_forward=self.reshard_after_forward)
        if self.shard_children:
            for child in model.children():
                if any(True for _ in child.parameters()):
                    shard(child)
        shard(model)  # the root: its own parameters, and it drives the children's comms
        self.comm_stats.reset()
        hook = partial(count_reduce_scatter, self.comm_stats, dist.get_world_size())
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_all_reduce_hook(hook)
        model.register_forward_hook(self._watch_output)
        return model

    def _watch_output(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._window.steps == 1:
            return  # a window of one: a plain loss.backward() is already the mean
        for t in _tensors(output):
            if t.requires_grad:
                t.register_hook(self._refuse_plain_backward)

    def _refuse_plain_backward(self, grad: torch.Tensor) -> None:
        window = self._window
        if not window.in_micro_step:
            raise RuntimeError(window.outside_message())
        if not window.loss_divided:
            raise RuntimeError(
                f"loss.backward() inside backend.accumulate() with the fsdp backend and "
                f"grad_accum_steps={window.steps}: FSDP computes gradients on gathered copies "
                f"of the parameters, so they cannot be divided by the window's length here; "
                f"call backend.backward(loss) instead"
            )

    def _check_model(self, model: nn.Module) -> None:
        if not isinstance(model, FSDPModule):
            raise TypeError(
                f"backend.accumulate() needs the model returned by backend.prepare() (sharded "
                f"with fully_shard), got {type(model).__name__}"
            )

    @contextlib.contextmanager
    def _no_sync(self, model: nn.Module) -> Iterator[None]:
        # FSDP's no_sync: keep full local gradients, skip the reduce-scatter this micro-step.
        assert isinstance(model, FSDPModule)
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
