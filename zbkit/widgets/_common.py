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
