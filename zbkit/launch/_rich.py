"""Values that come back from a rank as something to *display* rather than to use.

A rank's last-expression value or return value travels back pickled. A matplotlib Figure
does not (it would be rebuilt inside the kernel and re-registered with pyplot): the rank
sends its PNG as a ``RichResult``, which renders in a notebook as the figure did on the rank.

A value that cannot be pickled (an open file, a lock, a generator) is an error naming its
type: ``launch`` and ``Cluster.run`` return values to compute with, and a display in their
place would be a silent wrong result. Only when asked (``Cluster.exec(..., display=True)``,
which ``%%zb`` uses to show a cell's value) does it come back as its display: a mimebundle
built on the rank from the object's own ``_repr_*_`` methods, always with ``text/plain``.
"""

from __future__ import annotations

import base64
import io
from typing import Any

# mime type -> the IPython display method that produces it
_REPR_METHODS = {
    "text/html": "_repr_html_",
    "text/markdown": "_repr_markdown_",
    "text/latex": "_repr_latex_",
    "image/svg+xml": "_repr_svg_",
    "image/png": "_repr_png_",
    "image/jpeg": "_repr_jpeg_",
    "application/json": "_repr_json_",
}


class RichResult:
    """A displayable stand-in for a rank's value: ``display(r)`` renders its mimebundle."""

    def __init__(self, bundle: dict[str, Any], note: str = "") -> None:
        self.bundle = bundle  # mime type -> data (images base64 text, as Jupyter expects)
        self.note = note  # why the object itself did not come back

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return dict(self.bundle)

    def __repr__(self) -> str:
        return str(self.bundle.get("text/plain", "<RichResult>"))


def is_figure(obj: Any) -> bool:
    return type(obj).__module__.startswith("matplotlib.") and hasattr(obj, "savefig")


def _b64(data: Any) -> Any:
    return base64.b64encode(data).decode("ascii") if isinstance(data, bytes) else data


def mimebundle(obj: Any) -> dict[str, Any]:
    """The object's Jupyter representations, computed here (on the rank), text/plain last."""
    bundle: dict[str, Any] = {}
    if is_figure(obj):
        buf = io.BytesIO()
        obj.savefig(buf, format="png", bbox_inches="tight")
        bundle["image/png"] = _b64(buf.getvalue())
    elif hasattr(obj, "_repr_mimebundle_"):
        got = obj._repr_mimebundle_()
        data = got[0] if isinstance(got, tuple) else got  # (data, metadata) is allowed too
        bundle.update({k: _b64(v) for k, v in (data or {}).items()})
    for mime, method in _REPR_METHODS.items():
        if mime not in bundle and callable(getattr(obj, method, None)):
            try:
                value = getattr(obj, method)()
            except Exception:  # a broken _repr_ must not lose the result
                continue
            if value is not None:
                bundle[mime] = _b64(value)
    bundle.setdefault("text/plain", repr(obj))
    return bundle


def type_name(value: Any) -> str:
    cls = type(value)
    name = cls.__qualname__
    return name if cls.__module__ == "builtins" else f"{cls.__module__}.{name}"


def to_payload(value: Any, dumps: Any, display: bool = False) -> bytes:
    """Pickle a rank's value for the trip back (a Figure as its PNG).

    A value that cannot be pickled raises TypeError naming its type, or with `display`
    comes back as a RichResult of its display.
    """
    if is_figure(value):
        return dumps(RichResult(mimebundle(value), "a matplotlib Figure comes back as its PNG"))
    try:
        return dumps(value)
    except Exception as exc:
        if not display:
            raise TypeError(
                f"the result is a {type_name(value)}, which cannot be pickled to travel back "
                f"to the caller ({type(exc).__name__}: {exc}); return plain data (numbers, "
                "strings, lists, dicts, tensors) made from it"
            ) from exc
        note = f"{type_name(value)} could not be pickled ({exc}); this is its display"
        return dumps(RichResult(mimebundle(value), note))
