"""What an installer gets: binder's files, `make lab` as root, the light core install, the
`zbkit` command's start-up, the licence in the package metadata.

Each check reads the files a user's tools read (pyproject.toml, binder/, the Makefile) or runs
a fresh interpreter, so that what this process has already imported cannot hide a problem.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]

# the notebook stack: never imported by the core packages, never in the core install
NOTEBOOK_MODULES = ["IPython", "ipykernel", "ipywidgets", "jedi", "jupyterlab", "matplotlib"]


def cpu_index() -> str:
    """The CPU wheel index tools/install_torch.py tries first (what `make setup` runs)."""
    script = (ROOT / "tools" / "install_torch.py").read_text()
    match = re.search(r'^CPU_INDEX = "(.+)"$', script, re.M)
    assert match, "tools/install_torch.py: no CPU_INDEX"
    return match.group(1)


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


# --- binder/: what repo2docker reads ---------------------------------------------------------

BINDER_FILES = {"apt.txt", "postBuild", "requirements.txt", "runtime.txt"}


def binder_python() -> str:
    """The Python version binder/runtime.txt names ("3.11")."""
    text = (BINDER / "runtime.txt").read_text().strip()
    match = re.fullmatch(r"python-(\d+\.\d+)", text)
    assert match, f"binder/runtime.txt: {text!r}, expected repo2docker's form 'python-3.11'"
    return match.group(1)


def binder_requirements() -> tuple[list[str], list[Requirement]]:
    """binder/requirements.txt as (pip options, requirements)."""
    options, reqs = [], []
    for line in (BINDER / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-"):
            options.append(line)
        elif line:
            reqs.append(Requirement(line))
    return options, reqs


def postbuild_installs() -> list[list[str]]:
    """The arguments after `pip install` on each line of binder/postBuild."""
    installs = []
    for line in (BINDER / "postBuild").read_text().splitlines():
        words = shlex.split(line, comments=True)
        if "pip" in words and "install" in words[words.index("pip") :]:
            installs.append(words[words.index("install") + 1 :])
    return installs


def test_every_binder_file_is_checked() -> None:
    found = {p.name for p in BINDER.iterdir()}
    assert found == BINDER_FILES, (
        f"binder/ holds {sorted(found)}; this test checks {sorted(BINDER_FILES)}: "
        "add a check for the new file here"
    )


def test_binder_python_satisfies_requires_python() -> None:
    # without runtime.txt repo2docker picks its default Python (3.10), which zbkit refuses
    requires = SpecifierSet(PROJECT["requires-python"])
    assert Version(binder_python()) in requires, (
        f"binder/runtime.txt names Python {binder_python()}; pyproject requires {requires}"
    )


def test_binder_torch_is_the_pinned_cpu_wheel() -> None:
    options, reqs = binder_requirements()
    # the default PyPI wheel for Linux is a multi-GB CUDA build; the index `make` tries first
    assert f"--extra-index-url {cpu_index()}" in options, options
    (torch,) = [r for r in reqs if r.name == "torch"]
    pinned = Requirement(makefile_var("TORCH"))  # what `make` installs and the tests run on
    assert str(torch.specifier) == str(pinned.specifier), (
        f"binder pins {torch}, the Makefile installs {pinned}"
    )
    version = next(iter(torch.specifier)).version
    core_torch = next(Requirement(d) for d in PROJECT["dependencies"] if d.startswith("torch"))
    assert version in core_torch.specifier, f"binder's torch {version}; pyproject: {core_torch}"
    others = [r.name for r in reqs if r.name != "torch"]
    assert not others, f"binder/requirements.txt: {others} belong in pyproject's extras"


def test_binder_installs_zbkit_with_the_notebook_extra() -> None:
    post = BINDER / "postBuild"
    assert os.access(post, os.X_OK), "binder/postBuild must be executable"
    lines = post.read_text().splitlines()
    assert lines[0].startswith("#!") and "set -e" in lines, "postBuild: a shebang and set -e"
    installs = postbuild_installs()
    assert any("-e" in args and ".[notebook,exact]" in args for args in installs), (
        f"postBuild installs {installs}; expected `pip install -e '.[notebook,exact]'` "
        "(notebook 04 solves a small schedule exactly)"
    )
    assert "notebook" in PROJECT["optional-dependencies"]


def test_binder_apt_has_graphviz() -> None:
    packages = (BINDER / "apt.txt").read_text().split()
    assert "graphviz" in packages, "draw_graph renders with Graphviz's `dot`"


def test_binder_requirements_install_in_a_fresh_venv(tmp_path: Path) -> None:
    version = binder_python()
    python = shutil.which(f"python{version}")
    if python is None:
        pytest.skip(f"no python{version} on PATH: binder's files were checked, not installed")
    if os.environ.get("ZBKIT_TEST_BINDER_INSTALL") != "1":
        pytest.skip(
            "resolving torch and the notebook stack from the internet takes minutes: "
            "binder's files were checked against pyproject, not installed "
            "(ZBKIT_TEST_BINDER_INSTALL=1 runs it)"
        )
    try:
        socket.create_connection(("download.pytorch.org", 443), timeout=3).close()
    except OSError as e:
        pytest.skip(f"download.pytorch.org unreachable ({e}): binder's files were not installed")
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", "--without-pip", venv], check=True)
    # what repo2docker does: requirements.txt, then postBuild's install; --dry-run: resolve only
    cmd = [sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install"]
    cmd += ["--dry-run", "--retries", "0", "-r", BINDER / "requirements.txt"]
    for args in postbuild_installs():
        cmd += [a for a in args if a != "--no-cache-dir"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Would install" in done.stdout


# --- make lab as root -------------------------------------------------------------------------


def lab_command(fake_uid: str | None, tmp_path: Path) -> str:
    """The `jupyter lab` line `make -n lab` would run, as `id -u` = fake_uid (or as we are)."""
    env = dict(os.environ)
    if fake_uid is not None:
        fake = tmp_path / f"uid{fake_uid}"
        fake.mkdir()
        (fake / "id").write_text(f"#!/bin/sh\necho {fake_uid}\n")
        (fake / "id").chmod(0o755)
        env["PATH"] = f"{fake}{os.pathsep}{env['PATH']}"
    done = subprocess.run(
        ["make", "-n", "lab"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if "jupyter lab" in x]
    return line


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")
def test_make_lab_allows_root_only_as_root(tmp_path: Path) -> None:
    as_us = lab_command(None, tmp_path)
    assert ("--allow-root" in as_us) == (os.geteuid() == 0), as_us
    assert "--allow-root" in lab_command("0", tmp_path)
    assert "--allow-root" not in lab_command("1000", tmp_path)


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
    # numpy: torch imports it, and warns "Failed to initialize NumPy" on every import without it
    assert core == {"torch", "numpy", "cloudpickle", "graphviz"}, core
    extras = PROJECT["optional-dependencies"]
    notebook = {Requirement(d).name.lower() for d in extras["notebook"]}
    assert {"matplotlib", "ipython", "ipywidgets", "ipykernel"} <= notebook, notebook
    # make test needs the notebook stack, CP-SAT and (tests/docs builds the site) Sphinx
    assert "zbkit[notebook,exact,docs]" in extras["dev"], extras["dev"]
    assert extras["exact"] == ["ortools>=9.10"]  # the exact solver's one dependency


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
