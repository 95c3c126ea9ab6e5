"""Start, watch and stop a group of rank processes, all from the caller's one thread.

The caller never starts a thread: one loop waits on every rank's control connection and
on every stdout/stderr pipe at once, prints output lines as they arrive (so they appear
in the cell that is running, even in Jupyter), and collects replies. Each rank is the
leader of its own process group, so stopping it stops whatever it started too.
"""

from __future__ import annotations

import numbers
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
import weakref
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_any
from typing import Any, TextIO

from zbkit.launch import _channel as ch
from zbkit.launch._errors import LaunchError, exit_status

BACKENDS = ("gloo", "nccl")
DIED = "died"  # pseudo-message: a rank's control channel closed
POLL_S = 0.5  # how often we look at exit codes even when nothing arrives
# Above this many ranks per core, starting them costs more than it teaches: each rank is a
# Python process importing torch (~150 MB, seconds of CPU; 64 ranks on 2 cores took 56 s
# and 9.5 GB) and they mostly wait for a core. Warned about, not refused: it still works.
RANKS_PER_CORE_WARNING = 4


def _loopback_interface() -> str | None:
    names = [name for _, name in socket.if_nameindex()]
    return next((n for n in names if n in ("lo", "lo0")), None)


def _bind_store_socket(port: int | None) -> socket.socket:
    """A listening socket on 127.0.0.1 for rank 0's TCPStore: bound before any rank starts,
    so the port cannot be taken in between (TCPStore's own bind would listen on all
    addresses, '::', even when told 127.0.0.1)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is fine
    try:
        sock.bind(("127.0.0.1", port or 0))
    except OSError as exc:
        sock.close()
        raise LaunchError(
            f"master_port={port} is not free on 127.0.0.1 ({exc.strerror}); "
            "pass master_port=None (the default) to let zbkit pick a free port"
        ) from None
    sock.listen(128)
    return sock


def _type(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def check_timeout(timeout: Any, name: str = "timeout") -> None:
    """At the API's edge: a wrong type here would fail deep inside, in the wait loop."""
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(
            f"{name} must be a number of seconds (e.g. {name}=60) or None, got {_type(timeout)}"
        )
    if not timeout > 0:  # type: ignore[operator]  # nan too; typeshed's Real has no __gt__
        raise ValueError(f"{name} must be a positive number of seconds or None, got {timeout!r}")


def check_args(nprocs: Any, backend: Any, master_port: Any = None) -> None:
    if isinstance(nprocs, bool) or not isinstance(nprocs, numbers.Integral):
        raise TypeError(f"nprocs must be an int (the number of ranks, e.g. nprocs=2), got "
                        f"{_type(nprocs)}")  # fmt: skip
    if nprocs < 1:
        raise ValueError(f"nprocs must be a positive int (the number of ranks), got {nprocs!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if master_port is not None:
        if isinstance(master_port, bool) or not isinstance(master_port, numbers.Integral):
            raise TypeError(f"master_port must be an int port number or None (zbkit picks a "
                            f"free one), got {_type(master_port)}")  # fmt: skip
        if not 0 < master_port < 65536:  # type: ignore[operator]  # typeshed's Integral
            raise ValueError(f"master_port must be in 1..65535 or None, got {master_port!r}")
    if backend == "nccl":
        import torch

        gpus = torch.cuda.device_count()
        if gpus < nprocs:  # type: ignore[operator]  # typeshed's Integral has no __gt__
            raise LaunchError(
                f"backend='nccl' puts rank k on GPU k, so nprocs={nprocs} needs {nprocs} GPUs, "
                f"but torch.cuda.device_count() is {gpus}; use backend='gloo' (CPU) or "
                f"nprocs<={gpus}"
            )


def usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):  # the cores this process may run on (a container's)
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _warn_if_oversubscribed(nprocs: int) -> None:
    cores = usable_cores()
    if nprocs > RANKS_PER_CORE_WARNING * cores:
        warnings.warn(
            f"nprocs={nprocs} ranks on {cores} cores: each rank is a Python process with torch "
            f"(~150 MB, seconds to start), so this may take minutes and GBs of memory, and the "
            f"ranks mostly wait for a core; above {RANKS_PER_CORE_WARNING} ranks per core "
            f"(here {RANKS_PER_CORE_WARNING * cores}) consider fewer ranks",
            UserWarning,
            stacklevel=4,  # the line that called launch() or Cluster()
        )


def _kill_groups(procs: list[subprocess.Popen], grace: float) -> None:
    """SIGTERM every rank's process group, SIGKILL what is left after `grace`, reap all."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            try:
                os.killpg(p.pid, sig)  # the group outlives its leader while members remain
            except (ProcessLookupError, PermissionError):
                pass
        end = time.monotonic() + grace
        for p in procs:
            try:
                p.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    for p in procs:
        p.wait()  # after SIGKILL this returns at once: no zombies stay behind


class RankGroup:
    """`nprocs` fresh worker processes with torch.distributed initialised among them."""

    def __init__(self, nprocs: int, backend: str = "gloo", master_port: int | None = None):
        check_args(nprocs, backend, master_port)
        _warn_if_oversubscribed(nprocs)  # once per start, not per rank
        self.nprocs, self.backend = nprocs, backend
        self.conns: dict[int, Connection] = {}  # rank -> control connection, while it is open
        self.procs: list[subprocess.Popen] = []
        self._pipes: dict[int, tuple[int, str, bytearray]] = {}  # fd -> (rank, stream, partial)
        self._out: TextIO = sys.stdout
        self._err: TextIO = sys.stderr
        self.next_id = 1
        self.closed = False
        sock = _bind_store_socket(master_port)
        try:
            for rank in range(nprocs):
                self._spawn(rank, sock)
        except BaseException:
            self.close(graceful=False)
            raise
        finally:
            sock.close()  # rank 0 holds its own copy now
        # Kill the ranks if this object is dropped or the interpreter exits without close().
        self._finalizer = weakref.finalize(self, _kill_groups, self.procs, 1.0)
        setup = ch.dumps({"sys_path": list(sys.path), "backend": backend})
        for conn in self.conns.values():
            ch.send(conn, ch.SETUP, 0, setup)

    def _spawn(self, rank: int, sock: socket.socket) -> None:
        parent_end, child_end = ch.pair()
        fds = [child_end.fileno()] + ([sock.fileno()] if rank == 0 else [])
        env = dict(os.environ)
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(self.nprocs),
            LOCAL_WORLD_SIZE=str(self.nprocs),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(sock.getsockname()[1]),
            ZBKIT_CONTROL_FD=str(child_end.fileno()),
            PYTHONUNBUFFERED="1",
            PYTHONIOENCODING="utf-8",
            MPLBACKEND="Agg",  # the kernel's inline backend would try to display from a rank
        )
        env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun does: ranks share the cores
        loopback = _loopback_interface()
        if loopback:  # all ranks are on this machine: keep their sockets off the network
            env.setdefault("GLOO_SOCKET_IFNAME", loopback)  # else: the hostname's address
            env.setdefault("NCCL_SOCKET_IFNAME", loopback)  # NCCL's bootstrap sockets
        if rank == 0:
            env["ZBKIT_STORE_FD"] = str(sock.fileno())
        env.pop("ZBKIT_PARENT_PID", None)
        if threading.current_thread() is threading.main_thread():
            # the rank dies with this process (PR_SET_PDEATHSIG, Linux); from another thread
            # it would die when that thread ends, so there the rank's watchdog thread alone
            # guards against orphans
            env["ZBKIT_PARENT_PID"] = str(os.getpid())
        proc = subprocess.Popen(
            [sys.executable, "-m", "zbkit.launch._worker"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
            env=env,
            pass_fds=fds,
            start_new_session=True,
        )
        child_end.close()
        self.procs.append(proc)
        self.conns[rank] = parent_end
        for stream, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            assert pipe is not None
            self._pipes[pipe.fileno()] = (rank, stream, bytearray())

    # -- output --------------------------------------------------------------------------
    def _emit(self, rank: int, stream: str, line: bytes | bytearray) -> None:
        target = self._out if stream == "stdout" else self._err
        target.write(f"[rank {rank}] {line.decode('utf-8', 'replace')}\n")  # one whole line

    def _read_pipe(self, fd: int) -> None:
        rank, stream, partial = self._pipes[fd]
        data = os.read(fd, 65536)
        if not data:  # EOF: the rank (and anything it started) closed this stream
            if partial:
                self._emit(rank, stream, bytes(partial))
            del self._pipes[fd]
            return
        partial += data
        *lines, rest = partial.split(b"\n")
        for line in lines:
            self._emit(rank, stream, line)
        partial[:] = rest

    def drain(self) -> None:
        """Print everything already written to the pipes, including unfinished lines."""
        while self._pipes:
            ready = wait_any(list(self._pipes), 0)
            if not ready:
                break
            for fd in ready:
                self._read_pipe(fd)  # type: ignore[arg-type]
        for rank, stream, partial in self._pipes.values():
            if partial:
                self._emit(rank, stream, bytes(partial))
                partial.clear()
        for target in (self._out, self._err):
            target.flush()

    def set_output(self, out: TextIO, err: TextIO) -> None:
        self._out, self._err = out, err

    # -- messages ------------------------------------------------------------------------
    def send(self, rank: int, kind: str, task_id: int = 0, payload: bytes = b"") -> None:
        ch.send(self.conns[rank], kind, task_id, payload)

    def step(self, timeout: float | None) -> list[tuple[int, str, int, bytes]]:
        """Wait up to `timeout` for anything; print output, return control messages."""
        by_conn = {id(c): r for r, c in self.conns.items()}
        ready = wait_any([*self.conns.values(), *self._pipes], timeout)
        events = []
        for obj in ready:
            if isinstance(obj, int):
                self._read_pipe(obj)
                continue
            rank = by_conn[id(obj)]
            conn = self.conns[rank]  # obj itself, typed as the Connection it is
            try:
                events.append((rank, *ch.recv(conn)))
            except (EOFError, OSError):
                conn.close()
                del self.conns[rank]
                events.append((rank, DIED, 0, b""))
        # A rank can die while a process it forked keeps the channel open: look at exit codes.
        for rank, conn in list(self.conns.items()):
            if self.procs[rank].poll() is not None and not conn.poll():
                conn.close()
                del self.conns[rank]
                events.append((rank, DIED, 0, b""))
        return events

    def status(self, rank: int, wait_s: float = 2.0) -> str:
        try:
            self.procs[rank].wait(wait_s)
        except subprocess.TimeoutExpired:
            return "closed its control channel but is still running"
        return exit_status(self.procs[rank].returncode)

    def alive(self) -> list[int]:
        return [r for r, p in enumerate(self.procs) if p.poll() is None]

    def close(self, graceful: bool = True, grace: float = 2.0) -> None:
        """Stop every rank and reap it. Graceful: ask them to exit first."""
        if self.closed:
            return
        self.closed = True
        try:
            if graceful:
                for rank in list(self.conns):
                    try:
                        self.send(rank, ch.EXIT)
                    except OSError:
                        pass
                end = time.monotonic() + grace
                for p in self.procs:
                    try:
                        p.wait(max(0.0, end - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        pass
            _kill_groups([p for p in self.procs if p.poll() is None], grace)
            self.drain()
        finally:
            _kill_groups(self.procs, 0.0)  # idempotent; also the path after an interrupt
            for conn in self.conns.values():
                conn.close()
            self.conns.clear()
            for p in self.procs:
                for pipe in (p.stdout, p.stderr):
                    if pipe is not None:
                        pipe.close()
            self._pipes.clear()
            if hasattr(self, "_finalizer"):
                self._finalizer.detach()
