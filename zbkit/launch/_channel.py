"""The control channel between the caller (a notebook kernel) and one rank process.

Each rank gets one end of a Unix socketpair, inherited through ``pass_fds``; the
caller keeps the other end. Nothing listens on any address, so no other process can
connect: the only peer that can write to a rank's end is the process that created
it. That is what makes it safe to unpickle what arrives (a pickle is code).

Every message is ``(kind, task_id, payload)`` pickled with the standard library, where
``kind`` and ``task_id`` are plain str/int and ``payload`` is bytes: the user's
function or result, pickled with cloudpickle. Splitting the two levels lets the
receiver read the kind of a message without running the user's unpickling code, and
lets a payload that fails to unpickle become an error report instead of a crash.
"""

from __future__ import annotations

import linecache
import pickle
from multiprocessing.connection import Connection, Pipe
from typing import Any

# parent -> rank
SETUP = "setup"  # payload: dict (sys.path, backend): sent once, before torch is imported
CALL = "call"  # payload: cloudpickle of (fn, args, kwargs, source lines or None)
EXEC = "exec"  # payload: pickle of (code, cell_name, display: bool)
STACKS = "stacks"  # no payload: answer with the main thread's current Python stack
EXIT = "exit"  # no payload: leave now
# rank -> parent
READY = "ready"  # torch.distributed is initialised
RESULT = "result"  # payload: pickle of the return value (a RichResult for a figure)
ERROR = "error"  # payload: the formatted traceback (str bytes)
WAITING_ERROR = "waiting-error"  # as ERROR, from a rank that failed waiting on another rank
FATAL = "fatal"  # setup failed before any task could run (payload: traceback)


def pair() -> tuple[Connection, Connection]:
    """A connected (parent end, child end); on Unix a socketpair, never a listening socket."""
    return Pipe(duplex=True)


def send(conn: Connection, kind: str, task_id: int = 0, payload: bytes = b"") -> None:
    conn.send_bytes(pickle.dumps((kind, task_id, payload), protocol=pickle.HIGHEST_PROTOCOL))


def recv(conn: Connection) -> tuple[str, int, bytes]:
    """Blocks; raises EOFError when the peer is gone."""
    kind, task_id, payload = pickle.loads(conn.recv_bytes())
    return kind, task_id, payload


def dumps(obj: Any) -> bytes:
    import cloudpickle  # by value for __main__ functions, lambdas and closures

    return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def call_payload(fn: Any, args: tuple, kwargs: dict) -> bytes:
    """A CALL payload: the function, its arguments, and its source lines when the caller
    has them (a notebook cell lives only in the kernel's linecache)."""
    code = getattr(fn, "__code__", None)
    lines = linecache.getlines(code.co_filename) if code is not None else []
    source = (code.co_filename, lines) if code is not None and lines else None
    return dumps((fn, args, kwargs, source))


loads = pickle.loads  # cloudpickle output is plain pickle; it imports cloudpickle itself
