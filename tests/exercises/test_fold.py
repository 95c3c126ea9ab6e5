"""The ``%%solution`` cell magic in a real kernel: the body runs in the notebook's namespace,
and everything it prints, displays and draws comes back as one closed ``<details>``."""

from __future__ import annotations

import nbclient
import nbformat
import pytest

from zbkit.exercises import check

SETUP = "%load_ext zbkit.exercises\nfrom zbkit.exercises import check\nimport matplotlib.pyplot"


def _run(*cells: str) -> list:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in (SETUP, *cells)]
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=120).execute()
    return nb.cells[1:]


def test_a_solution_shows_its_output_folded_and_leaves_its_answer() -> None:
    body = "print('m <= 7')\nmatplotlib.pyplot.plot([1, 2]);\nanswer = 2 + 5\ncheck('03.1', answer)"
    solved, after = _run("%%solution\n# Worked solution (expand to read)\n" + body, "answer")
    assert [o.output_type for o in solved.outputs] == ["display_data"]  # nothing outside
    page, plain = solved.outputs[0].data["text/html"], solved.outputs[0].data["text/plain"]
    assert page.startswith("<details ") and "<details open" not in page
    assert "<summary>Worked solution's output (click to show)</summary>" in page
    verdict = check("03.1", 7)
    assert verdict.right and repr(verdict) in plain  # the check's verdict, inside the fold
    assert "m &lt;= 7" in page and 'src="data:image/png;base64,' in page  # print and plot
    assert after.outputs[0].data["text/plain"] == "7"  # the body ran in the namespace


def test_a_failing_solution_fails_its_cell() -> None:
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="ZeroDivisionError"):
        _run("%%solution\nanswer = 1 / 0")


def test_the_magic_takes_no_arguments() -> None:
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="takes no arguments"):
        _run("%%solution 03.1\nanswer = 7")
