"""Notebooks 01 and 02: the text says what the stored drawings and prints show (issue 22).

The oracle is the notebooks' own stored outputs (nbval checks they are what a fresh run
gives): the SVGs' fills, strokes and texts, the printed labels, and for exercise 02.4 the
model the exercise points at.
"""

from __future__ import annotations

import json
import re

import torch
from notebook_cells import cell_outputs, cell_source, next_cell, read_cells
from palette import graph_colours

from zbkit.models import TransformerBlock
from zbkit.splitgrad import analyze
from zbkit.viz.graph import output_shapes

# what I and W run in, and a split point's border, as draw_graph's legend shows them
TEAL, GREEN, SPLIT_COLOR = (graph_colours()[k] for k in ("I", "W", "split"))


def _svgs(name: str) -> list[tuple[int, str]]:
    return [
        (i, svg)
        for i, c in enumerate(read_cells(name))
        if (svg := cell_outputs(c, "image/svg+xml"))
    ]


def _markdown(name: str, upto: int) -> str:
    return "\n".join(
        cell_source(c) for c in read_cells(name)[: upto + 1] if c["cell_type"] == "markdown"
    )


def test_01_describes_the_collapsed_boxes_as_drawn_a_white_box_over_a_two_colour_bar():
    cells = read_cells("01_autograd_graph")
    i = next(
        i for i, c in enumerate(cells) if "depth=1" in cell_source(c) and c["cell_type"] == "code"
    )
    svg = cell_outputs(cells[i], "image/svg+xml")
    # HTML-label boxes: a white box whose bar cells are I's teal and W's green
    assert f'fill="{TEAL}"' in svg and f'fill="{GREEN}"' in svg and 'fill="white"' in svg
    said = cell_source(next_cell(cells, cells[i]))
    assert "two-colour bar" in said and "teal" in said and "green" in said
    assert "striped" not in _markdown("01_autograd_graph", len(cells))


def test_drawings_name_ops_as_the_prints_do():
    cells = read_cells("01_autograd_graph")
    for name in ("01_autograd_graph", "02_split_backward"):
        for _, svg in _svgs(name):
            ops = re.findall(r">(\w*Backward\w*)<", svg)
            assert all(re.fullmatch(r"\w+Backward\d*#\d+", op) for op in ops), ops
    # notebook 01 prints the MLP's reverse graph under analyze's labels, then draws the same
    # graph: each printed name is a drawn name
    printed = next(
        cell_outputs(c, "stream") for c in cells if "used by" in cell_outputs(c, "stream")
    ).splitlines()
    labels = {line.split(" -> ")[0].strip() for line in printed if " -> " in line}
    drawn_mlp = next(svg for _, svg in _svgs("01_autograd_graph") if "TBackward0#2" in svg)
    drawn = set(re.findall(r">([^<>\n]+)</text>", drawn_mlp))
    assert "TanhBackward0#1" in labels and labels <= drawn, labels - drawn


def test_counts_of_one_are_singular_in_every_output():
    for name in ("01_autograd_graph", "02_split_backward"):
        for c in read_cells(name):
            shown = json.dumps(c.get("outputs", []))
            assert not re.search(r"\b1 (split points|param groups|groups|parameters)\b", shown)
    assert any("1 split point<" in svg for _, svg in _svgs("01_autograd_graph"))


def test_red_split_borders_are_explained_at_the_first_drawing_showing_them():
    name = "01_autograd_graph"
    first = next(i for i, svg in _svgs(name) if f'stroke="{SPLIT_COLOR}"' in svg)
    cells = read_cells(name)
    said = _markdown(name, first) + cell_source(next_cell(cells, cells[first]))
    assert "red border" in said.lower() and "split point" in said


def test_outputs_outside_i_is_explained_where_it_first_appears():
    name = "01_autograd_graph"
    cells = read_cells(name)
    first = next(
        i for i, c in enumerate(cells) if "outputs outside I" in json.dumps(c.get("outputs", []))
    )
    said = _markdown(name, first)
    assert "*outputs outside I*" in said and "do not depend on the input" in said


def test_the_input_closure_is_teal_in_both_notebooks():
    # 01 draws the closure plainly (its first drawing), 02 lights what I runs: one colour
    first_01 = _svgs("01_autograd_graph")[0][1]
    what_i_runs = next(svg for _, svg in _svgs("02_split_backward") if "what I runs" in svg)
    for svg in (first_01, what_i_runs):
        assert f'fill="{TEAL}"' in svg and "#e4e4e4" not in svg
    assert "Teal ops are in the **input closure**" in _markdown("01_autograd_graph", 6)
    for name in ("01_autograd_graph", "02_split_backward"):
        assert all("#e4e4e4" not in svg for _, svg in _svgs(name))


def test_exercise_02_4_has_one_answer_for_the_model_it_names():
    cells = read_cells("02_split_backward")
    question = next(cell_source(c) for c in cells if cell_source(c).startswith("**Exercise 4.**"))
    assert "ParamGroupExplorer(block_analysis)" in question and "most numbers" in question
    # the notebook's block_analysis: TransformerBlock(dim=16, heads=2) on (2, 5, 16)
    torch.manual_seed(0)
    block = TransformerBlock(dim=16, heads=2)
    h = torch.randn(2, 5, 16, requires_grad=True)
    a = analyze(block(h), h, block)
    params = dict(block.named_parameters())
    counts = [len(g.param_names) for g in a.groups]
    assert set(counts) == {2}  # why it cannot ask for "the most parameters"
    numbers = [sum(params[n].numel() for n in g.param_names) for g in a.groups]
    best = max(numbers)
    assert (
        numbers.count(best) == 1 and a.groups[numbers.index(best)].param_names[0] == "mlp.0.weight"
    )
    # the largest captured gradient: one split point, and in the same group
    sizes = {
        (g.index, label): sum(torch.Size(s).numel() for s in output_shapes(node))
        for g in a.groups
        for label, node in zip(g.intermediates, g.group.intermediates, strict=True)
    }
    top = max(sizes.values())
    (winner,) = [k for k, v in sizes.items() if v == top]
    assert winner[0] == numbers.index(best)
