"""Which modules are public, and their public names: what the docs site and `dir()` show."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import zbkit

REPO = Path(__file__).resolve().parents[2]
# modules that are commands (`zbkit ...`, `python -m zbkit.debug_demo`), documented by --help
COMMANDS = {"zbkit.cli", "zbkit.demo", "zbkit.debug_demo"}


def public_modules() -> list[str]:
    """zbkit, its packages and top-level modules (not `_private`, not commands), and the
    modules the API index lists (public submodules the tutorials import)."""
    found = {"zbkit"}
    for info in pkgutil.iter_modules(zbkit.__path__, "zbkit."):
        if not info.name.rsplit(".", 1)[1].startswith("_") and info.name not in COMMANDS:
            found.add(info.name)
    index = (REPO / "docs" / "api" / "index.md").read_text()
    found |= set(re.findall(r"^(zbkit(?:\.\w+)+)$", index, re.M))
    return sorted(found)


def public_names(module: str) -> list[str]:
    """`__all__`, or without one the functions and classes the module defines."""
    mod = importlib.import_module(module)
    if hasattr(mod, "__all__"):
        return list(mod.__all__)
    return [
        name
        for name, value in vars(mod).items()
        if not name.startswith("_")
        and (inspect.isfunction(value) or inspect.isclass(value))
        and value.__module__ == module
    ]
