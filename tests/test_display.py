"""The display protocol (`zbkit._display`): data classes show themselves in a notebook through
renderers that `zbkit.viz` registers, so no data module imports the drawings.

Oracles: a fresh interpreter's `sys.modules` after importing the data packages (viz absent
until something is shown), the renderers' own output, and the package's import statements.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import zbkit

PACKAGE = Path(zbkit.__file__).parent
DATA = ("schedules", "pipeline", "splitgrad", "parallel", "launch")  # below viz


def test_data_is_shown_by_viz_without_importing_it_first() -> None:
    code = (
        "import sys\n"
        "import zbkit.schedules, zbkit.pipeline.trace, zbkit.splitgrad\n"
        "assert 'zbkit.viz' not in sys.modules, 'importing data imported viz'\n"
        "from zbkit.schedules import build_schedule, simulate\n"
        "s = build_schedule('zb-h1', pp=2, microbatches=2)\n"
        "page = s._repr_html_()\n"
        "assert 'zbkit.viz' in sys.modules\n"
        "from zbkit.viz._html import schedule_html, simulation_html\n"
        "assert page == schedule_html(s)\n"
        "sim = simulate(s)\n"
        "assert sim._repr_html_() == simulation_html(sim)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_class_without_a_renderer_is_named() -> None:
    from zbkit._display import show

    with pytest.raises(LookupError, match="no 'html' form for int"):
        show(3)


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
