"""The palette as a learner sees it: each colour read from a drawing's own legend.

The drawing tests compare what is drawn (a node's fill, a box's face, a grid cell's background)
with what the legend beside it says that colour means, never with the palette module's
constants: boxes that disagree with their legend are what would mislead a reader. That the
graph's, the plot's and the grid's colours are one palette is tested in test_viz_schedule.py.
"""

from __future__ import annotations

import re
from functools import cache

import torch
from torch import nn

from zbkit.splitgrad import analyze
from zbkit.viz import draw_graph


def legend_entry(source: str, name: str) -> str:
    """The attribute list of the entry `name` (`legend_i`, `legend_split`, ...) of the legend
    in a `draw_graph` source."""
    found = re.search(rf"^\s+{name} \[(.*?)\]$", source, flags=re.M | re.S)
    assert found, f"no {name} in the drawing's legend"
    return found.group(1)


def attr(attrs: str, key: str) -> str:
    """One attribute's value (`fillcolor`, `color`) in a dot attribute list."""
    found = re.search(rf'\b{key}="?([^"\s\]]+)', attrs)
    assert found, f"no {key} in {attrs!r}"
    return found.group(1)


@cache
def graph_colours() -> dict[str, str]:
    """'F', 'I', 'W' (what runs in each pass), 'split' (a split point's border) and 'dim' (a
    node outside the lit pass) -> the colour `draw_graph`'s legend shows for it."""
    with torch.random.fork_rng(devices=[]):  # the caller's random stream stays as it was
        mlp = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    x = torch.ones(2, 3, requires_grad=True)  # (batch, features)
    a = analyze(mlp(x), x, mlp)
    phases = draw_graph(a, phases=True).source
    lit_f = draw_graph(a, highlight="F").source
    lit_i = draw_graph(a, highlight="I").source
    assert "runs in I" in legend_entry(phases, "legend_i")
    assert "runs in W" in legend_entry(phases, "legend_w")
    assert "runs in F" in legend_entry(lit_f, "legend_i")
    assert "not in this pass" in legend_entry(lit_i, "legend_w")
    return {
        "F": attr(legend_entry(lit_f, "legend_i"), "fillcolor"),
        "I": attr(legend_entry(phases, "legend_i"), "fillcolor"),
        "W": attr(legend_entry(phases, "legend_w"), "fillcolor"),
        "split": attr(legend_entry(phases, "legend_split"), "color"),
        "dim": attr(legend_entry(lit_i, "legend_w"), "fillcolor"),
    }


def legend_swatches(fig) -> dict[str, list[str]]:
    """Each entry of a `plot_schedule` legend: its text -> its swatch's colours as hex, left
    to right ('F: forward' -> one colour; 'chunk 1: stages 4-7' -> one per kind)."""
    from matplotlib.colors import to_hex  # matplotlib: the notebook extra, asked by the caller
    from matplotlib.offsetbox import HPacker, TextArea
    from matplotlib.patches import Rectangle

    swatches = {}
    for row in fig.axes[0].get_legend().findobj(HPacker):
        drawing, text = row.get_children()[0], row.get_children()[-1]
        if isinstance(text, TextArea):
            patches = [a for a in drawing.get_children() if isinstance(a, Rectangle)]
            swatches[text.get_text()] = [to_hex(a.get_facecolor()) for a in patches]
    return swatches


def kind_swatches(fig) -> dict[str, str]:
    """'F', 'I', 'W', 'B' -> the colour a `plot_schedule` legend shows for that kind."""
    return {
        text.split(":")[0]: colours[0]
        for text, colours in legend_swatches(fig).items()
        if re.fullmatch(r"[A-Z]: .+", text)
    }
