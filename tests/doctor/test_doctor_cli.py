"""`zbkit doctor module:function`: the real command on a setup file (a trap: exit 1 and the
trap named; the fix: exit 0), then each bad input refused with exit 2 and a message that says
what to do. Two subprocesses (each imports torch); the rest calls `zbkit.cli.main` here."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import zbkit.doctor
from zbkit.cli import main

NAME = "doctor_cli_setups"  # the setup file's module name, unique among the tests
SETUPS = textwrap.dedent("""
    import torch
    import torch.utils.checkpoint as checkpoint
    from torch import nn

    import zbkit.doctor
    from zbkit.schedules import build_schedule

    NOT_A_FUNCTION = 3


    class Checkpointed(nn.Module):
        def __init__(self, reentrant):
            super().__init__()
            self.block = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
            self.reentrant = reentrant

        def forward(self, x):
            return checkpoint.checkpoint(self.block, x, use_reentrant=self.reentrant)


    def _setup(reentrant):
        torch.manual_seed(0)
        stages = [nn.Sequential(nn.Linear(4, 4), nn.Tanh()), Checkpointed(reentrant)]
        x, y = torch.randn(8, 4), torch.randn(8, 4)
        schedule = build_schedule("zb-h1", pp=2, microbatches=4)
        return dict(stages=stages, schedule=schedule, inputs=x, target=y,
                    loss_fn=nn.functional.mse_loss)


    def reentrant():
        return _setup(True)


    def fixed():
        return _setup(False)


    def report():
        return zbkit.doctor.check(**_setup(True))


    def broken():
        raise ValueError("boom")


    def returns_tuple():
        return _setup(False)["stages"], _setup(False)["schedule"]


    def returns_nothing():
        _setup(False)


    def needs_args(batch, seed=0):
        return _setup(False)


    def no_schedule():
        return {"stages": _setup(False)["stages"]}


    def unknown_key():
        return {**_setup(False), "loss": None}


    def refused():
        return {**_setup(False), "runtime": "jax"}
""")


@pytest.fixture
def setups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The setup file; sys.path and sys.modules as they were afterwards (the command, run
    here, puts the file's folder on the path and imports it)."""
    path = tmp_path / f"{NAME}.py"
    path.write_text(SETUPS)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield path
    for name in (NAME, f"_doctor_{NAME}", "doctor_cli_broken", "doctor_cli_imports"):
        sys.modules.pop(name, None)


def doctor(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m zbkit doctor ...`: the command a user types, in a fresh process."""
    cmd = [sys.executable, "-m", "zbkit", "doctor", *args]
    # minutes: the command must finish, and the machine may be busy
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_a_trap_exits_1_and_is_named(setups: Path) -> None:
    done = doctor(f"{NAME}:reentrant", cwd=setups.parent)  # a module next to you, as python -m
    assert done.returncode == 1, done.stderr
    assert "[reentrant-checkpoint] stage 1 (rank 1)" in done.stdout, done.stdout
    assert "use_reentrant=False" in done.stdout and done.stderr == ""


def test_a_correct_setup_exits_0(setups: Path) -> None:
    done = doctor(f"{setups}:fixed", cwd=Path(__file__).parent)  # a file, from elsewhere
    assert done.returncode == 0, done.stderr
    assert "zb-h1 (pp=2, 2 stages, 4 microbatches)" in done.stdout
    assert "no findings" in done.stdout, done.stdout


def test_json_lists_the_findings_fields(setups: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["doctor", "--json", f"{setups}:reentrant"]) == 1
    (finding,) = json.loads(capsys.readouterr().out)
    assert list(finding) == [f.name for f in dataclasses.fields(zbkit.doctor.Finding)]
    assert finding["trap"] == "reentrant-checkpoint" and finding["stage"] == 1
    assert main(["doctor", "--json", f"{setups}:fixed"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_a_report_returned_is_printed(setups: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["doctor", f"{setups}:report"]) == 1
    assert "[reentrant-checkpoint]" in capsys.readouterr().out


def test_a_module_importable_from_the_current_directory(
    setups: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(setups.parent)
    assert main(["doctor", f"{NAME}:fixed"]) == 0
    assert "no findings" in capsys.readouterr().out
    (setups.parent / "doctor_cli_imports.py").write_text("import no_such_module_zbkit\n")
    assert main(["doctor", "doctor_cli_imports:f"]) == 2  # found; what it imports is not
    err = capsys.readouterr().err
    assert "importing doctor_cli_imports raised ModuleNotFoundError" in err, err


BAD = {  # target (FILE: the setup file) -> what stderr must say
    "no colon": (NAME, ["is not module:function", "path/to/my_setup.py:pipeline"]),
    "no module": ("no_such_module_zbkit:f", ["no module named 'no_such_module_zbkit'",
                                             "path/to/file.py:function"]),
    "no file": ("missing/setup.py:f", ["no file missing/setup.py"]),
    "not a name": ("my-setup:f", ["neither a module name", ".py file"]),
    "no function": ("FILE:nope", ["has no function 'nope'", "fixed, needs_args"]),
    "not callable": ("FILE:NOT_A_FUNCTION", ["is an int: 3, not a function"]),
    "needs arguments": ("FILE:needs_args", ["takes arguments (batch)", "with none"]),
    "raised": ("FILE:broken", ["broken() raised ValueError: boom", "in broken"]),
    "a tuple": ("FILE:returns_tuple", ["returned a tuple: ([Sequential(", "must return a dict"]),
    "None": ("FILE:returns_nothing", ["returned None; it must return a dict", "Report"]),
    "no schedule": ("FILE:no_schedule", ["a dict with no 'schedule'", "check takes stages,"]),
    "unknown key": ("FILE:unknown_key", ["unknown key(s) 'loss'", "loss_fn"]),
    "check refused": ("FILE:refused", ["check refused", "runtime must be one of"]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_exits_2_saying_what_to_do(
    case: str, setups: Path, capsys: pytest.CaptureFixture
) -> None:
    target, says = BAD[case]
    assert main(["doctor", target.replace("FILE", str(setups))]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("zbkit doctor: "), err
    for text in says:
        assert text in err, err


def test_a_file_that_fails_to_import(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "doctor_cli_broken.py").write_text("x = 1\nraise RuntimeError('half-built')\n")
    assert main(["doctor", f"{tmp_path}/doctor_cli_broken.py:f"]) == 2
    err = capsys.readouterr().err
    assert "raised RuntimeError: half-built" in err and "line 2" in err, err
    assert "doctor_cli_broken" not in sys.modules  # no half-imported module left behind


def test_no_target_is_argparses_error(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        main(["doctor"])
    assert info.value.code == 2
    assert "the following arguments are required: module:function" in capsys.readouterr().err
