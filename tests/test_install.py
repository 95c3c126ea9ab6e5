"""What an installer gets: binder's files, `make lab` as root, the light core install, the
`zbkit` command's start-up, the licence in the package metadata.

Each check reads the files a user's tools read (pyproject.toml, binder/, the Makefile) or runs
a fresh interpreter, so that what this process has already imported cannot hide a problem.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]

# the notebook stack: never imported by the core packages, never in the core install
NOTEBOOK_MODULES = ["IPython", "ipykernel", "ipywidgets", "jedi", "jupyterlab", "matplotlib"]


def run_python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def makefile_var(name: str) -> str:
    match = re.search(rf"^{name} \?= (.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert match, f"Makefile: no `{name} ?= ...` line"
    return match.group(1).strip()


# --- the zbkit command: fast, versioned, runnable as a module ---------------------------------


def test_schedule_command_imports_no_torch() -> None:
    code = (
        "import sys\nfrom zbkit.cli import main\n"
        "assert main(['schedule', '1f1b', '--pp', '2', '-m', '4']) == 0\n"
        "heavy = sorted(m for m in ('torch', 'numpy', 'zbkit.demo') if m in sys.modules)\n"
        "print('imported:', heavy)\n"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "imported: []"


def test_python_m_zbkit_runs_the_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "zbkit", "schedule", "1f1b", "--pp", "2", "-m", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Schedule('1f1b', pp=2")


def test_version_comes_from_the_package_metadata() -> None:
    import zbkit

    installed = importlib.metadata.version("zbkit")
    assert zbkit.__version__ == installed == PROJECT["version"]
    done = subprocess.run(
        [sys.executable, "-m", "zbkit", "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"zbkit {installed}"


def test_every_subcommand_still_lists_its_options() -> None:
    from zbkit.cli import _COMMANDS

    for name in _COMMANDS:
        done = subprocess.run(
            [sys.executable, "-m", "zbkit", name, "--help"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert f"usage: zbkit {name} [-h] [--" in done.stdout, done.stdout
