"""One rank: ``python -m zbkit.launch._worker``, started by the launcher, never by hand.

Life of a rank:
1. read the setup message from the control channel (an inherited socketpair end),
2. import torch and initialise ``torch.distributed`` (rank 0 serves the TCPStore on a
   socket the caller already bound to 127.0.0.1, so no port can be stolen in between),
3. say READY, then run tasks in the main thread until told to exit.

A second thread owns the reading side of the channel: it answers "where are you?"
(STACKS) even while the main thread is stuck in user code or a collective, and it
kills this rank (and its process group) the moment the caller goes away, so a crashed
kernel leaves no ranks. That thread needs the GIL, which a C call can hold for ever (a
long kernel, a ctypes call): so on Linux the rank also asks the kernel to SIGKILL it when
the caller dies (``PR_SET_PDEATHSIG``), whatever it is doing. Processes a rank started
itself are then not reached (unless they watch their parent, as DataLoader workers do).
Elsewhere (macOS) the thread is the only guard.
"""

from __future__ import annotations

import ast
import faulthandler
import linecache
import os
import queue
import signal
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from typing import Any

from zbkit.launch import _channel as ch
from zbkit.launch._rich import to_payload


def _user_frames(tb: Any) -> Any:
    """Skip this file's frames at the top of a traceback: the learner's code comes first."""
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb


def _format_error(exc: BaseException) -> str:
    tb = _user_frames(exc.__traceback__)
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _main_stack(main_ident: int) -> str:
    frame = sys._current_frames().get(main_ident)
    if frame is None:
        return "(main thread not found)\n"
    stack = traceback.extract_stack(frame)
    ours = [i for i, f in enumerate(stack) if f.filename == __file__]
    user = stack[ours[-1] + 1 :] if ours else stack  # runpy and this file are noise
    if not user:
        return "(idle: waiting for the next task)\n"
    return "".join(traceback.format_list(user))


def _refile(code: Any, filename: str) -> Any:
    consts = tuple(_refile(c, filename) if hasattr(c, "co_filename") else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _with_source(fn: Any, source: tuple[str, list[str]] | None) -> Any:
    """Give `fn` back the file name cloudpickle dropped ("<dynamic-code>") and register its
    source lines, so tracebacks from a notebook function show the cell's code."""
    if source is None or getattr(fn, "__code__", None) is None:
        return fn
    filename, lines = source
    linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
    # fn, and the functions from the same cell or file that it calls (found in its
    # globals or closure): cloudpickle gives them all "<dynamic-code>".
    cells = [c.cell_contents for c in fn.__closure__ or () if _is_filled(c)]
    for f in [fn, *fn.__globals__.values(), *cells]:
        code = getattr(f, "__code__", None)
        same_module = getattr(f, "__module__", None) == fn.__module__
        if code is not None and code.co_filename == "<dynamic-code>" and same_module:
            f.__code__ = _refile(code, filename)
    return fn


def _is_filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 (an empty cell raises)
    except ValueError:
        return False
    return True


def run_cell(code: str, name: str, namespace: dict[str, Any]) -> Any:
    """REPL semantics: run every statement, and return the value of a final expression."""
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)  # source in tracebacks
    tree = ast.parse(code, filename=name, mode="exec")
    last = None
    final = tree.body[-1] if tree.body else None
    if isinstance(final, ast.Expr):
        tree.body.pop()
        last = ast.Expression(final.value)
    exec(compile(tree, name, "exec"), namespace)
    return eval(compile(last, name, "eval"), namespace) if last is not None else None


# A wait that fails with these words failed because the other end went away.
_PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe")


def _waiting_on_peer(exc: BaseException | None) -> bool:
    """Did this rank fail *waiting on another rank*: a timeout, or a connection that the
    other end closed (torch.distributed's errors, the pipeline's CommTimeout)? Such a
    failure is usually the echo of another rank's, so the report lists it after those."""
    import torch.distributed as dist

    peer_errors = (TimeoutError, getattr(dist, "DistError", TimeoutError))
    while exc is not None:  # the error itself and what it was raised from
        if isinstance(exc, peer_errors) or any(s in str(exc).lower() for s in _PEER_GONE):
            return True
        exc = exc.__cause__
    return False


def _init_distributed(backend: str) -> tuple[Any, Any]:
    import torch
    import torch.distributed as dist

    # lazily, with torch (which zbkit.parallel imports): main starts the reader thread first
    from zbkit.parallel.process_group import init_process_group

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    port = int(os.environ["MASTER_PORT"])
    store_fd = os.environ.pop("ZBKIT_STORE_FD", None)
    if store_fd is not None:  # rank 0: serve the store on the socket the caller bound
        os.set_inheritable(int(store_fd), False)  # user subprocesses must not hold the port
        store = dist.TCPStore(
            "127.0.0.1",
            port,
            world,
            is_master=True,
            master_listen_fd=int(store_fd),
            wait_for_workers=False,
        )
    else:
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False)
    # The one initialiser zbkit has (torchrun's path uses it too); with nccl it first
    # selects cuda:LOCAL_RANK, and the launcher sets LOCAL_RANK = rank: rank k owns GPU k.
    init_process_group(backend, rank=rank, world_size=world, store=store)
    return torch, dist


def _reader(conn: Connection, tasks: queue.Queue, lock: threading.Lock, main_ident: int) -> None:
    while True:
        try:
            kind, task_id, payload = ch.recv(conn)
        except (EOFError, OSError):  # the caller is gone: take our process group with us
            sys.stdout.flush()
            if os.getpgid(0) == os.getpid():
                os.killpg(os.getpid(), signal.SIGKILL)
            os._exit(1)
        if kind == ch.STACKS:
            with lock:
                ch.send(conn, ch.STACKS, task_id, _main_stack(main_ident).encode())
            continue
        tasks.put((kind, task_id, payload))
        if kind == ch.EXIT:
            return


def _die_with_parent() -> None:
    """Linux: the kernel SIGKILLs this rank when the caller dies, GIL or no GIL.

    The signal comes when the *thread* that started the rank ends, so the launcher asks for
    it (sets ZBKIT_PARENT_PID) only when it starts ranks from its main thread, which lives
    as long as the process does.
    """
    parent = os.environ.pop("ZBKIT_PARENT_PID", None)  # not for the user's subprocesses
    if parent is None or not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1  # from <linux/prctl.h>
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_pdeathsig, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0) != 0:
        return  # refused (a seccomp profile?): the control thread still guards
    if os.getppid() != int(parent):  # the caller died before prctl: no signal will come
        os._exit(1)


def main() -> None:
    _die_with_parent()  # first: a rank can die with its caller from here on
    faulthandler.enable()  # a segfault still prints a Python stack, labelled by the caller
    fd = int(os.environ.pop("ZBKIT_CONTROL_FD"))
    os.set_inheritable(fd, False)  # subprocesses the user starts must not get the channel
    conn = Connection(fd)
    _, _, payload = ch.recv(conn)
    setup = ch.loads(payload)
    sys.path.extend(p for p in setup["sys_path"] if p not in sys.path)  # the kernel's imports
    lock = threading.Lock()  # the main thread and the reader both send
    tasks: queue.Queue = queue.Queue()
    # The reader starts before torch is imported: a rank stuck in import or rendezvous can
    # still say where it is, and dies with the caller.
    args = (conn, tasks, lock, threading.get_ident())
    threading.Thread(target=_reader, args=args, daemon=True, name="zbkit-control").start()
    try:
        torch, dist = _init_distributed(setup["backend"])
    except BaseException as exc:
        with lock:
            ch.send(conn, ch.FATAL, 0, _format_error(exc).encode())
        sys.stderr.flush()
        os._exit(1)
    with lock:
        ch.send(conn, ch.READY)

    rank, world = dist.get_rank(), dist.get_world_size()
    # What a %%zb cell sees without importing anything.
    namespace = {"__name__": "__zb__", "rank": rank, "world_size": world}
    namespace.update(torch=torch, dist=dist)
    while True:
        kind, task_id, payload = tasks.get()
        if kind == ch.EXIT:
            break
        display = False  # a value that cannot be pickled is an error, unless exec asked
        try:
            if kind == ch.CALL:
                fn, fn_args, fn_kwargs, source = ch.loads(payload)
                fn = _with_source(fn, source)
                value = fn(*fn_args, **fn_kwargs)
            else:
                code, name, display = ch.loads(payload)
                value = run_cell(code, name, namespace)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt are reported too
            reply = ch.WAITING_ERROR if _waiting_on_peer(exc) else ch.ERROR
            data = _format_error(exc).encode()
        else:
            try:
                reply, data = ch.RESULT, to_payload(value, ch.dumps, display)
            except Exception as exc:  # the message is the news; pickle's frames are not
                reply, data = ch.ERROR, f"rank {rank}: {type(exc).__name__}: {exc}\n".encode()
        sys.stdout.flush()  # output printed before the reply reaches the caller first
        sys.stderr.flush()
        with lock:
            ch.send(conn, reply, task_id, data)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown (torch's is slow, user threads could block it); the caller
    # has every result already.
    os._exit(0)


if __name__ == "__main__":
    main()
