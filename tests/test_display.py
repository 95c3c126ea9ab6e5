"""The display protocol: data classes show themselves in a notebook through renderers that
`zbkit.viz` registers, so no data module imports the drawings.

Oracles: a fresh interpreter's `sys.modules` after importing the data packages (viz absent
until something is shown), the same objects shown in this process (viz imported as usual),
and the package's import statements.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import zbkit
from zbkit.schedules import Schedule, build_schedule, simulate

PACKAGE = Path(zbkit.__file__).parent
DATA = ("schedules", "pipeline", "splitgrad", "parallel", "launch")  # below viz


def test_data_is_shown_by_viz_without_importing_it_first() -> None:
    code = (
        "import json, sys\n"
        "import zbkit.schedules, zbkit.pipeline.trace, zbkit.splitgrad\n"
        "assert 'zbkit.viz' not in sys.modules, 'importing data imported viz'\n"
        "from zbkit.schedules import build_schedule, simulate\n"
        "s = build_schedule('zb-h1', pp=2, microbatches=2)\n"
        "page = s._repr_html_()\n"
        "assert 'zbkit.viz' in sys.modules, 'showing a schedule did not import viz'\n"
        "print(json.dumps([page, simulate(s)._repr_html_()]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    # the pages the first display drew are the ones this process (viz imported) draws
    schedule = build_schedule("zb-h1", pp=2, microbatches=2)
    page, sim_page = json.loads(out.stdout)
    assert page == schedule._repr_html_() and "<table class='zb-grid'" in page
    assert sim_page == simulate(schedule)._repr_html_() and "bubble rate" in sim_page


def test_a_subclass_shows_as_the_class_it_extends() -> None:
    class Mine(Schedule):  # a learner's own Schedule, with no renderer of its own
        pass

    program = {0: ["0F0", "0F1", "0B0", "0B1"]}
    mine, plain = Mine.from_program(program), Schedule.from_program(program)
    assert type(mine) is Mine
    assert mine._repr_html_() == plain._repr_html_() and ">0B1<" in mine._repr_html_()


def test_no_data_module_imports_viz() -> None:
    offenders = []
    for package in DATA:
        for path in (PACKAGE / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                offenders += [
                    f"{path.relative_to(PACKAGE)}: {n}" for n in names if n.startswith("zbkit.viz")
                ]
    assert not offenders, offenders
