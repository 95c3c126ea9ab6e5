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

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

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


# --- the light install: the core imports no notebook stack ------------------------------------

# A fresh interpreter in which the notebook stack is not installed: every import of it fails
# as a missing module does. Then the core packages are imported and used.
WITHOUT_NOTEBOOK_STACK = """
import importlib.abc, sys

BLOCKED = set(sys.argv[1].split(","))

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
"""

CORE_RUN = """
import torch
from torch import nn

import zbkit
import zbkit.launch, zbkit.parallel, zbkit.splitgrad
from zbkit.pipeline import LocalPipeline
from zbkit.schedules import build_schedule, simulate

schedule = build_schedule("zb-h1", pp=2, microbatches=4)
assert simulate(schedule).makespan > 0

class First(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return {"x": torch.tanh(self.lin(x))}

class Last(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 1)

    def forward(self, x):
        return {"y": self.lin(x)}

mods = [First(), Last()]
loss_fn = lambda out, target: torch.nn.functional.mse_loss(out["y"], target)
losses = LocalPipeline(mods, schedule, loss_fn).step(torch.randn(8, 4), torch.randn(8, 1))
assert len(losses) == 4
assert all(p.grad is not None for m in mods for p in m.parameters())

# the graphviz drawing needs no notebook stack either
from zbkit.viz import draw_graph
from zbkit.splitgrad import analyze
x = torch.randn(2, 4, requires_grad=True)
assert "digraph" in draw_graph(analyze([mods[0](x)["x"].sum()], [x], mods[0])).source

loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not loaded, loaded
print("core ok")
"""


def test_core_dependencies_leave_out_the_notebook_stack() -> None:
    core = {Requirement(d).name.lower() for d in PROJECT["dependencies"]}
    assert core == {"torch", "cloudpickle", "graphviz"}, core
    extras = PROJECT["optional-dependencies"]
    notebook = {Requirement(d).name.lower() for d in extras["notebook"]}
    assert {"matplotlib", "ipython", "ipywidgets", "ipykernel"} <= notebook, notebook
    assert "zbkit[notebook]" in extras["dev"], "make test needs the notebook stack"


def test_core_packages_run_without_the_notebook_stack() -> None:
    done = run_python(WITHOUT_NOTEBOOK_STACK + CORE_RUN, ",".join(NOTEBOOK_MODULES))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "core ok" in done.stdout


@pytest.mark.parametrize(
    "use, needs",
    [
        ("from zbkit.viz import plot_schedule", "zbkit.viz.plot_schedule needs matplotlib"),
        ("import zbkit; zbkit.viz.plot_memory", "zbkit.viz.plot_memory needs matplotlib"),
        ("import zbkit.viz; zbkit.viz.plot_frontier", "zbkit.viz.plot_frontier needs matplotlib"),
        ("import zbkit.widgets", "zbkit.widgets needs IPython"),
        ("from zbkit import widgets", "zbkit.widgets needs IPython"),
    ],
)
def test_notebook_features_name_the_extra(use: str, needs: str) -> None:
    code = WITHOUT_NOTEBOOK_STACK + f"\ntry:\n    {use}\nexcept ImportError as e:\n    print(e)\n"
    done = run_python(code, ",".join(NOTEBOOK_MODULES))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == f"{needs}: pip install 'zbkit[notebook]'"


def test_widgets_name_ipywidgets_when_only_it_is_missing() -> None:
    code = WITHOUT_NOTEBOOK_STACK + "\ntry:\n    import zbkit.widgets\nexcept ImportError as e:\n"
    done = run_python(code + "    print(e)\n", "ipywidgets")
    assert done.stdout.strip() == "zbkit.widgets needs ipywidgets: pip install 'zbkit[notebook]'"


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


# --- the licence --------------------------------------------------------------------------------


def test_license_is_the_spdx_string_and_the_file_ships() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert PROJECT["license"] == "Apache-2.0"  # PEP 639: a string, not the deprecated table
    assert PROJECT["license-files"] == ["LICENSE"]
    # setuptools reads that form from 77 on; an older build backend would reject it
    (setuptools,) = [
        Requirement(r) for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")
    ]
    assert not any(Version(v) in setuptools.specifier for v in ["68", "76.99"]), setuptools


def test_installed_metadata_carries_the_license() -> None:
    # the metadata pip wrote from pyproject (make's stamp reinstalls when pyproject changes)
    meta = importlib.metadata.metadata("zbkit")
    assert meta["License-Expression"] == "Apache-2.0"
    assert "LICENSE" in (meta.get_all("License-File") or [])
    required = meta.get_all("Requires-Dist") or []
    core = [r for r in required if "extra ==" not in r]
    assert not any(name in r.lower() for r in core for name in ["matplotlib", "ipy"]), core
