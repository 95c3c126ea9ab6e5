"""The magics and launch() inside a real Jupyter kernel: outputs land in the right cell,
state persists across cells, an interrupt stops the ranks, nothing is left behind."""

import queue
import time

import psutil
import pytest

pytestmark = pytest.mark.multiprocess

jupyter_client = pytest.importorskip("jupyter_client")


class Kernel:
    def __init__(self):
        self.km = jupyter_client.KernelManager(kernel_name="python3")
        self.km.start_kernel(env={"OMP_NUM_THREADS": "1", "PYDEVD_DISABLE_FILE_VALIDATION": "1"})
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=300)  # a busy machine: minutes

    def run(self, code, timeout=300, expect=(), values=0):
        """Execute one cell; return (reply content, the iopub messages of that cell).

        `expect`: stdout the cell prints. On a busy machine ipykernel may publish a cell's
        stdout after the cell's idle status (its stream flush waits on the IOPub thread, in
        vain past 10 s), so the cell's late messages are read until that text is there (a
        wait that must succeed: minutes). `values`: as many execute_result messages (the
        cell's value) are waited for the same way. A request the kernel aborted (it arrived
        while the kernel still cleared a failed cell) is sent again.
        """
        resend_until = time.monotonic() + timeout
        while True:
            msgs = []
            reply = self.kc.execute_interactive(code, timeout=timeout, output_hook=msgs.append)
            # Right after a cell that failed (an interrupt), ipykernel aborts the requests that
            # reach it before it has finished clearing that cell's queue: the cell never ran,
            # so it is sent again, as a user would run it again.
            if reply["content"]["status"] != "aborted" or time.monotonic() > resend_until:
                break
            time.sleep(0.5)
        cell = reply["parent_header"]["msg_id"]
        deadline = time.monotonic() + timeout

        def done():
            return all(e in text(msgs) for e in expect) and len(results(msgs)) >= values

        while not done() and time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:  # the caller's assertion then shows what did come
                break
            if msg["parent_header"].get("msg_id") == cell:
                msgs.append(msg)
        return reply["content"], msgs

    def interrupt_once_sleeping(self, code):
        """Run a cell whose ranks print 'sleeping' then sleep; press stop; return the reply."""
        msg_id = self.kc.execute(code)
        seen = ""
        deadline = time.monotonic() + 300  # two ranks importing torch on a busy machine
        while seen.count("sleeping") < 2 and time.monotonic() < deadline:
            msg = self.kc.get_iopub_msg(timeout=300)
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
                seen += msg["content"]["text"]
        assert "[rank 0] sleeping" in seen and "[rank 1] sleeping" in seen
        self.km.interrupt_kernel()
        return self.kc.get_shell_msg(timeout=300)["content"]

    def close(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def text(msgs, name="stdout"):
    return "".join(m["content"]["text"] for m in msgs if m["content"].get("name") == name)


def results(msgs, kind="execute_result"):
    return [m["content"]["data"] for m in msgs if m["msg_type"] == kind]


def running(proc):
    """Alive and not a zombie (an orphan's zombie waits for init, which may not reap)."""
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def workers(pid):
    kids = psutil.Process(pid).children(recursive=True)
    return [p for p in kids if p.is_running() and "zbkit.launch._worker" in " ".join(p.cmdline())]


def test_magics_and_launch_in_a_kernel():
    k = Kernel()
    try:
        reply, msgs = k.run("import os, sys; os.getpid(), sys.executable", values=1)
        pid, exe = eval(results(msgs)[0]["text/plain"])
        assert reply["status"] == "ok" and ".venv" in exe

        reply, msgs = k.run("%load_ext zbkit\n%zb_start -n 2", expect=["started 2 ranks (gloo)"])
        assert reply["status"] == "ok", reply
        assert "started 2 ranks (gloo)" in text(msgs)
        assert len(workers(pid)) == 2

        # Output and values per rank, in this cell; state kept for the next one.
        reply, msgs = k.run(
            "%%zb\nx = rank * 10\nprint('hello', rank)\nx",
            expect=["[rank 0] hello 0\n", "[rank 1] hello 1\n", "[rank 0] 0\n", "[rank 1] 10\n"],
        )
        out = text(msgs)
        assert "[rank 0] hello 0\n" in out and "[rank 1] hello 1\n" in out
        assert "[rank 0] 0\n" in out and "[rank 1] 10\n" in out
        reply, msgs = k.run("%%zb --rank 1\nx + 1", expect=["[rank 1] 11\n"])
        assert text(msgs) == "[rank 1] 11\n"

        # A figure on each rank renders as a PNG in the notebook.
        plot = "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([0, rank])\n"
        reply, msgs = k.run("%%zb\n" + plot + "fig")
        pngs = [d for d in results(msgs, "display_data") if "image/png" in d]
        assert reply["status"] == "ok" and len(pngs) == 2

        # An error on one rank: a LaunchError with the rank's traceback; the cluster lives on.
        reply, msgs = k.run("%%zb\nassert rank == 0, 'only rank 0 may pass'")
        assert reply["status"] == "error" and reply["ename"] == "LaunchError"
        assert "AssertionError: only rank 0 may pass" in "\n".join(reply["traceback"])
        reply, msgs = k.run("%%zb\nx", expect=["[rank 1] 10\n"])
        assert "[rank 1] 10\n" in text(msgs)

        reply, msgs = k.run("%zb_status", expect=["2 ranks, backend='gloo', running"])
        assert "2 ranks, backend='gloo', running" in text(msgs)
        reply, msgs = k.run("%zb_stop", expect=["stopped\n"])
        assert text(msgs) == "stopped\n" and workers(pid) == []

        # launch() with a function defined in the notebook: its result comes back.
        define = (
            "from zbkit import launch\n"
            "def total(scale):\n"
            "    import torch, torch.distributed as dist\n"
            "    t = torch.tensor([float(dist.get_rank() + 1)]) * scale\n"
            "    dist.all_reduce(t)\n"
            "    return t.item()\n"
        )
        reply, msgs = k.run(define + "launch(total, 2, nprocs=2)", values=1)
        assert results(msgs)[0]["text/plain"] == "[6.0, 6.0]"

        # The stop button during a launch: ranks stopped, KeyboardInterrupt in the cell.
        sleepy = "def sleepy():\n    print('sleeping', flush=True)\n    time.sleep(600)\n"
        reply = k.interrupt_once_sleeping("import time\n" + sleepy + "launch(sleepy, nprocs=2)")
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
        # one clear line, not the ~40 frames of the wait loop the interrupt landed in
        stopped = "KeyboardInterrupt: launch interrupted; every rank was stopped"
        assert reply["traceback"] == [stopped]
        assert workers(pid) == []

        # The next launch in the same kernel works, and leaves no process behind.
        reply, msgs = k.run("launch(total, 1, nprocs=2)", values=1)
        assert results(msgs)[0]["text/plain"] == "[3.0, 3.0]"
        assert psutil.Process(pid).children(recursive=True) == []

        # The stop button during a %%zb cell: the cluster is stopped and says so.
        reply, msgs = k.run("%zb_start -n 2")
        reply = k.interrupt_once_sleeping("%%zb\nimport time\n" + sleepy + "sleepy()")
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
        stopped = "KeyboardInterrupt: every rank was stopped; %zb_start to start again"
        assert reply["traceback"] == [stopped]
        assert workers(pid) == []
        reply, msgs = k.run("%zb_status", expect=["stopped (interrupted)"])
        assert "stopped (interrupted)" in text(msgs), (reply, text(msgs), text(msgs, "stderr"))

        # A kernel that dies (kill -9) takes its cluster's ranks with it.
        reply, msgs = k.run("%zb_start -n 2")
        ranks = workers(pid)
        assert reply["status"] == "ok" and len(ranks) == 2
        psutil.Process(pid).kill()
        deadline = time.monotonic() + 120  # at once, but a busy machine may take seconds
        while any(running(p) for p in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p.pid for p in ranks if running(p)] == []
    finally:
        k.close()
