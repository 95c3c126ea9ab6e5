"""group_params and analyze: real unions, deterministic order, names, drawing."""

import re

import graphviz
import torch
from torch import nn

from zbkit.models import TransformerBlock
from zbkit.splitgrad import (
    analyze,
    build_reverse_graph,
    grad_node,
    group_params,
    reverse_closure,
)
from zbkit.viz import draw_graph

D = torch.float64


def test_reverse_graph_and_closure():
    x = torch.randn(3, requires_grad=True)
    w = torch.randn(3, requires_grad=True)
    h = x * 2  # MulBackward(x)
    out = (h + w).sum()
    rg = build_reverse_graph([out.grad_fn])
    assert rg[grad_node(x)] == [h.grad_fn]
    assert rg[out.grad_fn] == []
    closure, reached = reverse_closure([grad_node(x)], set(), rg)
    assert grad_node(w) not in closure and out.grad_fn in closure and h.grad_fn in closure
    add = out.grad_fn.next_functions[0][0]
    closure_w, reached_w = reverse_closure([grad_node(w)], closure, rg)
    assert closure_w == {grad_node(w)} and reached_w == {add}


def test_bridging_param_merges_groups_deterministically():
    a, b, c, d = (torch.randn(3, 3, requires_grad=True) for _ in range(4))
    x = torch.randn(2, 3, requires_grad=True)
    h1 = x @ a  # a alone at mm1
    h2 = h1 @ b  # b at mm2
    h3 = h2 @ c + h1 @ b  # b also at mm3's neighbour: b bridges mm2 and the new mm
    out = (h3 @ d).sum()
    nodes = [grad_node(t) for t in (d, c, b, a)]
    rg = build_reverse_graph([out.grad_fn])
    groups = group_params([grad_node(x)], nodes, rg)
    names = {grad_node(t): n for t, n in zip((a, b, c, d), "abcd", strict=True)}
    got = [[names[p] for p in g.param_nodes] for g in groups]
    assert got == [["d"], ["c"], ["b"], ["a"]]
    assert [len(g.intermediates) for g in groups] == [1, 1, 2, 1]
    # disjoint, and the same again
    again = group_params([grad_node(x)], nodes, rg)
    assert [g.param_nodes for g in again] == [g.param_nodes for g in groups]
    assert [g.intermediates for g in again] == [g.intermediates for g in groups]
    # a parameter joining two others' nodes merges them into one group
    e = torch.randn(3, 3, requires_grad=True)
    out2 = ((x @ a) * (x @ (a + e))).sum() + (x @ e).sum()
    rg2 = build_reverse_graph([out2.grad_fn])
    g2 = group_params([grad_node(x)], [grad_node(a), grad_node(e)], rg2)
    assert len(g2) == 1 and g2[0].params == {grad_node(a), grad_node(e)}


def test_analyze_transformer_block_names_and_drawing():
    torch.manual_seed(0)
    block = TransformerBlock(dim=8, heads=2).to(D)
    block.ln2.bias.requires_grad_(False)
    x = torch.randn(1, 3, 8, dtype=D, requires_grad=True)
    a = analyze(block(x), x, block)
    names = [n for g in a.groups for n in g.param_names]
    trainable = [n for n, p in block.named_parameters() if p.requires_grad]
    assert sorted(names) == sorted(trainable) and len(names) == len(set(names))
    assert a.frozen_params == ["ln2.bias"] and a.unused_params == []
    by_name = {tuple(g.param_names): g for g in a.groups}
    assert ("mlp.2.weight", "mlp.2.bias") in by_name
    assert all(g.intermediates for g in a.groups)  # every group starts inside I
    assert len({lab for g in a.groups for lab in g.intermediates}) == sum(
        len(g.intermediates) for g in a.groups
    )
    dot = a.to_dot()  # a thin delegate: drawing lives in viz
    assert isinstance(dot, graphviz.Digraph)
    assert dot.source == draw_graph(a).source
    assert "mlp.2.weight" in draw_graph(a, depth=None, max_nodes=1000).source
    html = a._repr_html_()
    assert "<table>" in html and "attn.qkv.weight" in html
    assert "param groups" in repr(a)


def test_analyze_first_stage_groups_start_at_outputs():
    emb = nn.Embedding(5, 4)
    ids = torch.tensor([[1, 2, 3]])
    a = analyze(emb(ids).sum(), ids, emb)
    assert [g.param_names for g in a.groups] == [["weight"]]
    assert a.groups[0].intermediates == [] and len(a.groups[0].outputs) == 1
    assert a.input_closure == set()


def test_outputs_outside_i_column_says_what_it_holds():
    # a first stage (input without grad): I runs nothing, the group's W starts at the output
    emb = nn.Embedding(5, 4)
    a = analyze(emb(torch.tensor([[1, 2]])).sum(), torch.tensor([[1, 2]]), emb)
    html = a._repr_html_()
    header = re.search(r'<th title="([^"]+)">outputs outside I</th>', html).group(1)
    assert "not computed from the inputs" in header and "W also starts there" in header
    assert f"<td>{a.groups[0].outputs[0]}</td>" in html and "SumBackward0#1" in html


def test_one_group_is_counted_in_the_singular():
    w = nn.Linear(3, 3)
    x = torch.randn(2, 3, requires_grad=True)
    one = analyze(w(x).sum(), x, w)
    assert "1 param group\n" in repr(one) + "\n" and "1 param groups" not in repr(one)
    assert "1 param group</p>" in one._repr_html_()
    assert repr(draw_graph(one)) == "<ZbDigraph: 6 nodes, 1 param group>"
    mlp = nn.Sequential(w, nn.Linear(3, 1))
    two = analyze(mlp(x).sum(), x, mlp)
    assert "2 param groups" in repr(two)
