"""draw_graph: what the picture contains, that it is reproducible, and the no-`dot` path.

The oracle is the analysis itself and autograd's own graph: every node autograd built is drawn
once, every ParamGroup is one cluster, every intermediate is marked, nothing else; a colour
means what the drawing's own legend says it means (`palette.py`).
"""

from __future__ import annotations

import re

import pytest
import torch
from palette import attr, graph_colours, legend_entry
from torch import nn

from zbkit.splitgrad import analyze
from zbkit.viz import draw_graph

COLOURS = graph_colours()  # F, I, W, split and dim, as the legends show them


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.ln(x))))


class Net(nn.Module):
    def __init__(self, d: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(d) for _ in range(layers))
        self.head = nn.Linear(d, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _stage(layers: int = 2, d: int = 4):
    torch.manual_seed(0)
    model = Net(d, layers)
    x = torch.randn(3, d, requires_grad=True)
    y = model(x)
    return model, x, y, analyze(y, [x], model)


def _node_lines(source: str) -> list[str]:
    # node statements: `\tn12 [label=...]` (not edges, not graph attributes)
    return re.findall(r"^\s+((?:n|m)\d+) \[(.*?)\]$", source, flags=re.M | re.S)


def test_every_node_edge_group_and_split_point_is_drawn_once():
    model, x, y, analysis = _stage()
    dot = draw_graph(analysis)
    src = dot.source
    nodes = _node_lines(src)
    # one drawn node per autograd node (the reverse graph holds every node reachable)
    assert len(nodes) == len(analysis.reverse_graph)
    assert len({nid for nid, _ in nodes}) == len(nodes)
    # edges: one per distinct producer -> consumer pair, plus one per output
    pairs = {(p, u) for p, users in analysis.reverse_graph.items() for u in users}
    edges = re.findall(r"^\s+(\w+) -> (\w+)$", src, flags=re.M)
    assert len(edges) == len(pairs) + 1 and len(set(edges)) == len(edges)
    # every parameter by its module path, inputs and outputs marked
    for name, p in model.named_parameters():
        shape = ", ".join(map(str, p.shape))
        assert f'label="{name}\n({shape})"' in src
    assert 'label="input[0]\n(3, 4)"' in src and 'label="output 0\n(3, 2)"' in src
    # one cluster per group, with its parameter names in the label
    clusters = re.findall(r"subgraph (cluster_group\d+)", src)
    assert len(clusters) == len(analysis.groups) == 7
    for info in analysis.groups:
        assert f"group {info.index}: {info.param_names[0]}" in src
    # split points: exactly the analysis' intermediates, all in the input closure
    split = [nid for nid, attrs in nodes if f'color="{COLOURS["split"]}"' in attrs]
    assert len(split) == sum(len(g.group.intermediates) for g in analysis.groups) == 7
    closure_ops = [n for n in analysis.input_closure if not analysis.labels[n].startswith("input[")]
    shaded = [nid for nid, attrs in nodes if f'fillcolor="{COLOURS["I"]}"' in attrs]
    assert len(shaded) == len(closure_ops)
    # the marks mean what this drawing's legend says
    assert attr(legend_entry(src, "legend_split"), "color") == COLOURS["split"]
    assert attr(legend_entry(src, "legend_i"), "fillcolor") == COLOURS["I"]


def test_same_model_draws_identical_svg_and_outputs_path_matches_analysis_path():
    _, _, _, a1 = _stage()
    _, _, _, a2 = _stage()  # a fresh model and graph: other Node objects, other id()s
    d1, d2 = draw_graph(a1), draw_graph(a2)
    assert d1.source == d2.source
    svg = d1.pipe(format="svg", encoding="utf-8")
    assert svg == d2.pipe(format="svg", encoding="utf-8")
    assert "<svg" in svg and "layers.0.fc1.weight" in svg
    model, x, y, _ = _stage()
    assert draw_graph(y, [x], model).source == d1.source


def test_phases_and_highlight_colour_what_each_pass_runs():
    _, _, _, analysis = _stage(layers=1)
    nodes = _node_lines(draw_graph(analysis, phases=True).source)
    closure_ids = {
        nid
        for nid, attrs in _node_lines(draw_graph(analysis).source)
        if f'fillcolor="{COLOURS["I"]}"' in attrs
    }
    i_nodes = {nid for nid, attrs in nodes if f'fillcolor="{COLOURS["I"]}"' in attrs}
    w_nodes = {nid for nid, attrs in nodes if f'fillcolor="{COLOURS["W"]}"' in attrs}
    assert i_nodes == closure_ids and w_nodes and not (i_nodes & w_nodes)
    # highlighting I: only I's nodes keep their colour, the W nodes are dimmed
    lit = _node_lines(draw_graph(analysis, highlight="I").source)
    assert {nid for nid, a in lit if COLOURS["I"] in a} == i_nodes
    assert not any(COLOURS["W"] in a for _, a in lit)
    with pytest.raises(ValueError, match="highlight"):
        draw_graph(analysis, highlight="B")


def test_group_highlight_and_bad_inputs():
    _, _, _, analysis = _stage(layers=1)
    src = draw_graph(analysis, group=1).source
    chosen = re.search(r"subgraph cluster_group1 \{(.*?)\}", src, flags=re.S).group(1)
    other = re.search(r"subgraph cluster_group0 \{(.*?)\}", src, flags=re.S).group(1)
    assert "penwidth=2" in chosen and COLOURS["dim"] in other  # chosen outlined, others dimmed
    with pytest.raises(ValueError, match="valid: 0..3"):
        draw_graph(analysis, group=9)
    with pytest.raises(TypeError, match="SplitGradAnalysis"):
        draw_graph(42)
    with pytest.raises(ValueError, match="does not require grad"):
        draw_graph(torch.zeros(2))


def test_graph_without_module_still_draws_with_unnamed_leaves():
    torch.manual_seed(0)
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(2, 4, requires_grad=True)
    src = draw_graph((x @ w).tanh(), x).source
    assert 'label="leaf tensor\n(4, 4)"' in src and 'label="input[0]\n(2, 4)"' in src
    assert "TanhBackward0#1" in src and "cluster_group" not in src


def test_twelve_layer_model_collapses_by_module_depth():
    model, _, _, analysis = _stage(layers=12, d=4)
    src = draw_graph(analysis).source
    assert "collapsed to module depth 2" in src
    # a box of ops from both passes has an HTML label (its text over a two-colour bar)
    boxes = re.findall(
        r'(?:label="|COLSPAN="2">)(layers\.\d+)(?:\n|<BR/>)(\d+) ops, (\d+) params', src
    )
    # one box per layer, each once (walked from the output, so the last layer comes first)
    assert [b[0] for b in boxes] == [f"layers.{i}" for i in reversed(range(12))]
    # every parameter is counted in exactly one box (the head is drawn node by node)
    in_boxes = sum(int(b[2]) for b in boxes)
    assert in_boxes == sum(1 for n, _ in model.named_parameters() if n.startswith("layers."))
    assert len(_node_lines(src)) < 40
    # forcing the full graph back: every node again
    full = draw_graph(analysis, max_nodes=10_000).source
    assert len(_node_lines(full)) == len(analysis.reverse_graph)


def test_without_dot_binary_the_repr_is_a_message_and_the_source(monkeypatch):
    _, _, _, analysis = _stage(layers=1)
    dot = draw_graph(analysis)
    assert "image/svg+xml" in dot._repr_mimebundle_()
    monkeypatch.setenv("PATH", "/nonexistent")  # graphviz finds no `dot` now
    bundle = dot._repr_mimebundle_()
    assert "image/svg+xml" not in bundle
    text = bundle["text/plain"]
    assert "`dot` program was not found" in text and "apt-get install graphviz" in text
    assert text.endswith(dot.source)


def _box(src: str, path: str) -> str:
    """The attribute list of the collapsed module box labelled `path`."""
    for _, attrs in _node_lines(src):
        if re.search(rf"(label=\"|<TD COLSPAN=\"\d\">){re.escape(path)}(\n|<BR/>)", attrs):
            return attrs
    raise AssertionError(f"no box {path!r} in the source")


@pytest.mark.parametrize("depth", [1, 2])
def test_a_group_collapsed_into_a_module_box_is_highlighted_at_any_depth(depth):
    _, _, _, analysis = _stage(layers=2)
    # a group whose parameters all sit in layers.1 (fc1 there), whatever the depth
    info = next(g for g in analysis.groups if g.param_names[0] == "layers.1.fc1.weight")
    src = draw_graph(analysis, group=info.index, depth=depth).source
    box = "layers" if depth == 1 else "layers.1"
    chosen = _box(src, box)
    assert f"group {info.index}: " in chosen and "penwidth=3" in chosen
    if depth == 2:  # the other layer holds none of it: dimmed
        other = _box(src, "layers.0")
        assert "penwidth=3" not in other and "#aaaaaa" in other
    # the explorer shows the same: its auto-collapsed graph outlines the box
    from zbkit.widgets import ParamGroupExplorer

    explorer = ParamGroupExplorer(analysis, max_nodes=8)
    explorer.select(info.index)
    assert "collapsed to module depth 2" in explorer.graph.source
    assert "penwidth=3" in _box(explorer.graph.source, "layers.1")


def test_phases_legend_matches_the_colours_and_names_mixed_module_boxes():
    _, _, _, analysis = _stage(layers=2)
    src = draw_graph(analysis, phases=True).source
    nodes = dict(_node_lines(src))
    legend_param = legend_entry(src, "legend_param")
    # parameters are drawn green (their .grad is made in W), and so is the legend's swatch
    param_fills = {
        re.search(r'fillcolor="([^"]+)"', a).group(1) for a in nodes.values() if ".weight" in a
    }
    assert param_fills == {COLOURS["W"]}
    assert f'fillcolor="{COLOURS["W"]}"' in legend_param
    assert "legend_mixed" not in src  # nothing collapsed: no module-box entry
    # collapsed, each layer runs in both passes: a white box, its text over an I|W bar (no
    # stripe through the words), and the legend shows the same bar
    collapsed = draw_graph(analysis, phases=True, depth=2).source
    box = _box(collapsed, "layers.0")
    assert "striped" not in box and "fillcolor=white" in box
    bar = re.search(r"<TR>(<TD BGCOLOR.*?)</TR>", box).group(1)
    assert re.findall(r'BGCOLOR="([^"]+)"', bar) == [COLOURS["I"], COLOURS["W"]]
    key = legend_entry(collapsed, "legend_mixed")
    assert "ops of I and W" in key and COLOURS["I"] in key and COLOURS["W"] in key
    # without phases the parameters stay yellow, and so does the legend's swatch
    plain = draw_graph(analysis).source
    assert 'legend_param [label=parameter fillcolor="#fff4c2"' in plain


def test_drawn_names_are_the_names_analyze_prints():
    # a learner reads a printed analysis beside its drawing: each node has one name in both
    _, _, _, analysis = _stage(layers=1)
    src = draw_graph(analysis).source
    # the first line of each node's label ("TanhBackward0#1", "layers.0.fc1.weight", "input[0]")
    drawn = re.findall(r'^\s+n\d+ \[label="?([^"\n]+)', src, flags=re.M)
    assert sorted(drawn) == sorted(analysis.labels.values())
    assert "ReluBackward0#1" in drawn and "Relu" not in drawn


def test_collapsed_boxes_count_split_points_in_singular_and_plural():
    _, _, _, analysis = _stage(layers=2)
    found = []
    for depth in (1, 2, 3):
        found += re.findall(r"(\d+) (split points?)\b", draw_graph(analysis, depth=depth).source)
    assert ("1", "split point") in found and ("6", "split points") in found  # both forms drawn
    assert all((n == "1") == (noun == "split point") for n, noun in found), found


def test_the_input_closure_has_one_colour_with_or_without_phases():
    # notebook 01 draws the closure plainly, notebook 02 lights what I runs: the same teal
    _, _, _, analysis = _stage(layers=1)
    fills = {}
    for how in ({}, {"phases": True}, {"highlight": "I"}):
        nodes = dict(_node_lines(draw_graph(analysis, **how).source))
        closure = [analysis.labels[n] for n in analysis.input_closure]
        fills[str(how)] = {
            re.search(r'fillcolor="([^"]+)"', a).group(1)
            for a in nodes.values()
            if re.match(r'label="?([^"\n]+)', a).group(1) in closure and "input[" not in a
        }
    assert list(fills.values()) == [{COLOURS["I"]}] * 3, fills
    key = legend_entry(draw_graph(analysis).source, "legend_i")
    assert "input closure" in key and attr(key, "fillcolor") == COLOURS["I"]
