"""`launch(fn, *args, nprocs=...)`: run one function on fresh ranks and return their results."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from zbkit.launch import _channel as ch
from zbkit.launch._collect import collect, describe
from zbkit.launch._errors import LaunchError, quiet_interrupt
from zbkit.launch._procs import RankGroup, check_args, check_timeout


def launch(
    fn: Callable[..., Any],
    *args: Any,
    nprocs: int,
    backend: str = "gloo",
    timeout: float | None = None,
    master_port: int | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on `nprocs` fresh ranks; return the results in rank order.

    Each rank is a new Python process with ``torch.distributed`` initialised (RANK,
    WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and MASTER_PORT set;
    with ``backend="nccl"`` rank k uses GPU k). `fn` may be a notebook function, a lambda or
    a closure: it travels with cloudpickle. Output lines stream into the caller labelled
    ``[rank k]``.

    Raises LaunchError when a rank raises (with its traceback), dies (with its exit code or
    signal), or runs past `timeout` seconds (with every running rank's Python stack); the
    other ranks are stopped first. A KeyboardInterrupt stops all ranks and propagates.
    `master_port` fixes the rendezvous port (default: a free one, chosen race-free).
    """
    if not callable(fn):
        raise TypeError(f"launch needs a callable first, got {type(fn).__name__}")
    check_timeout(timeout)
    check_args(nprocs, backend, master_port)  # before pickling: the simpler mistake first
    try:
        payload = ch.call_payload(fn, args, kwargs)  # fail here, before any process starts
    except Exception as exc:
        raise LaunchError(
            f"could not pickle {getattr(fn, '__name__', fn)!r} and its arguments for the ranks "
            f"({type(exc).__name__}: {exc}); pass plain data and create resources inside fn"
        ) from exc
    group = RankGroup(nprocs, backend, master_port)
    group.set_output(sys.stdout, sys.stderr)  # the cell running now (read at call time)
    finished = False
    try:
        for rank in range(nprocs):
            group.send(rank, ch.CALL, 1, payload)  # queued while the rank imports torch
        out = collect(group, 1, range(nprocs), want=ch.RESULT, timeout=timeout)
        if not out.ok:
            raise LaunchError(describe(out, "launch", "stopped"), out.causes_first() | out.stacks)
        finished = True
        return [out.results[rank] for rank in range(nprocs)]
    except KeyboardInterrupt as exc:
        quiet_interrupt(exc, "launch interrupted; every rank was stopped")
        raise
    finally:
        group.close(graceful=finished)  # on any error or interrupt: SIGTERM, then SIGKILL
