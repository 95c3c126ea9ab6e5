"""What every exercise of every notebook shares: a check cell that waits for an answer, a
worked solution under the ``%%solution`` magic that computes its answer, is judged right and
shows it only inside a closed fold, a verdict that says what to give when no answer is given,
and checkers that leave the learner's random stream alone. (Each checker's own right and
wrong answers are tested beside its notebook's.)
"""

from __future__ import annotations

import ast
import json
import re

import pytest
import torch
from notebook_cells import BOOKS, cell_source, read_cells

from zbkit.exercises import EXERCISES, all_exercises, check

APPENDICES = {"10"}  # optional last notebooks, the internals: no exercises (issue 36)
EXERCISED = {name[:2]: name for name in BOOKS if name[:2] not in APPENDICES}  # "03": its name
KEYS = list(all_exercises())


def test_every_notebook_has_checkable_exercises() -> None:
    assert {key[:2] for key in KEYS} == set(EXERCISED), "a notebook without checkable exercises"


@pytest.mark.parametrize("key", KEYS)
def test_no_answer_says_what_to_give(key: str) -> None:
    verdict = check(key, None)
    assert verdict.right is None and "not answered yet" in repr(verdict)
    assert EXERCISES[key].asks in verdict.why


@pytest.mark.parametrize("key", KEYS)
def test_a_check_leaves_the_learners_random_stream_alone(key: str) -> None:
    torch.manual_seed(1)
    expected = torch.rand(3)
    torch.manual_seed(1)
    check(key, 0)  # a wrong answer of some type: the checker works its answer out anyway
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("nb", sorted(EXERCISED))
def test_every_exercise_has_a_waiting_check_and_a_folded_solution_judged_right(nb: str) -> None:
    cells = read_cells(EXERCISED[nb])
    asked = {
        i: f"{nb}.{m[1]}"
        for i, c in enumerate(cells)
        if c["cell_type"] == "markdown"
        and (m := re.match(r"\*\*Exercise (\d+)\.\*\* ", cell_source(c)))
    }
    assert list(asked.values()) == [k for k in KEYS if k.startswith(f"{nb}.")], asked
    for i, key in asked.items():
        checking, solution = cells[i + 1], cells[i + 2]
        for cell in (checking, solution):
            assert cell["cell_type"] == "code", f"{key}: cell {cell['id']}"
            assert f'check("{key}", answer)' in cell_source(cell), f"{key}: {cell_source(cell)}"
        assert "answer = None" in cell_source(checking), key
        assert "not answered yet" in json.dumps(checking["outputs"]), key
        head, body = cell_source(solution).split("\n", 1)
        assert head == "%%solution" and body.startswith("# Worked solution (expand to read)\n")
        folded = solution["metadata"].get("jupyter", {})
        assert folded.get("source_hidden") is True and folded.get("outputs_hidden") is True, key
        assert "solution" in solution["metadata"].get("tags", []), key
        # all it shows is one closed fold, the verdict inside (a Run All leaves it folded)
        (shown,) = solution["outputs"]
        page = "".join(shown["data"]["text/html"])
        assert page.startswith("<details ") and "<details open" not in page, key
        assert page.rstrip().endswith("</details>"), key
        assert f"exercise {key}: right." in page, key
        # the solution works its answer out: no `answer = <a literal>`
        assigned = [
            n.value
            for n in ast.walk(ast.parse(body))
            if isinstance(n, ast.Assign)
            and any(getattr(t, "id", "") == "answer" for x in n.targets for t in ast.walk(x))
        ]
        assert assigned and not any(isinstance(v, ast.Constant) for v in assigned), key
