"""Backends by name: `create_backend("ddp", grad_accum_steps=4)`.

A small registry instead of an if/elif chain, so a notebook can register its own
backend. Strict on purpose: a name registered twice, an unknown name and an unknown
option are errors (a silently dropped `grad_acum_steps=4` would train with k = 1).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from zbkit.parallel.backends import TrainingBackend


class BackendFactory:
    """Registry of training backends: name -> backend class."""

    _registry: ClassVar[dict[str, type[TrainingBackend]]] = {}
    # Built-in backends whose module is imported on first use: torch's FSDP alone takes
    # about a second to import, which every `import zbkit.parallel` would otherwise pay.
    _lazy: ClassVar[dict[str, str]] = {"fsdp": "zbkit.parallel.fsdp"}

    @classmethod
    def register(cls, name: str) -> Callable[[type[TrainingBackend]], type[TrainingBackend]]:
        """Class decorator: `@BackendFactory.register("mine")`."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a backend name must be a non-empty string, got {name!r}")

        def decorator(backend_cls: type[TrainingBackend]) -> type[TrainingBackend]:
            owner = cls._registry[name].__qualname__ if name in cls._registry else None
            if owner is None and cls._lazy.get(name, backend_cls.__module__) != (
                backend_cls.__module__
            ):
                owner = cls._lazy[name]  # a built-in, not imported yet
            if owner is not None:
                raise ValueError(
                    f"backend {name!r} is already registered (by {owner}); pick another "
                    f"name or call BackendFactory.unregister({name!r}) first"
                )
            cls._registry[name] = backend_cls
            return backend_cls

        return decorator

    @classmethod
    def unregister(cls, name: str) -> None:
        if name not in cls._registry and name not in cls._lazy:
            raise KeyError(f"backend {name!r} is not registered; known: {cls.names()}")
        cls._registry.pop(name, None)
        cls._lazy.pop(name, None)

    @classmethod
    def names(cls) -> list[str]:
        return sorted(set(cls._registry) | set(cls._lazy))

    @classmethod
    def create(cls, name: str, **options: Any) -> TrainingBackend:
        if name not in cls._registry and name in cls._lazy:
            importlib.import_module(cls._lazy[name])  # registers it
        if name not in cls._registry:
            raise ValueError(f"unknown backend {name!r}; known backends: {', '.join(cls.names())}")
        backend_cls = cls._registry[name]
        backend_cls.check_options(options)
        return backend_cls(**options)


def create_backend(name: str, **options: Any) -> TrainingBackend:
    """Build a registered backend: `create_backend("ddp", grad_accum_steps=4)`."""
    return BackendFactory.create(name, **options)
