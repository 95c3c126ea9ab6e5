"""README's blocks as a learner pastes them into notebook cells: what each cell shows.

tests/test_readme.py checks that every block runs; here the oracle is what IPython displays
(a cell's last expression) and prints, read from a real `InteractiveShell` in a fresh process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_readme import README, readme_chains  # tests/ is on sys.path (rootdir conftest)

# runs each cell in one shell; prints, per cell, the repr of what the cell displays and its stdout
RUNNER = """
import io, json, sys, contextlib
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shown = []
for cell in json.load(sys.stdin):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = shell.run_cell(cell)
    result.raise_error()
    shown.append({"value": repr(result.result), "stdout": out.getvalue()})
print(json.dumps(shown))
"""


def _show(cells: list[str]) -> list[dict[str, str]]:
    env = {**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps(cells),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,  # minutes: ranks start slowly on a busy machine
        cwd=Path(README).parent,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _block(heading: str) -> str:
    (code,) = ["\n".join(blocks) for h, blocks in readme_chains(README.read_text()) if h == heading]
    return code


def test_split_backward_cell_shows_that_i_then_w_equals_plain_autograd():
    split = _block("Split backward: I now, W later")
    # then the stepper on the same block, as a learner tries the widget next
    stepper = (
        "from zbkit import widgets\n"
        "s = widgets.SplitBackwardStepper(block, x)\n"
        "cleared, no_before = s.cleared[:2], s.table.value.count('>NO<')\n"
        "for kind in 'FIW':\n"
        "    s.step(kind)\n"
        "cleared, no_before, s.table.value.count('>NO<'), s.table.value.count('>yes<')"
    )
    first, after = _show([split, stepper])
    assert first["value"] == "True"  # not a tuple of tensors: the answer to "do they agree?"
    cleared, no_before, no, yes = eval(after["value"])  # noqa: S307 (a tuple of literals)
    # the split snippet's .grads (another loss) are cleared, not set against the oracle
    assert cleared == ["ln1.weight", "ln1.bias"] and no_before == 0
    assert no == 0 and yes == 1 + 12  # after F, I, W: the input and all twelve parameters


@pytest.mark.multiprocess
def test_cluster_cell_prints_what_the_ranks_returned():
    (cell,) = _show([_block("Ranks from a notebook cell")])
    assert cell["value"] == "None"  # a `with` block shows nothing: hence the prints
    lines = cell["stdout"].splitlines()
    assert "[10.0, 10.0, 10.0, 10.0]" in lines and "[1, 3]" in lines
