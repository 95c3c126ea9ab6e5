"""`dir()` of a zbkit package: what a user can reach, not what the package imported.

Each package's ``__dir__`` returns ``public_dir(globals(), __all__)``: its ``__all__`` and the
submodules already loaded (``zbkit.schedules.formulas`` once imported), so ``dir()`` and tab
completion list no ``Any``, ``TYPE_CHECKING`` or ``importlib``.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any


def public_dir(namespace: dict[str, Any], names: list[str]) -> list[str]:
    package = namespace["__name__"]
    submodules = [
        name
        for name, value in namespace.items()
        if isinstance(value, ModuleType)
        and value.__name__ == f"{package}.{name}"
        and not name.startswith("_")
    ]
    return sorted({*names, *submodules})
