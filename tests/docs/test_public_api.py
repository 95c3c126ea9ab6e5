"""`dir()` of every public package lists what a user can reach: its `__all__` (each name
resolving) and its loaded submodules, never the package's own imports (`Any`, `importlib`)."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import pytest

import zbkit

PACKAGES = ["zbkit"] + [
    info.name
    for info in pkgutil.iter_modules(zbkit.__path__, "zbkit.")
    if info.ispkg and not info.name.rsplit(".", 1)[1].startswith("_")
]


def test_the_packages_are_found() -> None:
    assert {"zbkit.schedules", "zbkit.viz", "zbkit.widgets", "zbkit.parallel"} <= set(PACKAGES)


@pytest.mark.parametrize("name", PACKAGES)
def test_dir_lists_the_public_names_only(name: str) -> None:
    package = importlib.import_module(name)
    listed = dir(package)
    assert not {"Any", "TYPE_CHECKING", "importlib", "annotations"} & set(listed), listed
    assert set(package.__all__) <= set(listed)
    extra = [
        n
        for n in listed
        if n not in package.__all__
        and n != "__version__"
        and not (isinstance(getattr(package, n), ModuleType) and not n.startswith("_"))
    ]
    assert not extra, f"dir({name}) lists names outside __all__: {extra}"


@pytest.mark.parametrize("name", PACKAGES)
def test_every_name_in_all_resolves(name: str) -> None:
    package = importlib.import_module(name)
    for public in package.__all__:
        assert getattr(package, public) is not None, f"{name}.{public}"
