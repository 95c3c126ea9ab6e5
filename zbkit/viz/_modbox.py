"""How `draw_graph` draws a module collapsed into one box (`depth=`): label, fill, outline.

A collapsed box can hold ops of both passes (I and W). Its fill then shows both, as a bar
under the text split in proportion (an HTML-like label), so no divider runs through the words;
the legend's "module box" entry shows the same bar. A chosen ParamGroup is outlined in every
box that holds any of it, whatever the depth.
"""

from __future__ import annotations

import html

from zbkit.viz import _colors as c


def _bar(fills: list[tuple[str, int]], width: int = 90) -> str:
    """One table row: a cell per colour, as wide as its share of the nodes."""
    total = sum(n for _, n in fills) or 1
    cells = "".join(
        f'<TD BGCOLOR="{color}" WIDTH="{max(4, round(width * n / total))}" HEIGHT="7"></TD>'
        for color, n in fills
    )
    return f"<TR>{cells}</TR>"


def html_label(lines: list[str], fills: list[tuple[str, int]], font: str | None = None) -> str:
    """Text over a bar of `fills` ((colour, node count) per pass), as a Graphviz HTML label."""
    text = "<BR/>".join(html.escape(line) for line in lines)
    if font:
        text = f'<FONT COLOR="{font}">{text}</FONT>'
    span = len(fills)
    return (
        '<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="2">'
        f'<TR><TD COLSPAN="{span}">{text}</TD></TR>{_bar(fills)}</TABLE>>'
    )


def collapsed_box(
    path: str,
    ops: int,
    params: int,
    splits: int,
    fills: list[tuple[str, int]],
    group: int | None,
    held: int,
) -> tuple[str, dict[str, str]]:
    """(label, node attributes) of a collapsed module box.

    `fills`: (colour, count) of its nodes per pass, in a fixed order; more than one colour
    means the box runs in both I and W. `group`: the chosen ParamGroup (None: all shown);
    `held`: how many of its nodes (parameters, W-only ops, split points) sit in this box.
    """
    lines = [path, f"{ops} ops, {params} params"]
    if splits:
        lines.append(f"{splits} split point{'s' if splits != 1 else ''}")
    attrs: dict[str, str] = {}
    if splits:
        attrs.update(color=c.SPLIT_COLOR, penwidth="2")
    dim = group is not None and not held
    if group is not None and held:  # the chosen group lives (partly) in here: say so, outline
        lines.append(f"group {group}: {held} of its nodes")
        attrs.update(color="black", penwidth="3")
    font = c.DIM_FONT if dim else None
    if dim:
        fills = [(c.DIM_FILL, sum(n for _, n in fills))]
        attrs["fontcolor"] = c.DIM_FONT
    if len(fills) > 1:  # both passes: white box, the text over a two-colour bar
        return html_label(lines, fills, font), {**attrs, "fillcolor": "white", "style": "filled"}
    return "\n".join(lines), {**attrs, "fillcolor": fills[0][0], "style": "filled"}
