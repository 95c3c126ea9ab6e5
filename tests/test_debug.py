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
# the watchdog's timeout also bounds the waits before the deadlock (the first step's schedule
# and shape agreement), which must succeed: 15 s leaves a busy machine room
ENV = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "ZBKIT_DEBUG_TIMEOUT": "15"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multiprocess
def test_a_deadlocked_torchrun_job_reports_every_rank_and_exits(tmp_path: Path) -> None:
    # zbkit.debug_demo (shipped, so notebook 08 runs it from any install; run from a folder
    # with no zbkit in it): rank 1 skips the send of microbatch 0's gradient; rank 0 then
    # waits at 0B0 and rank 1 at 1F1 (for activations rank 0 sends after 0B0)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(free_port()), "--log-dir", str(tmp_path), "--redirects", "3",
           "-m", "zbkit.debug_demo"]  # fmt: skip
    began = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV, cwd=tmp_path)
    took = time.monotonic() - began
    assert done.returncode != 0, done.stdout + done.stderr
    assert re.search(r"exitcode\s*:\s*3", done.stderr), done.stderr  # torchrun's summary
    logs = {int(p.parent.name): p.read_text() for p in tmp_path.rglob("stderr.log")}
    assert sorted(logs) == [0, 1], sorted(tmp_path.rglob("*"))
    # the watchdog ended it (after 5 s), not the runner's own 120 s timeout: a rank reports a
    # live wait (the other's wait then fails at once, its connection closed)
    live = [r for r, text in logs.items() if f"=== zbkit.debug: rank {r}: waited " in text]
    assert live, f"no watchdog report; the job took {took:.0f} s\n{logs}"
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


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("skipped", "mark", "line"),
    [
        # torch's first step sets its stages up (a P2P vote with rank 1) before any action
        (1, "0F0", "rank 0 waits before 0F0 (torch's Schedule1F1B, position 0: the step's "
                   "first action; none started yet)"),
        # a later step: rank 0's two warm-up forwards ran; its backward of microbatch 0 waits
        (2, "0B0", "rank 0 waits before 0B0 (torch's Schedule1F1B, position 2: the next action; "
                   "2 of this step's actions finished, the last 0F1)"),
    ],
)  # fmt: skip
def test_a_hung_torch_schedule1f1b_job_marks_the_action_rank_0_waits_on(
    tmp_path: Path, skipped: int, mark: str, line: str
) -> None:
    # tests/debug_torch_job.py: torch's PipelineStage + Schedule1F1B, pp=2, m=4; rank 1 does
    # not call schedule.step at step `skipped` (it sleeps); both install(schedule=...)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(free_port()), "--log-dir", str(tmp_path), "--redirects", "3",
           str(HERE / "debug_torch_job.py")]  # fmt: skip
    began = time.monotonic()
    env = {**ENV, "ZBKIT_SKIP_STEP": str(skipped)}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    took = time.monotonic() - began
    assert done.returncode != 0, done.stdout + done.stderr
    assert re.search(r"exitcode\s*:\s*3", done.stderr), done.stderr  # torchrun's summary
    logs = {int(p.parent.name): p.read_text() for p in tmp_path.rglob("stderr.log")}
    assert sorted(logs) == [0, 1], sorted(tmp_path.rglob("*"))
    zero, one = logs[0], logs[1]
    # the watchdog (after 5 s), not a signal nor gloo's own 30 minutes
    assert "=== zbkit.debug: rank 0: waited " in zero, f"the job took {took:.0f} s\n{zero}"
    assert 'torch/distributed/pipelining/schedules.py", line' in zero, zero  # its stack
    assert line in zero, zero
    marked = [row for row in zero.splitlines() if "<-- WAITING HERE" in row]
    assert len(marked) == 1 and marked[0].startswith("rank 0 "), zero
    assert f"[{mark}]" in marked[0], marked  # torch's rank 0 was about to run it
    assert "=== zbkit.debug: rank 0 exits with code 3 ===" in zero, zero
    # rank 1, woken by torchrun's SIGTERM when rank 0 exits: its stack, no mark
    assert "=== zbkit.debug: rank 1: stopped by SIGTERM" in one, one
    assert "in main\n    time.sleep(600)" in one, one
    assert f"rank 1 is not in a step of torch's Schedule1F1B ({skipped - 1} finished)" in one
    assert "<-- WAITING HERE" not in one, one
    assert "=== zbkit.debug: rank 1 exits with code 3 ===" in one, one


def test_torch_runtime_schedules_are_counted_by_position() -> None:
    # torch's ZBV runtime on one gloo rank (its V: stages 0 and 1 on rank 0); a forward hook
    # on stage 1's module reads the report while each of its forwards runs
    done = run_script(
        "import os, torch, torch.distributed as dist\n"
        "from torch import nn\n"
        "from torch.distributed.pipelining import PipelineStage, ScheduleZBVZeroBubble\n"
        "import zbkit.debug\n"
        f"os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT='{free_port()}')\n"
        "dist.init_process_group('gloo', rank=0, world_size=1)\n"
        "mods = [nn.Linear(4, 4), nn.Linear(4, 4)]\n"
        "stages = [PipelineStage(m, i, 2, torch.device('cpu')) for i, m in enumerate(mods)]\n"
        "torch_schedule = ScheduleZBVZeroBubble(stages, 4, loss_fn=nn.functional.mse_loss)\n"
        "dog = zbkit.debug.install(timeout=60, schedule=torch_schedule)\n"
        "def hook(module, args, out):\n"
        "    if dog.torch.running is not None:  # not torch's shape inference\n"
        "        print(dog.torch.report([]), flush=True)\n"
        "mods[1].register_forward_hook(hook)\n"
        "for _ in range(2):\n"
        "    torch_schedule.step(torch.randn(8, 4), target=torch.randn(8, 4))\n"
        "    print(dog.torch.finished, dog.torch.steps, dog.torch.stepping)\n"
        "print(dog.torch.report([]))\n"
        "dog.uninstall()\n"
        "print(sorted(stages[0].__dict__.keys() & {'forward_one_chunk', 'backward_one_chunk'}),"
        " 'step' in torch_schedule.__dict__)\n"
        "dist.destroy_process_group()\n"
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    program = ("0F0 1F0 1I0 1W0 0F1 0I0 0W0 1F1 1I1 1W1 0F2 0I1 0W1 1F2 1I2 1W2 0F3 0I2 0W2 "
               "1F3 1I3 1W3 0I3 0W3").split()  # fmt: skip
    for mb in range(4):  # each line twice: counted afresh at each step
        position = program.index(f"1F{mb}")
        line = (f"rank 0 waits in 1F{mb} (torch's ScheduleZBVZeroBubble, position "
                f"{position}: started, not finished)")  # fmt: skip
        assert out.count(line) == 2, out
        assert out.count(f"[1F{mb}]") == 2, out
    assert "\n24 1 False\n" in out and "\n24 2 False\n" in out, out  # all 24, each step
    assert "rank 0 is not in a step of torch's ScheduleZBVZeroBubble (2 finished)" in out
    assert out.rstrip().endswith("[] False"), out  # uninstall put torch's methods back


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
    with pytest.raises(TypeError, match="a torch.distributed.pipelining schedule object"):
        zbkit.debug.install(timeout=30, schedule="1f1b")
    assert (sys.excepthook, zbkit.debug.Watchdog.active) == (hooks[0], None)
