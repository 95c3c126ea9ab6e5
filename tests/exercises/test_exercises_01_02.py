"""The exercises of notebooks 01 and 02: each checker against an answer worked out here.

The oracles: plain autograd graphs walked through `next_functions` (01), the notebook's own
naive split and graphs, taken from its cells, against plain `backward()` (02.1, 02.2), the
stepper's own table (02.3) and the parameters' sizes (02.4). (What every exercise shares, its
check cell and folded solution, is tested in test_exercises_all.py.)
"""

from __future__ import annotations

import ast
import copy
import re
from collections import Counter
from typing import Any

import pytest
import torch
from notebook_cells import cell_python, cell_source, read_cells
from torch import nn

from zbkit.exercises import check
from zbkit.models import TiedLM, TransformerBlock
from zbkit.splitgrad import analyze

NAMES = {"01": "01_autograd_graph", "02": "02_split_backward"}
KEYS = [f"{nb}.{k}" for nb in NAMES for k in range(1, 5)]


# ----------------------------------------------------------------- plain autograd graphs


def _nodes(out: torch.Tensor) -> list[Any]:
    """Every node backward() can reach from `out`, through next_functions."""
    seen: list[Any] = []
    stack = [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.append(node)
        stack += [n for n, _ in node.next_functions]
    return seen


def _closure(out: torch.Tensor, x: torch.Tensor) -> list[Any]:
    """The nodes x.grad needs: those from which x's own leaf node can be reached."""
    reaches: dict[Any, bool] = {}

    def reach(node: Any) -> bool:
        if node not in reaches:
            reaches[node] = getattr(node, "variable", None) is x or any(
                reach(n) for n, _ in node.next_functions if n is not None
            )
        return reaches[node]

    return [n for n in _nodes(out) if reach(n)]


def _mlp() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)), torch.randn(
        4, 3, requires_grad=True
    )


def _judged(key: str, answer: Any) -> tuple[bool | None, str]:
    verdict = check(key, answer)
    return verdict.right, verdict.why


# ----------------------------------------------------------------- notebook 01


def test_01_1_the_nodes_the_skip_adds_to_the_closure():
    mlp, x = _mlp()
    plain, skip = mlp(x), mlp(x) + x @ torch.ones(3, 2)
    names = Counter(n.name() for n in _closure(skip, x)) - Counter(
        n.name() for n in _closure(plain, x)
    )
    labels = analyze(skip, x, mlp).labels
    joined = {labels[n] for n in _closure(skip, x) if n.name() in names}
    assert len(joined) == sum(names.values()) >= 1

    assert _judged("01.1", joined)[0] is True
    assert _judged("01.1", sorted(n.split("#")[0].upper() for n in joined))[0] is True
    already = {labels[n] for n in _closure(skip, x) if n.name() == "AddmmBackward0"}
    right, why = _judged("01.1", joined | already)
    assert right is False and all(a in why for a in already) and "before the skip" in why
    assert "new path" in why
    right, why = _judged("01.1", set(sorted(joined)[:1]))
    assert right is False and "1 more node joins" in why


def test_01_2_the_frozen_graph_loses_its_frozen_nodes():
    mlp, x = _mlp()
    before = len(_nodes(mlp(x)))
    mlp[0].requires_grad_(False)
    after = len(_nodes(mlp(x)))
    assert after < before

    right, why = _judged("01.2", after)
    assert right is True and f"{before - after} fewer" in why
    right, why = _judged("01.2", before)
    assert right is False and "forward" in why
    right, why = _judged("01.2", before - 2)  # only the two AccumulateGrad nodes removed
    assert right is False and "one more node" in why and "not recorded" in why
    right, why = _judged("01.2", after - 1)
    assert right is False and "x still requires grad" in why
    assert _judged("01.2", str(after))[0] is False


def test_01_3_a_stage_fed_by_data_has_an_empty_closure():
    mlp, x = _mlp()
    data = x.detach()
    size = len(_closure(mlp(data), data))
    with_grad = len(_closure(mlp(x), x))

    right, why = _judged("01.3", size)
    assert right is True and "I pass has nothing to compute" in why
    right, why = _judged("01.3", with_grad)
    assert right is False and "while x requires grad" in why and "no node" in why
    right, why = _judged("01.3", with_grad + 1)
    assert right is False and "needs no gradient" in why


def test_01_4_the_ops_only_w_runs_in_the_block():
    torch.manual_seed(0)
    block = TransformerBlock(dim=16, heads=2)
    h = torch.randn(2, 5, 16, requires_grad=True)
    out = block(h)
    closure = _closure(out, h)
    ops = {
        n.name() for n in _nodes(out) if n not in closure and getattr(n, "variable", None) is None
    }
    assert ops

    assert _judged("01.4", ops)[0] is True
    assert _judged("01.4", [f"{op}#1" for op in ops])[0] is True
    right, why = _judged("01.4", ops | {"AddmmBackward0"})
    assert right is False and "AddmmBackward0" in why and "I runs it" in why
    right, why = _judged("01.4", ops | {"ln1.weight"})
    assert right is False and "AccumulateGrad" in why


# ----------------------------------------------------------------- notebook 02


@pytest.fixture(scope="module")
def nb02() -> dict[str, Any]:
    """The definitions (imports, functions, classes) of notebook 02's lesson cells."""
    namespace: dict[str, Any] = {}
    for cell in read_cells(NAMES["02"]):
        if "## Exercises" in cell_source(cell):
            break
        if cell["cell_type"] != "code":
            continue
        kept = [
            node
            for node in ast.parse(cell_python(cell)).body
            if isinstance(node, ast.Import | ast.ImportFrom | ast.FunctionDef | ast.ClassDef)
        ]
        exec(compile(ast.Module(kept, []), "02_split_backward", "exec"), namespace)
    return namespace


def _wrong_after(nb: dict[str, Any], make_stage: Any, weight_pass: Any) -> set[str]:
    """The parameters whose .grad differs from plain backward() after the naive I and W."""
    torch.manual_seed(0)
    model = make_stage()
    x, grad_out = torch.randn(3, 4), torch.randn(3, 4)
    ref = copy.deepcopy(model)
    ref(x).backward(grad_out)
    xi = x.clone().requires_grad_()
    weights = list(model.parameters())
    _, state = nb["naive_backward_input"]([model(xi)], [grad_out], [xi], weights)
    weight_pass(weights, state)
    return {
        name
        for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True)
        if not torch.allclose(p.grad, q.grad, atol=1e-6)
    }


def _per_output_weight(nb: dict[str, Any]) -> Any:
    def weight_pass(weights: list[torch.Tensor], state: Any) -> None:
        splits, captured = state
        for p in weights:
            edges = [
                (nb["GradientEdge"](n, k), g)
                for n in splits[p]
                for k, g in enumerate(captured[n])
                if g is not None
            ]
            torch.autograd.backward(
                [e for e, _ in edges], [g for _, g in edges], inputs=[p], retain_graph=True
            )

    return weight_pass


class FloatTiedLM(TiedLM):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (batch, vocab)
        return self.block(x @ self.embed.weight) @ self.embed.weight.T


def test_02_1_the_naive_split_on_tied_weights(nb02):
    wrong = _wrong_after(nb02, lambda: FloatTiedLM(vocab=4), nb02["naive_backward_weight"])
    assert wrong, "the exercise asks what breaks: with nothing broken it asks nothing"

    assert _judged("02.1", wrong)[0] is True
    assert _judged("02.1", [w.upper() for w in wrong])[0] is True
    right, why = _judged("02.1", set())
    assert right is False and "does not survive" in why and "two uses along one path" in why
    right, why = _judged("02.1", wrong | {"block.up.weight"})
    assert right is False and "block.up.weight" in why and "used once" in why
    assert _judged("02.1", False)[0] is False


def test_02_2_per_output_edges_fix_one_graph(nb02):
    graphs = {"Twice": nb02["Twice"], "Gate": nb02["Gate"]}
    naive, per_output = nb02["naive_backward_weight"], _per_output_weight(nb02)
    assert all(_wrong_after(nb02, make, naive) for make in graphs.values())
    fixed = [name for name, make in graphs.items() if not _wrong_after(nb02, make, per_output)]
    assert len(fixed) == 1
    (other,) = set(graphs) - set(fixed)

    assert _judged("02.2", fixed[0])[0] is True
    assert _judged("02.2", fixed[0].lower())[0] is True
    right, why = _judged("02.2", other)
    assert right is False and f"compare({other}) still says WRONG" in why
    assert "where W starts" in why
    right, why = _judged("02.2", "both")
    assert right is False and "'Twice' or 'Gate'" in why


def test_02_3_after_f_and_i_only_the_input_is_filled():
    from zbkit.widgets import SplitBackwardStepper

    torch.manual_seed(0)
    x = torch.randn(4, 3, requires_grad=True)
    stepper = SplitBackwardStepper(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)), x)
    stepper.step("F")
    stepper.step("I")
    rows = re.findall(
        r"<tr><td[^>]*>([^<]+)</td><td[^>]*>[^<]*</td><td[^>]*>(filled|empty)</td>",
        stepper.table.value,
    )
    filled = {name for name, state in rows if state == "filled"}
    assert len(rows) == 5 and filled

    assert _judged("02.3", filled)[0] is True
    right, why = _judged("02.3", filled | {"0.weight"})
    assert right is False and "0.weight" in why and "still empty after I" in why
    right, why = _judged("02.3", {"weight"})
    assert right is False and "no such row" in why


def test_02_4_the_group_with_the_most_numbers():
    torch.manual_seed(0)
    block = TransformerBlock(dim=16, heads=2)
    h = torch.randn(2, 5, 16, requires_grad=True)
    a = analyze(block(h), h, block)
    params = dict(block.named_parameters())
    numbers = [sum(params[n].numel() for n in g.param_names) for g in a.groups]
    ranked = sorted(range(len(numbers)), key=numbers.__getitem__, reverse=True)
    assert numbers[ranked[0]] > numbers[ranked[1]]

    right, why = _judged("02.4", ranked[0])
    assert right is True and str(numbers[ranked[0]]) in why
    right, why = _judged("02.4", ranked[1])
    assert right is False and f"holds {numbers[ranked[1]]} numbers" in why
    right, why = _judged("02.4", "mlp.0")
    assert right is False and "an int" in why
