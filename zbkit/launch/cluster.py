"""`Cluster`: ranks that stay alive between calls, each with a namespace that persists."""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable, Iterable
from typing import Any

from zbkit.launch import _channel as ch
from zbkit.launch._collect import Outcome, collect, describe
from zbkit.launch._errors import LaunchError, exit_status, quiet_interrupt
from zbkit.launch._procs import RankGroup, check_timeout

STARTUP_TIMEOUT_S = 300.0  # importing torch on a few busy cores can take a while


class Cluster:
    """Persistent ranks: ``run(fn, *args)`` and ``exec(code)`` keep state between calls.

    Every rank has a namespace (``rank``, ``world_size``, ``torch`` and ``dist`` predefined)
    that ``exec`` reads and writes like a REPL. An error on one rank raises LaunchError and
    the cluster stays usable when every rank answered; when a rank died, hung past
    `timeout` or was left waiting in a collective, the cluster is stopped and says so.
    A rank that dies between calls is noticed by the next call (and by ``closed``,
    ``status()`` and the repr): the cluster stops and the call raises LaunchError.
    """

    def __init__(
        self,
        nprocs: int,
        backend: str = "gloo",
        *,
        timeout: float | None = None,
        master_port: int | None = None,
    ) -> None:
        check_timeout(timeout)
        self.timeout = timeout  # default per-call limit; each call may override it
        self._group = RankGroup(nprocs, backend, master_port)
        self._stopped: str | None = None  # why the cluster cannot be used any more
        self._group.set_output(sys.stdout, sys.stderr)
        try:
            out = collect(
                self._group, 0, range(nprocs), want=ch.READY, timeout=STARTUP_TIMEOUT_S, grace=1.0
            )
        except KeyboardInterrupt as exc:
            self.close()
            quiet_interrupt(exc, "Cluster start interrupted; every rank was stopped")
            raise
        except BaseException:
            self.close()
            raise
        if not out.ok:
            self.close()
            message = describe(out, "Cluster start", "stopped")
            raise LaunchError(message, out.causes_first() | out.stacks)

    @property
    def nprocs(self) -> int:
        return self._group.nprocs

    @property
    def backend(self) -> str:
        return self._group.backend

    @property
    def closed(self) -> bool:
        self._notice_idle_deaths()
        return self._stopped is not None

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """``fn(*args, **kwargs)`` on every rank; the results in rank order."""
        if not callable(fn):
            raise TypeError(f"run needs a callable first, got {type(fn).__name__}")
        try:
            payload = ch.call_payload(fn, args, kwargs)
        except Exception as exc:
            raise LaunchError(
                f"could not pickle {getattr(fn, '__name__', fn)!r} and its arguments for the "
                f"ranks ({type(exc).__name__}: {exc}); pass plain data and create resources "
                "inside fn"
            ) from exc
        return self._call(ch.CALL, payload, range(self.nprocs), self.timeout)

    def exec(
        self,
        code: str,
        ranks: Iterable[int] | None = None,
        timeout: float | None = None,
        *,
        display: bool = False,
    ) -> list[Any]:
        """Run `code` on `ranks` (default all) like a REPL cell: returns, per rank in the
        order given, the value of a final expression (None when the code ends otherwise).

        A value that cannot be pickled is an error (LaunchError naming the rank and the
        type); with ``display=True`` it comes back as a ``RichResult`` instead, which only
        shows the value (``%%zb`` does this to display a cell's result).
        """
        if not isinstance(code, str):
            raise TypeError(f"exec needs the code as a str, got {type(code).__name__}")
        check_timeout(timeout)
        if isinstance(ranks, str | int):  # one rank is [1]: "1" or 1 would be a guess
            raise TypeError(f"ranks must be a list of ints such as [0, 1], or None for all; "
                            f"got {ranks!r}")  # fmt: skip
        chosen = list(range(self.nprocs)) if ranks is None else list(ranks)
        bad = [r for r in chosen if not isinstance(r, int) or not 0 <= r < self.nprocs]
        if bad or not chosen or len(set(chosen)) != len(chosen):
            raise ValueError(f"ranks must be distinct ints in 0..{self.nprocs - 1}, got {chosen!r}")
        name = f"<zb cell {self._group.next_id}>"  # shown in tracebacks, with the source
        payload = pickle.dumps((code, name, bool(display)))
        return self._call(ch.EXEC, payload, chosen, self.timeout if timeout is None else timeout)

    def _call(self, kind: str, payload: bytes, ranks: Iterable[int], timeout: Any) -> list[Any]:
        ranks = list(ranks)
        group = self._group
        group.set_output(sys.stdout, sys.stderr)  # the cell running now
        died = self._notice_idle_deaths()  # prints their last output here
        if died is not None:
            raise LaunchError(f"{died}; cluster stopped. {self._restart}")
        if self._stopped is not None:
            raise LaunchError(f"this cluster is stopped ({self._stopped}). {self._restart}")
        group.drain()  # anything printed while idle (a background thread) shows here
        task_id, group.next_id = group.next_id, group.next_id + 1
        try:
            for rank in ranks:
                try:
                    group.send(rank, kind, task_id, payload)
                except OSError:  # it died after the check above, or closed its channel
                    group.status(rank)  # give its exit a moment to be seen
                    why = self._notice_idle_deaths() or f"rank {rank} closed its control channel"
                    self._stop(why)
                    raise LaunchError(f"{why}; cluster stopped. {self._restart}") from None
            out = collect(group, task_id, ranks, want=ch.RESULT, timeout=timeout)
        except KeyboardInterrupt as exc:
            self._stop("interrupted")
            quiet_interrupt(exc, f"interrupted; every rank was stopped. {self._restart}")
            raise
        if out.ok:
            return [out.results[rank] for rank in ranks]
        raise self._failure(out)

    def _failure(self, out: Outcome) -> LaunchError:
        tracebacks = out.causes_first() | out.stacks
        if out.running or out.died:
            why = "a rank died" if out.died else "ranks were left running"
            if out.timeout is not None:
                why = "a call timed out"
            self._stop(why)
            note = (
                "\nThe cluster has been stopped: its collectives can no longer match up. "
                "Start a new one (in a notebook: %zb_start)."
            )
            return LaunchError(describe(out, "Cluster call", "stopped") + note, tracebacks)
        note = (
            "\nEvery rank answered, so the cluster is still usable and its state is kept"
            " (if a collective failed half-way, restart it)."
        )
        return LaunchError(describe(out, "Cluster call", "") + note, tracebacks)

    @property
    def _restart(self) -> str:
        return f"Start a new one (in a notebook: %zb_start -n {self.nprocs})."

    def _notice_idle_deaths(self) -> str | None:
        """Ranks that exited between calls: stop the cluster and say why (once).

        Nothing watches the ranks while the cluster is idle (the caller runs no thread), so
        every call, ``closed``, ``status()`` and the repr look at the exit codes first.
        """
        if self._stopped is not None:
            return None
        group = self._group
        dead = [rank for rank, proc in enumerate(group.procs) if proc.poll() is not None]
        if not dead:
            return None
        group.drain()  # whatever they printed last
        why = "; ".join(
            f"rank {rank} died ({exit_status(group.procs[rank].returncode)}) while idle"
            for rank in dead
        )
        self._stop(why)  # the others too: a collective could no longer match up
        return why

    def _stop(self, why: str) -> None:
        if self._stopped is None:
            self._stopped = why
        self._group.close(graceful=False)

    def status(self) -> str:
        """One line per rank: pid and whether it is alive."""
        self._notice_idle_deaths()
        state = f"stopped ({self._stopped})" if self._stopped else "running"
        lines = [f"Cluster: {self.nprocs} ranks, backend={self.backend!r}, {state}"]
        for rank, proc in enumerate(self._group.procs):
            alive = "alive" if proc.poll() is None else f"exited ({proc.returncode})"
            lines.append(f"  rank {rank}: pid {proc.pid}, {alive}")
        return "\n".join(lines)

    def close(self) -> None:
        """Stop the ranks (asking politely first) and reap them; safe to call twice."""
        if self._stopped is None:
            self._stopped = "closed"
        self._group.close(graceful=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        self._notice_idle_deaths()
        state = f"stopped: {self._stopped}" if self._stopped else "running"
        return f"Cluster(nprocs={self.nprocs}, backend={self.backend!r}) [{state}]"
