"""Backends by name: `create_backend("ddp", grad_accum_steps=4)`.

The registry is a plain dict, `BACKENDS`: name -> backend class. A notebook adds its own
with `BACKENDS["mine"] = MyBackend`. `create_backend` is strict on purpose: an unknown
name and an unknown option are errors (a silently dropped `grad_acum_steps=4` would
train with k = 1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zbkit.parallel.backends import DDPBackend, SingleBackend, TrainingBackend

__all__ = ["BACKENDS", "create_backend"]


def _fsdp() -> type[TrainingBackend]:
    # lazily: torch's FSDP takes about a second to import (see BACKENDS)
    from zbkit.parallel.fsdp import FSDPBackend

    return FSDPBackend


# An entry is a backend class, or a function returning one: torch's FSDP alone takes about
# a second to import, which every `import zbkit.parallel` would otherwise pay, so "fsdp"
# imports its module only when it is asked for.
BACKENDS: dict[str, type[TrainingBackend] | Callable[[], type[TrainingBackend]]] = {
    "ddp": DDPBackend,
    "fsdp": _fsdp,
    "single": SingleBackend,
}


def create_backend(name: str, **options: Any) -> TrainingBackend:
    """Build a backend from `BACKENDS`: `create_backend("ddp", grad_accum_steps=4)`.

    `options` go to the backend's class and are checked first: an unknown name or option
    is an error, never silently dropped. The backend then wraps a plain training loop::

        backend = create_backend("ddp", grad_accum_steps=4)
        model, optimizer, loader, scheduler = backend.prepare(model, optimizer, loader, scheduler)
        for batch in loader:
            with backend.accumulate(model):  # no_sync() unless this micro-step ends a window
                backend.backward(loss_fn(model(batch)))
                optimizer.step(); scheduler.step(); optimizer.zero_grad()  # only at a window's end
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; known backends: {', '.join(sorted(BACKENDS))}")
    entry = BACKENDS[name]
    backend_cls: type[TrainingBackend] = entry if isinstance(entry, type) else entry()
    backend_cls.check_options(options)
    return backend_cls(**options)
