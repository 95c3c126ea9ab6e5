"""Readers of the stored notebooks (notebooks/*.ipynb) for the tests that check what they say.

A cell is nbformat's dict: its `source` and a stream output's `text` are a string or a list of
lines, so every reader joins them. Imported as `from notebook_cells import ...`: tests/ is on
`sys.path` through tests/conftest.py (pytest's default import mode).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
# every numbered notebook's name, in course order, the appendix included
BOOKS = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def read_notebook(name: str) -> dict:
    """The whole notebook `notebooks/<name>.ipynb` (its cells, metadata, widget state)."""
    return json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())


def read_cells(name: str) -> list[dict]:
    return read_notebook(name)["cells"]


def cell_source(cell: dict) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def cell_outputs(cell: dict, mime: str) -> str:
    """Every stored output of `mime` ("stream" for printed text) of a cell, joined."""
    parts = []
    for out in cell.get("outputs", []):  # a markdown cell has none
        if mime == "stream" and out.get("output_type") == "stream":
            parts.append("".join(out["text"]))
        elif mime in out.get("data", {}):
            data = out["data"][mime]
            parts.append(data if isinstance(data, str) else "".join(data))
    return "".join(parts)


def cell_python(cell: dict) -> str:
    """A code cell's source as Python that `ast.parse` reads: the body of a cell magic such
    as ``%%solution`` (which runs its body as Python), line magics as IPython rewrites them."""
    from IPython.core.inputtransformer2 import TransformerManager  # IPython's own rewrite

    source = cell_source(cell)
    if source.startswith("%%solution"):
        source = source.split("\n", 1)[1]
    return TransformerManager().transform_cell(source)


def cell_stdout(cell: dict) -> str:
    """What a code cell printed, as stored."""
    return cell_outputs(cell, "stream")


def cell_index(cells: list[dict], holding: str) -> int:
    """The index of the one cell whose source holds `holding`."""
    found = [i for i, c in enumerate(cells) if holding in cell_source(c)]
    assert len(found) == 1, f"{len(found)} cells hold {holding!r}"
    return found[0]


def find_cell(cells: list[dict], holding: str) -> dict:
    """The one cell whose source holds `holding`."""
    return cells[cell_index(cells, holding)]


def cell_by_id(cells: list[dict], cell_id: str) -> dict:
    found = [c for c in cells if c.get("id") == cell_id]
    assert found, f"no cell has the id {cell_id!r}"
    return found[0]


def next_cell(cells: list[dict], cell: dict, kind: str = "markdown") -> dict:
    """The first cell of `kind` after `cell`: for "markdown", the text read under an output."""
    i = next(i for i, c in enumerate(cells) if c is cell)
    return next(c for c in cells[i + 1 :] if c["cell_type"] == kind)


def prose_numerals(cells: list[dict]) -> dict[str, list[str]]:
    """Every numeral the markdown cells state outside `code`, tables and headings, by cell id
    (cells without one left out): what a test accounts for, one by one."""
    found = {}
    for cell in cells:
        if cell["cell_type"] != "markdown":
            continue
        text = re.sub(r"`[^`]*`", "", cell_source(cell))
        kept = [ln for ln in text.splitlines() if not ln.startswith(("|", "#"))]
        numerals = re.findall(r"(?<![\w.])\d+(?:\.\d+)?%?", "\n".join(kept))
        if numerals:
            found[cell["id"]] = numerals
    return found
