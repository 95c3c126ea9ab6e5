"""Structure of the tutorials: the checks nbval does not do (it compares outputs, cell by cell).

The oracle is issue 8's notebook list and its rules: seven notebooks, stored outputs from a
real run, exercises at the end, clusters stopped, and output comparison switched off only
for cells whose output truly varies.
"""

from __future__ import annotations

import configparser
import re

import pytest
from notebook_cells import NOTEBOOKS, cell_source, read_notebook

EXPECTED = [
    "01_autograd_graph",
    "02_split_backward",
    "03_schedules_and_bubbles",
    "04_memory",
    "05_running_pipelines",
    "06_ddp_and_accumulation",
    "07_debugging",
    "08_torch_pipelining",
    "09_plan_your_run",
    "10_inside_zb_auto",
]
# optional last notebooks (issue 36): the internals, no exercises; they end with their recap
APPENDICES = {"10_inside_zb_auto"}
# notebooks that start a %zb_start cluster (08 uses launch(), whose ranks end with the call)
MULTIPROCESS = {"05_running_pipelines", "06_ddp_and_accumulation", "07_debugging"}
IGNORE_TAG, RAISES_TAG = "nbval-ignore-output", "raises-exception"
MAX_IGNORED = 3  # per notebook: measured timings, live widgets, machine paths in tracebacks


def _code(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def _ignored(cell: dict) -> bool:
    lines = [line.strip().lstrip("#").strip() for line in cell_source(cell).splitlines()]
    return "NBVAL_IGNORE_OUTPUT" in lines or IGNORE_TAG in cell["metadata"].get("tags", [])


def test_the_notebooks_and_nothing_else() -> None:
    found = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))
    assert found == EXPECTED, f"notebooks/ holds {found}, issues 8, 14, 35 and 36 list {EXPECTED}"


@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_is_executed_in_order_with_outputs(name: str) -> None:
    cells = _code(read_notebook(name))
    counts = [c["execution_count"] for c in cells]
    assert all(n is not None for n in counts), f"{name}: some code cells were never run"
    assert counts == list(range(1, len(cells) + 1)), f"{name}: not run top to bottom: {counts}"
    with_output = sum(bool(c["outputs"]) for c in cells)
    assert with_output >= len(cells) // 2, f"{name}: only {with_output}/{len(cells)} have output"
    for i, c in enumerate(cells):
        errors = [o for o in c["outputs"] if o["output_type"] == "error"]
        expected = RAISES_TAG in c["metadata"].get("tags", [])
        assert bool(errors) == expected, (
            f"{name}, code cell {i}: {'an unexpected error' if errors else 'no error'} stored"
        )


@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_draws_and_ends_with_exercises(name: str) -> None:
    nb = read_notebook(name)
    drawings = [
        o
        for c in _code(nb)
        for o in c["outputs"]
        if {"image/png", "image/svg+xml"} & set(o.get("data", {}))
    ]
    assert drawings, f"{name}: no drawing among the stored outputs"
    if name in APPENDICES:  # no exercises: the recap is the last cell
        last = cell_source(nb["cells"][-1])
        assert last.startswith("## Recap"), f"{name}: an appendix ends with its recap"
        return
    # the exercises: a numbered list under "## Exercises" in the last cell, or (issue 22)
    # "## Exercises" followed only by exercise cells: "**Exercise N.**", its check cell, its
    # solution cell
    heads = [
        i
        for i, c in enumerate(nb["cells"])
        if c["cell_type"] == "markdown" and "## Exercises" in cell_source(c)
    ]
    assert heads, f"{name}: no exercises"
    text = cell_source(nb["cells"][heads[-1]]).split("## Exercises", 1)[1]
    items = re.findall(r"^\d+\. ", text, flags=re.M)
    for c in nb["cells"][heads[-1] + 1 :]:
        if c["cell_type"] == "markdown":
            assert re.match(r"\*\*Exercise \d+\.\*\* ", cell_source(c)), f"{name}: not at the end"
            items.append(cell_source(c))
        else:
            assert "check(" in cell_source(c), (
                f"{name}: a code cell after the exercises checks none"
            )
    assert len(items) >= 3, f"{name}: {len(items)} exercises, want at least 3"


@pytest.mark.parametrize("name", EXPECTED)
def test_output_comparison_is_off_only_where_output_varies(name: str) -> None:
    ignored = [c for c in _code(read_notebook(name)) if _ignored(c)]
    assert len(ignored) <= MAX_IGNORED, f"{name}: {len(ignored)} cells skip output comparison"
    for c in ignored:  # each says why: a measurement, a live widget, or an error report
        src = cell_source(c)
        why = ("%%zb", "widgets.", "print(failure)", "(paths", "(a live widget", "# measured:")
        assert any(w in src for w in why), f"{name}: unexplained NBVAL_IGNORE_OUTPUT:\n{src}"


@pytest.mark.parametrize("name", sorted(MULTIPROCESS))
def test_multiprocess_notebooks_stop_their_ranks(name: str) -> None:
    sources = [cell_source(c) for c in _code(read_notebook(name))]
    starts = [i for i, s in enumerate(sources) if "%zb_start" in s]
    stops = [i for i, s in enumerate(sources) if s.strip() == "%zb_stop"]
    assert starts, f"{name}: never starts a cluster"
    assert stops and stops[-1] > starts[-1], f"{name}: the last cluster is never stopped"
    sizes = [int(n) for s in sources for n in re.findall(r"%zb_start -n (\d+)", s)]
    assert all(2 <= n <= 4 for n in sizes), f"{name}: cluster sizes {sizes}, keep to 2-4"


def test_sanitize_file_patterns_compile_and_cover_what_varies() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(NOTEBOOKS / "sanitize.cfg")
    patterns = {s: re.compile(cfg[s]["regex"]) for s in cfg.sections()}
    samples = {
        "a pid": "rank 0: pid 12345, alive",
        "an address": "<object at 0x7f3a2c1d9e80>",
        "a port": "127.0.0.1:29517",
        "a duration": "timed out after 5.5 s",
    }
    for what, text in samples.items():
        assert any(p.search(text) for p in patterns.values()), f"nothing sanitizes {what}"


@pytest.mark.parametrize("name", EXPECTED)
def test_learner_cells_carry_no_nbval_comments(name: str) -> None:
    # nbval reads cell tags (nbval-ignore-output, nbval-skip, raises-exception); a
    # `# NBVAL_...` line would be test plumbing in the middle of the lesson
    for i, cell in enumerate(_code(read_notebook(name))):
        marks = [line for line in cell_source(cell).splitlines() if "NBVAL_" in line.upper()]
        assert not marks, f"{name}, code cell {i}: {marks[0]!r}; use the cell tag instead"


@pytest.mark.parametrize("name", EXPECTED)
def test_stored_widget_outputs_say_to_run_the_cell(name: str) -> None:
    # before the kernel runs, JupyterLab shows the bundle's other entries: one line, not the
    # widget's repr of every child
    for i, cell in enumerate(_code(read_notebook(name))):
        for out in cell["outputs"]:
            data = out.get("data", {})
            if "application/vnd.jupyter.widget-view+json" in data:
                text = "".join(data["text/plain"])
                assert "run this cell" in text and "\n" not in text, f"{name}, code cell {i}"
