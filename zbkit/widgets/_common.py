"""Small helpers the widgets share."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any

import torch


def as_tensors(x: Any, what: str) -> list[torch.Tensor]:
    """A tensor or an iterable of tensors -> list, with an error naming `what` otherwise."""
    items = [x] if isinstance(x, torch.Tensor) else list(x) if isinstance(x, Iterable) else [x]
    for i, t in enumerate(items):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what}[{i}] is {type(t).__name__}; expected a torch.Tensor")
    return items


def table_html(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A plain HTML table (escaped), small enough to sit beside a graph."""
    head = "".join(
        f"<th style='text-align:left;padding:0 8px'>{html.escape(h)}</th>" for h in header
    )
    body = "".join(
        "<tr>"
        + "".join(f"<td style='padding:0 8px'>{html.escape(str(c))}</td>" for c in row)
        + "</tr>"
        for row in rows
    )
    return f"<table class='zb-table'><tr>{head}</tr>{body}</table>"


class Offline:
    """Mixin for the widgets: what a notebook shows before its kernel runs.

    A stored widget output is a model id that means nothing until the kernel has run the cell
    (and an untrusted notebook never renders it), so JupyterLab falls back to the other
    entries of the bundle: one line saying what the widget is and to run the cell, and, for
    widgets that draw with matplotlib, the last picture as a PNG. Mixed in before the
    ipywidgets class: `class ScheduleExplorer(Offline, w.VBox)`.
    """

    def _offline_what(self) -> str:  # e.g. "zb-h1, pp=4, m=8"
        return ""

    def _offline_png(self) -> bytes | None:
        return None

    def __repr__(self) -> str:  # cheap, one line
        what = self._offline_what()
        what = f" ({what})" if what else ""
        return f"{type(self).__name__}{what}: run this cell to get the live widget"

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = super()._repr_mimebundle_(**kwargs)  # type: ignore[misc]
        bundle["text/plain"] = repr(self)
        png = self._offline_png()
        if png is not None:
            bundle["image/png"] = png
        return bundle
