"""Shared pieces of the zbkit.parallel tests: a tiny model, its data and the oracle.

The oracle is plain single-process training that steps once per window on the mean
loss over *all* that window's micro-batches (from every rank). A correct backend, on
any number of ranks and any accumulation factor, ends with the same parameters.
"""

from __future__ import annotations

import math

import torch
from torch import nn

IN, HIDDEN, OUT = 3, 5, 2  # model sizes
BATCH = 4  # samples per micro-batch


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT))


def make_data(world: int, batches: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [world, batches * BATCH, IN], y: [world, batches * BATCH, OUT]; row r is rank r's."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(world, batches * BATCH, IN, generator=g)
    y = torch.randn(world, batches * BATCH, OUT, generator=g)
    return x, y


def loss_fn(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(pred, target)


def make_optimizer(name: str, params) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)
    raise ValueError(name)


def make_scheduler(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    # LR halves every optimizer step: a scheduler stepped per micro-step or per rank
    # would make the parameters differ from the oracle's.
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)


def num_windows(batches: int, k: int, epochs: int) -> int:
    return epochs * math.ceil(batches / k)


def reference_train(
    x: torch.Tensor, y: torch.Tensor, k: int, epochs: int, opt_name: str
) -> tuple[nn.Module, int]:
    """Oracle: one process; per window, mean loss over its micro-batches from all ranks."""
    model = make_model()
    opt = make_optimizer(opt_name, model.parameters())
    sched = make_scheduler(opt)
    world, samples = x.shape[0], x.shape[1]
    batches = samples // BATCH
    steps = 0
    for _ in range(epochs):
        for start in range(0, batches, k):
            window = range(start, min(start + k, batches))  # shorter at the epoch's end
            losses = [
                loss_fn(model(x[r, b * BATCH : (b + 1) * BATCH]), y[r, b * BATCH : (b + 1) * BATCH])
                for r in range(world)
                for b in window
            ]
            opt.zero_grad()
            torch.stack(losses).mean().backward()
            opt.step()
            sched.step()
            steps += 1
    return model, steps


def full_params(model: nn.Module) -> list[torch.Tensor]:
    """Parameters as plain tensors (FSDP's DTensor shards are gathered in full)."""
    return [
        p.full_tensor().detach() if hasattr(p, "full_tensor") else p.detach()
        for p in model.parameters()
    ]


def params_match(a: nn.Module, b: nn.Module, rtol: float = 1e-5, atol: float = 1e-7) -> bool:
    return all(
        torch.allclose(p, q, rtol=rtol, atol=atol)
        for p, q in zip(full_params(a), full_params(b), strict=True)
    )


def backend_train(
    backend,
    loader,
    epochs: int,
    opt_name: str,
    zero_first: bool = False,
    probe=None,
    plain_backward: bool = False,
):
    """The training loop of zbkit.parallel's docstring, run through `backend`.

    Returns (model, optimizer, scheduler).

    `zero_first` puts zero_grad() before backward (the other common loop order);
    `probe(backend, model)` runs after each micro-step's backward;
    `plain_backward` calls `loss.backward()` where the docstring says `backend.backward(loss)`.
    """
    model = make_model()
    opt = make_optimizer(opt_name, model.parameters())
    sched = make_scheduler(opt)
    model, opt, loader, sched = backend.prepare(model, opt, loader, sched)
    for _ in range(epochs):
        for x, y in loader:
            with backend.accumulate(model):
                if zero_first:
                    opt.zero_grad()
                loss = loss_fn(model(x), y)
                if plain_backward:
                    loss.backward()
                else:
                    backend.backward(loss)
                if probe is not None:
                    probe(backend, model)
                opt.step()
                sched.step()
                if not zero_first:
                    opt.zero_grad()
    return backend.unwrap_model(model), opt, sched
