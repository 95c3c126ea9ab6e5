"""zbkit.debug.install: a hung torchrun job reports where every rank waits and exits."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import zbkit.debug

HERE = Path(__file__).parent
ENV = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "ZBKIT_DEBUG_TIMEOUT": "5"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multiprocess
def test_a_deadlocked_torchrun_job_reports_every_rank_and_exits(tmp_path: Path) -> None:
    # tests/debug_job.py: rank 1 skips the send of microbatch 0's gradient; rank 0 then
    # waits at 0B0 and rank 1 at 1F1 (for activations rank 0 sends after 0B0)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(free_port()), "--log-dir", str(tmp_path), "--redirects", "3",
           str(HERE / "debug_job.py")]  # fmt: skip
    began = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
    took = time.monotonic() - began
    assert done.returncode != 0, done.stdout + done.stderr
    assert re.search(r"exitcode\s*:\s*3", done.stderr), done.stderr  # torchrun's summary
    assert took < 120, f"the job took {took:.0f} s"  # ~10 s; the runner's own timeout is 120
    logs = {int(p.parent.name): p.read_text() for p in tmp_path.rglob("stderr.log")}
    assert sorted(logs) == [0, 1], sorted(tmp_path.rglob("*"))
    waits = {0: "0B0", 1: "1F1"}
    for rank, text in logs.items():
        assert f"=== zbkit.debug: rank {rank}: " in text, text
        assert f"=== zbkit.debug: rank {rank} exits with code 3 ===" in text, text
        # a stack: the live one (the watchdog) or the failed wait's traceback
        assert 'zbkit/pipeline/runner.py", line' in text and "in step" in text, text
        marked = [line for line in text.splitlines() if "<-- WAITING HERE" in line]
        assert marked, text
        assert all(line.startswith(f"rank {rank} ") for line in marked), marked
        assert all(f"[{waits[rank]}]" in line for line in marked), marked


def run_script(code: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", code]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=ENV)


def test_an_uncaught_comm_timeout_reports_and_exits_3() -> None:
    done = run_script(
        "import zbkit.debug\n"
        "from zbkit.pipeline import CommTimeout\n"
        "zbkit.debug.install(timeout=60)\n"
        "raise CommTimeout('rank 0: gave up after 1 s receiving')\n"
    )
    assert done.returncode == 3, done.stderr
    err = done.stderr
    assert "=== zbkit.debug: rank ?: a wait failed: CommTimeout ===" in err
    assert "CommTimeout: rank 0: gave up after 1 s receiving" in err  # the traceback
    assert "(no schedule known here: pass install(schedule=...) to draw one)" in err
    assert err.rstrip().endswith("=== zbkit.debug: rank ? exits with code 3 ===")


def test_other_errors_pass_through_unchanged() -> None:
    done = run_script("import zbkit.debug\nzbkit.debug.install(timeout=60)\n1 / 0\n")
    assert done.returncode == 1
    assert "ZeroDivisionError" in done.stderr and "zbkit.debug" not in done.stderr


def test_install_and_uninstall_restore_the_hooks() -> None:
    hooks = (sys.excepthook, threading.excepthook)
    dog = zbkit.debug.install(timeout=30)
    try:
        assert sys.excepthook != hooks[0] and zbkit.debug.Watchdog.active is dog
        assert repr(dog) == "Watchdog(timeout=30 s, watching)"
    finally:
        dog.uninstall()
    assert (sys.excepthook, threading.excepthook) == hooks
    assert zbkit.debug.Watchdog.active is None
    with pytest.raises(ValueError, match="timeout must be positive seconds, got 0"):
        zbkit.debug.install(timeout=0)
