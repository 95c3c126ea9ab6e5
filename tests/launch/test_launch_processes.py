"""launch() and Cluster with real rank processes (gloo on CPU).

Each test starts few process groups and checks many things per start: on 2 shared
cores one start costs seconds.
"""

import base64
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import cloudpickle
import pytest

from zbkit.launch import Cluster, LaunchError, launch

# Ship this module's functions by value, as cloudpickle does for a notebook's functions
# (the ranks then need not import this test module, nor pytest).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.multiprocess


def listening_addresses():
    import psutil

    conns = psutil.Process().net_connections(kind="inet")
    return sorted({c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN})


def rank_report(offset):
    """All-reduce (rank + offset) and report what a rank sees of its environment."""
    import torch
    import torch.distributed as dist

    from zbkit.parallel import get_rank, get_world_size, init_distributed

    assert init_distributed() is True  # zbkit.parallel sees the group launch created
    t = torch.tensor([float(dist.get_rank() + offset)])
    dist.all_reduce(t)
    sys.stdout.write("partial ")  # one line written in pieces still prints whole
    sys.stdout.flush()
    print(f"line from {get_rank()} of {get_world_size()} " + "x" * 2000)
    print(f"to stderr {dist.get_rank()}", file=sys.stderr)
    env = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    return {"sum": t.item(), "env": env, "addr": os.environ["MASTER_ADDR"],
            "listen": listening_addresses()}  # fmt: skip


def test_launch_four_ranks_results_output_env_and_busy_port(
    capsys, monkeypatch, live_children
):  # fmt: skip
    with socket.socket() as busy:  # an inherited MASTER_PORT that is taken must not matter
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        monkeypatch.setenv("MASTER_PORT", str(busy.getsockname()[1]))
        offset = 10
        results = launch(lambda: rank_report(offset), nprocs=4)  # a closure, by value
    out, err = capsys.readouterr()
    assert [r["sum"] for r in results] == [sum(range(4)) + 4 * offset] * 4  # closed form
    for rank, r in enumerate(results):  # results in rank order
        assert r["env"] == {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "4",
                            "LOCAL_WORLD_SIZE": "4"}  # fmt: skip
        assert r["addr"] == "127.0.0.1"
        assert r["listen"] and set(r["listen"]) == {"127.0.0.1"}  # store and gloo: loopback only
        assert f"[rank {rank}] partial line from {rank} of 4 {'x' * 2000}\n" in out
        assert f"[rank {rank}] to stderr {rank}\n" in err
    assert all(line.startswith("[rank ") for line in out.splitlines())  # never mixed in a line
    assert live_children() == []


def fail_on_one(bad_rank):
    import torch.distributed as dist

    if dist.get_rank() == bad_rank:
        raise ValueError(f"bad input on rank {bad_rank}")
    dist.barrier()  # the others wait here for the rank that failed


def die(rank_to_signal):
    import signal

    import torch.distributed as dist

    dist.barrier()  # everyone is past init: a peer leaving early can't fail a rendezvous
    if dist.get_rank() == rank_to_signal:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)  # rank 1 dies first; rank 0 follows within the launcher's grace period
    os._exit(3)


def stuck_here():
    time.sleep(600)


def hang_on_zero():
    import torch.distributed as dist

    if dist.get_rank() == 0:
        stuck_here()
    dist.barrier()


def test_launch_failures_raise_name_ranks_and_leave_nothing(live_children):
    start = time.monotonic()
    assert launch(lambda: 7, nprocs=2) == [7, 7]
    startup = time.monotonic() - start  # on this machine, now
    with pytest.raises(LaunchError) as info:  # a result that cannot travel back: named
        launch(lambda: 7 if os.environ["RANK"] == "0" else threading.Lock(), nprocs=2)
    assert str(info.value).startswith(
        "launch failed on rank 1.\n--- rank 1: status ---\nrank 1: TypeError: the result is a "
        "_thread.lock, which cannot be pickled to travel back to the caller"
    )
    assert live_children() == []

    with pytest.raises(LaunchError) as info:
        launch(fail_on_one, 1, nprocs=2)  # each failing launch below also starts fine
    msg = str(info.value)
    assert msg.startswith("launch failed on rank 1; rank 0 did not finish (stopped)")
    assert "ValueError: bad input on rank 1" in msg
    assert 'raise ValueError(f"bad input on rank {bad_rank}")' in msg  # source line shown
    assert info.value.ranks == [1]
    assert live_children() == []

    with pytest.raises(LaunchError) as info:
        launch(die, 1, nprocs=2)
    assert "rank 0: status ---\ndied without a Python exception: exit code 3" in str(info.value)
    assert "rank 1: status ---\ndied without a Python exception: killed by SIGKILL" in str(
        info.value
    )
    assert live_children() == []

    # the expected timeout, on one clock with the start that must succeed first (both ranks
    # inside fn, or their stacks show start-up): a few starts' worth, measured on this machine
    timeout = max(20.0, 3 * startup)
    with pytest.raises(LaunchError) as info:
        launch(hang_on_zero, nprocs=2, timeout=timeout)
    msg = str(info.value)
    assert msg.startswith(f"launch timed out after {timeout:g} s: ranks 0, 1 still running")
    rank0, rank1 = msg.split("--- rank 1: stack ---")
    assert "in stuck_here\n    time.sleep(600)" in rank0
    assert "in hang_on_zero\n    dist.barrier()" in rank1
    assert live_children() == []


def pipeline_fails_on_rank_1(how: str = "raises"):
    """Rank 1's stage fails at its first forward while rank 0 waits for its gradient: it
    raises, and tears its process group down on the way out as a torchrun script's finally
    does ("raises"), or its process ends telling no one, as a killed one ("dies")."""
    import os

    import torch
    import torch.distributed as dist
    from torch import nn

    from zbkit.pipeline import PipelineStage, ScheduleRunner
    from zbkit.schedules import build_schedule

    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            if dist.get_rank() == 1 and how == "dies":
                os._exit(7)  # no error, no word to the peers
            if dist.get_rank() == 1:
                raise ValueError("bad microbatch on rank 1")
            return {"x": self.lin(x)}

    rank = dist.get_rank()
    schedule = build_schedule("1f1b", pp=2, microbatches=4)
    runner = ScheduleRunner(schedule, PipelineStage(Stage(), rank, 2),
                            lambda out, y: (out["x"] - y).pow(2).mean(), timeout=60)  # fmt: skip
    x = torch.ones(8, 4)
    try:
        runner.step(x if rank == 0 else None, targets=x if rank == 1 else None)
    finally:
        if rank == 1:
            dist.destroy_process_group()  # closes its connections


def test_the_rank_that_failed_first_is_listed_first_and_echoes_are_not_timeouts(live_children):
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(pipeline_fails_on_rank_1, nprocs=2, timeout=120)
    msg = str(info.value)
    assert time.monotonic() - start < 100  # not the runner's 60 s timeout
    head, first, second = msg.split("--- rank ")
    assert head == "launch failed on rank 1; then rank 0 failed waiting on another rank.\n"
    assert first.startswith("1: traceback ---") and "ValueError: bad microbatch on rank 1" in first
    assert second.startswith("0: traceback ---")
    assert "gave up after" not in second  # it did not wait 60 s: rank 1 told it why
    echo = ("rank 0: rank 1 failed and told this rank, receiving the output gradients of "
            "stage 0 microbatch 0 from rank 1, which 0B0 needs. Its error: StageError on "
            "rank 1: stage 1 microbatch 0: the module's forward raised ValueError: bad "
            "microbatch on rank 1")  # fmt: skip
    assert echo in " ".join(second.split()), second
    assert list(info.value.tracebacks) == [1, 0]  # causes first there too
    assert live_children() == []


def test_a_peer_that_dies_silently_is_a_closed_connection_not_a_timeout(live_children):
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(pipeline_fails_on_rank_1, "dies", nprocs=2, timeout=120)
    msg = " ".join(str(info.value).split())
    assert time.monotonic() - start < 100, msg  # not the runner's 60 s timeout
    assert "gave up after" not in msg, msg
    echo = ("rank 0: the connection to rank 1 failed while receiving the output gradients of "
            "stage 0 microbatch 0 from rank 1, which 0B0 needs (not a timeout)")  # fmt: skip
    assert echo in msg, msg
    assert live_children() == []


def test_cluster_keeps_state_survives_errors_returns_rich_values(capsys, live_children):
    with Cluster(nprocs=2) as c:
        assert c.exec("x = rank * 2\nprint('set', x)") == [None, None]
        assert c.exec("x + 1") == [1, 3]  # REPL: the last expression, per rank
        assert c.exec("x", ranks=[1]) == [2]
        with pytest.raises(TypeError, match=r"ranks must be a list of ints such as \[0, 1\]"):
            c.exec("x", ranks=1)
        with pytest.raises(TypeError, match="timeout must be a number of seconds"):
            c.exec("x", timeout="5")
        assert c.run(lambda a, b=0: a + b, 5, b=1) == [6, 6]
        assert c.exec("t = torch.ones(2) * (rank + 1)\ndist.all_reduce(t)\nt.tolist()") == [
            [3.0, 3.0],
            [3.0, 3.0],
        ]

        with pytest.raises(LaunchError) as info:
            c.exec("y = 10 // (1 - rank)")  # rank 1 divides by zero, rank 0 finishes
        msg = str(info.value)
        assert "failed on rank 1" in msg and "ZeroDivisionError" in msg
        assert "y = 10 // (1 - rank)" in msg  # the cell's source in the traceback
        assert "still usable" in msg
        assert c.exec("(x, y) if rank == 0 else x") == [(0, 10), 2]  # state kept

        cell = (
            "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([0, rank])\n"
            "fig if rank == 0 else (i for i in range(3))"
        )
        with pytest.raises(LaunchError) as info:  # a generator is no result to compute with
            c.exec(cell)
        msg = str(info.value)
        assert msg.startswith("Cluster call failed on rank 1.") and "still usable" in msg
        assert "rank 1: TypeError: the result is a generator, which cannot be pickled" in msg
        fig, gen = c.exec(cell, display=True)  # what %%zb asks for: something to show
        png = base64.b64decode(fig._repr_mimebundle_()["image/png"])  # rank 0's figure, drawn
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert "generator object" in gen._repr_mimebundle_()["text/plain"]  # rank 1's, as text
        with pytest.raises(LaunchError, match="rank 0: TypeError: the result is a generator"):
            c.run(lambda: (i for i in range(3)))  # launch's path (a CALL) too
        graph = c.exec("import graphviz\ng = graphviz.Digraph()\ng.edge('a', str(rank))\ng")
        assert [g.source for g in graph] == [_digraph(r).source for r in range(2)]

        # the expected timeout; 10 s, as rank 1 must first reach dist.barrier() on a busy machine
        with pytest.raises(LaunchError) as info:
            c.exec("import time\nif rank == 0:\n    time.sleep(600)\ndist.barrier()", timeout=10)
        msg = str(info.value)
        assert "timed out after 10 s: ranks 0, 1 still running" in msg
        assert "time.sleep(600)" in msg and "dist.barrier()" in msg
        assert "must" not in msg or "Start a new one" in msg
        assert c.closed
        with pytest.raises(LaunchError, match="stopped"):
            c.exec("1")
        assert live_children() == []
    out, _ = capsys.readouterr()
    assert "[rank 0] set 0\n" in out and "[rank 1] set 2\n" in out


def _digraph(rank):
    import graphviz

    g = graphviz.Digraph()
    g.edge("a", str(rank))
    return g


def test_cluster_rank_death_stops_it(live_children):
    c = Cluster(nprocs=2)
    with pytest.raises(LaunchError) as info:
        c.run(os._exit, 5)
    assert "died without a Python exception: exit code 5" in str(info.value)
    assert "The cluster has been stopped" in str(info.value)
    assert c.closed and live_children() == []
    c.close()  # closing twice is fine


def exited(pid):
    """Our child `pid` has exited (is waitable), looked at without reaping it (Popen still
    must): a zombie leader thread alone can show while the other threads still exit."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def test_out_stores_the_ranks_values_in_the_notebook_instead_of_showing_them(capsys, live_children):
    from IPython.core.interactiveshell import InteractiveShell

    from zbkit.launch.magics import ZbMagics

    shell = InteractiveShell.instance()
    magics = ZbMagics(shell)
    shell.register_magics(magics)
    shell.run_line_magic("zb_start", "-n 2")
    try:
        capsys.readouterr()
        shell.run_cell_magic("zb", "--out values", "x = {'rank': rank}\nx")
        assert shell.user_ns["values"] == [{"rank": 0}, {"rank": 1}]  # data, in rank order
        shell.run_cell_magic("zb", "--rank 1 --out last", "x['rank'] * 10")
        assert shell.user_ns["last"] == [10]
        assert capsys.readouterr().out == ""  # no "[rank k]" lines: nothing was shown
    finally:
        magics.cluster.close()
    assert live_children() == []


def test_a_rank_that_dies_between_calls_is_reported_by_the_next_one(capsys, live_children):
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    from zbkit.launch.magics import ZbMagics

    shell = InteractiveShell.instance()
    magics = ZbMagics(shell)
    shell.register_magics(magics)
    shell.run_line_magic("zb_start", "-n 2")
    cluster = magics.cluster
    for magic, line, match in (
        ("zb", "--rank 5", r"%%zb: ranks must be distinct ints in 0\.\.1"),
        ("zb", "--rank a", "--rank takes comma-separated ints"),
        ("zb", "--timeout 0", "%%zb: timeout must be a positive number"),
        ("zb_start", "-n 0", "%zb_start: nprocs must be a positive"),
    ):
        with pytest.raises(UsageError, match=match):
            if magic == "zb":
                shell.run_cell_magic(magic, line, "1")
            else:
                shell.run_line_magic(magic, line)
    assert magics.cluster is cluster and not cluster.closed  # a typo costs nothing
    # rank 1 exits on its own a moment after the call returned: the cluster is idle then
    (pid,) = cluster.exec(
        "import os, threading\nthreading.Timer(0.3, os._exit, (7,)).start()\nos.getpid()",
        ranks=[1],
    )
    deadline = time.monotonic() + 60
    while not exited(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert exited(pid), f"rank 1 (pid {pid}) did not exit within 60 s"
    with pytest.raises(LaunchError) as info:
        shell.run_cell_magic("zb", "", "1")  # the next call: was a bare BrokenPipeError
    assert str(info.value) == (
        "rank 1 died (exit code 7) while idle; cluster stopped. "
        "Start a new one (in a notebook: %zb_start -n 2)."
    )
    assert cluster.closed and live_children() == []  # rank 0 was stopped too
    shell.run_line_magic("zb_status", "")
    out = capsys.readouterr().out
    assert "2 ranks, backend='gloo', stopped (rank 1 died (exit code 7) while idle)" in out
    with pytest.raises(LaunchError, match=r"^this cluster is stopped \(rank 1 died"):
        cluster.run(len, "ab")  # every later call says why too
    shell.run_line_magic("zb_stop", "")
    assert "no cluster is running: Cluster(nprocs=2" in capsys.readouterr().out


PARENT = """
import ctypes, os, sys
from zbkit.launch import launch


def stuck(folder):
    path = os.path.join(folder, os.environ["RANK"])
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(path + ".tmp", path)  # there whole, or not at all
    ctypes.PyDLL(None).sleep(600)  # a C call that keeps the GIL: no Python thread runs


launch(stuck, sys.argv[1], nprocs=2)
"""


def rank_running(pid):
    import psutil

    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and "zbkit.launch._worker" in proc.cmdline()
    except psutil.NoSuchProcess:
        return False


def test_ranks_die_with_a_killed_parent_even_inside_a_c_call(tmp_path):
    (tmp_path / "parent.py").write_text(PARENT)
    with open(tmp_path / "parent.err", "w") as err:
        parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py"), str(tmp_path)],
                                  stdout=subprocess.DEVNULL, stderr=err)  # fmt: skip
    files = [tmp_path / "0", tmp_path / "1"]
    deadline = time.monotonic() + 120  # two ranks importing torch on a busy machine
    while not all(f.exists() for f in files) and time.monotonic() < deadline:
        assert parent.poll() is None, (tmp_path / "parent.err").read_text()
        time.sleep(0.1)
    assert all(f.exists() for f in files), "the ranks did not start within 120 s"
    pids = [int(f.read_text()) for f in files]
    try:
        time.sleep(0.5)  # well inside the C call now
        parent.kill()  # SIGKILL: the launcher runs no cleanup of any kind
        parent.wait()
        deadline = time.monotonic() + 120  # at once, but a busy machine may take seconds
        while any(map(rank_running, pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in pids if rank_running(pid)] == []
    finally:
        for pid in pids:  # what a launcher without the parent-death signal leaves behind
            if rank_running(pid):
                os.kill(pid, signal.SIGKILL)
