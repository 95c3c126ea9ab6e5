"""How zbkit's data shows itself in a notebook, without the data importing the drawings.

The data classes (`Schedule`, `Simulation`, `Trace`, `SplitGradAnalysis`) live below `viz` and
must not import it. Their `_repr_html_` / `to_dot` ask `show(self, "html")`; `zbkit.viz`
implements the protocol by registering one renderer per (class name, form) when it is
imported, and the first display imports it. A class without a renderer shows its text form.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

_RENDERERS: dict[tuple[str, str], Callable[[Any], Any]] = {}


def renders(class_name: str, form: str = "html") -> Callable[[Callable], Callable]:
    """Register the decorated function as the way `class_name` objects show as `form`."""

    def register(fn: Callable) -> Callable:
        _RENDERERS[class_name, form] = fn
        return fn

    return register


def show(obj: Any, form: str = "html") -> Any:
    """`obj` in `form` ("html": a string; "dot": a graphviz.Digraph), by its class's renderer."""
    if not _RENDERERS:
        importlib.import_module("zbkit.viz")  # viz registers its renderers when imported
    for klass in type(obj).__mro__:
        fn = _RENDERERS.get((klass.__name__, form))
        if fn is not None:
            return fn(obj)
    raise LookupError(f"zbkit.viz has no {form!r} form for {type(obj).__name__}")
