"""Hangs in torchrun jobs: every rank says where it waits, then exits, instead of hanging.

One line at the top of a script run under ``torchrun``::

    import zbkit.debug
    zbkit.debug.install(timeout=60)

A pipeline that deadlocks otherwise sits in its waits until torch's default 30-minute timeout.
Once installed, a rank prints a report and exits with code 3 when

- its main thread has sat on one line inside a wait of zbkit's pipeline or of
  ``torch.distributed`` (a receive, a barrier, a collective, torch's own schedules) for
  ``timeout`` seconds (a watchdog thread samples the main thread's stack);
- a wait fails with an uncaught ``CommTimeout`` or ``TimeoutError`` (the peer exited: its
  connection closed, so this rank's wait fails at once);
- torchrun stops it with SIGTERM (which it sends to every rank when one fails).

The report: the rank, why; the Python stack of every thread; and the schedule's rank-by-step
grid with the action this rank waits for marked ``<-- WAITING HERE``. zbkit's
``ScheduleRunner`` says where it is (its step's position). For torch's schedules, pass the
schedule object itself (``install(timeout=60, schedule=torch_schedule)``): install counts the
compute actions each of its steps starts and finishes (``TorchProgress``), and the report
marks, in the grid of ``Schedule.from_torch(torch_schedule)``, the action in progress (started,
not finished) or else the next one in this rank's program. Any other wait (outside a step, or
with no schedule given) gets the stacks and no mark.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
import traceback
from types import FrameType, TracebackType
from typing import Any, TextIO

from zbkit._debug_torch import TorchProgress, waiting_grid
from zbkit.schedules import Schedule
from zbkit.schedules.core.grid import WAITING, as_waiting
from zbkit.schedules.core.plan import Comm, CommOp

__all__ = ["Watchdog", "install"]

EXIT_CODE = 3  # a hang or a failed wait: apart from Python's 1 (an error) and torch's codes
_WAITS = ("/torch/distributed/", "/zbkit/pipeline/", "/zbkit/parallel/")  # files that wait


def install(
    timeout: float = 300.0,
    schedule: Schedule | object | None = None,
    *,
    exit_code: int = EXIT_CODE,
    stream: TextIO | None = None,
) -> Watchdog:
    """Reports and exits instead of hanging (see the module's docstring); returns the
    ``Watchdog`` (``.uninstall()`` undoes it). Call it from the main thread.

    Args:
        timeout: seconds the main thread may sit on one line inside a wait.
        schedule: the zbkit ``Schedule`` to draw when the wait is not in a zbkit
            ``ScheduleRunner`` (which knows its own); or a torch.distributed.pipelining
            schedule object, whose stages' methods and ``step`` are then wrapped to count
            the actions it runs (undone by ``uninstall``).
        exit_code: the process's exit status after a report.
        stream: where the report goes (default: ``sys.stderr``).
    """
    if timeout <= 0:
        raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
    if Watchdog.active is not None:  # one per process: hooks and signals are process-wide
        Watchdog.active.uninstall()
    dog = Watchdog(timeout, schedule, exit_code, stream)
    dog.start()
    return dog


class Watchdog:
    """The installed hooks and the thread that samples the main thread's stack."""

    active: Watchdog | None = None  # the installed one (hooks and signals are per process)

    def __init__(
        self,
        timeout: float,
        schedule: Schedule | object | None,
        exit_code: int,
        stream: TextIO | None,
    ) -> None:
        self.timeout = timeout
        self.schedule: Schedule | None = None  # drawn when the wait is not in a zbkit runner
        self.torch: TorchProgress | None = None
        if isinstance(schedule, Schedule):
            self.schedule = schedule
        elif schedule is not None:  # a torch schedule: counted as it runs, drawn as zbkit loads it
            self.torch = TorchProgress(schedule)
            self.schedule = self.torch.schedule
        self.exit_code = exit_code
        self.stream = stream
        self._main = threading.main_thread()
        self._stop = threading.Event()
        self._reporting = threading.Lock()  # the first report wins; the others wait to die
        self._thread = threading.Thread(target=self._watch, name="zbkit-debug", daemon=True)
        self._saved: dict[str, Any] = {}
        self._wake: tuple[int, int] | None = None  # a pipe that signals write into
        self._stale = getattr(sys, "last_value", None)  # an error from before the install

    def start(self) -> None:
        self._saved = {"excepthook": sys.excepthook, "threading": threading.excepthook}
        sys.excepthook = self._excepthook
        threading.excepthook = self._thread_excepthook
        if threading.current_thread() is self._main:
            # A Python signal handler runs only when the main thread gets back to bytecode,
            # never while it sits in a C wait; the wakeup fd also tells the watchdog thread.
            r, w = os.pipe()
            os.set_blocking(w, False)
            self._wake = (r, w)
            self._saved["wakeup"] = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
            self._saved["sigterm"] = signal.signal(signal.SIGTERM, self._on_sigterm)
        if self.torch is not None:
            self.torch.wrap()
        Watchdog.active = self
        self._thread.start()

    def uninstall(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        sys.excepthook = self._saved.get("excepthook", sys.__excepthook__)
        threading.excepthook = self._saved.get("threading", threading.__excepthook__)
        if self._wake is not None:
            signal.signal(signal.SIGTERM, self._saved["sigterm"])
            signal.set_wakeup_fd(self._saved["wakeup"])
            for fd in self._wake:
                os.close(fd)
            self._wake = None
        if self.torch is not None:
            self.torch.unwrap()
        if Watchdog.active is self:
            Watchdog.active = None

    def __repr__(self) -> str:
        state = "watching" if self._thread.is_alive() else "stopped"
        return f"Watchdog(timeout={self.timeout:g} s, {state})"

    # ------------------------------------------------------------------ the three triggers
    def _watch(self) -> None:
        poll = min(1.0, self.timeout / 10)
        seen, since = None, time.monotonic()
        while not self._stop.is_set():
            if self._wake is not None:
                ready, _, _ = select.select([self._wake[0]], [], [], poll)
                if ready and signal.SIGTERM in os.read(self._wake[0], 64):
                    self._report_live(
                        "stopped by SIGTERM (torchrun stops every rank when one fails)"
                    )
            else:
                self._stop.wait(poll)
            frame = sys._current_frames().get(self._main.ident or -1)
            if frame is None:
                return  # the main thread has ended
            spot = (frame.f_code, frame.f_lineno, id(frame))  # where it is, not the frame
            now = time.monotonic()
            if spot != seen:
                seen, since = spot, now
            elif now - since >= self.timeout and _waiting(frame):
                here = f"{frame.f_code.co_filename}:{frame.f_lineno}"
                self._report_live(
                    f"waited {now - since:.1f} s at {here} (timeout {self.timeout:g} s)"
                )
            del frame

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._report_live("stopped by SIGTERM (torchrun stops every rank when one fails)")

    def _excepthook(
        self, kind: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        if not isinstance(exc, TimeoutError):  # CommTimeout is one; other errors as usual
            self._saved["excepthook"](kind, exc, tb)
            return
        self._report_failed(exc, tb, "main thread", hook=True)

    def _thread_excepthook(self, args: Any) -> None:
        if not isinstance(args.exc_value, TimeoutError):
            self._saved["threading"](args)
            return
        name = args.thread.name if args.thread is not None else "a thread"
        self._report_failed(args.exc_value, args.exc_traceback, f"thread {name}", hook=True)

    # ------------------------------------------------------------------ reports
    # Triggers race: when one rank exits, another's wait fails (its excepthook runs) while
    # torchrun's SIGTERM arrives. The first to take `_reporting` reports and exits; a signal
    # or the watchdog finding it taken returns, a hook finding it taken waits for the exit.
    def _report_live(self, why: str) -> None:
        """The main thread is still waiting: its live stack says where."""
        last = getattr(sys, "last_value", None)  # set before sys.excepthook is called
        if isinstance(last, TimeoutError) and last is not self._stale:
            # the main thread's wait has failed and the hooks are on their way: report that
            self._report_failed(last, sys.last_traceback, "main thread", hook=False)
            return
        if not self._reporting.acquire(blocking=False):
            return
        frame = sys._current_frames().get(self._main.ident or -1)
        frames = _outward(frame)
        text = _stacks() + self._grid(frames, None)
        self._finish(why, text, frames)

    def _report_failed(
        self, exc: BaseException, tb: TracebackType | None, where: str, hook: bool
    ) -> None:
        """A wait failed and nothing caught it: the traceback says where it waited."""
        if not self._reporting.acquire(blocking=False):
            while hook:  # another trigger is reporting and will end the process
                time.sleep(1)
            return
        frames = [f for f, _ in traceback.walk_tb(tb)][::-1]  # innermost first
        failed = "".join(traceback.format_exception(type(exc), exc, tb))
        # the runner's note marks the action it waited for: that is where it waited
        failed = as_waiting(failed)
        # this thread's stack is the traceback; the live one would show only this hook
        text = f"the wait that failed ({where}):\n{failed}\n" + _stacks(threading.get_ident())
        text += self._grid(frames, "" if WAITING in failed else None)
        self._finish(f"a wait failed: {type(exc).__name__}", text, frames)

    def _finish(self, why: str, text: str, frames: list[FrameType]) -> None:
        spot = _locate(frames)
        if spot is not None:
            rank: object = spot[1]
        else:
            rank = self.torch.rank if self.torch is not None else os.environ.get("RANK", "?")
        head = f"=== zbkit.debug: rank {rank}: {why} ==="
        tail = f"=== zbkit.debug: rank {rank} exits with code {self.exit_code} ==="
        _write(self.stream, f"\n{head}\n{text}{tail}\n")
        os._exit(self.exit_code)  # not sys.exit: the main thread may sit in a C wait

    def _grid(self, frames: list[FrameType], skip: str | None) -> str:
        """The schedule with this rank's waiting action marked; '' if there is nothing to draw."""
        if skip is not None:  # already in the text (the runner's own note)
            return skip
        spot = _locate(frames)
        if spot is None and self.torch is not None:
            return self.torch.report(frames)
        if spot is None:
            if self.schedule is None:
                return "(no schedule known here: pass install(schedule=...) to draw one)\n"
            return f"schedule {self.schedule.name}:\n{self.schedule.to_grid()}\n"
        schedule, rank, position, what = spot
        schedule = schedule or self.schedule
        if schedule is None:
            return f"rank {rank} waits at {what} (pass install(schedule=...) to draw the grid)\n"
        grid = waiting_grid(schedule, rank, position)
        return f"rank {rank} waits at position {position}: {what}\n{grid}\n"


# ---------------------------------------------------------------------- reading the frames
def _outward(frame: FrameType | None) -> list[FrameType]:
    """``frame`` and its callers, innermost first."""
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames


def _waiting(frame: FrameType) -> bool:
    """Whether the stack passes through code that waits on other ranks."""
    return any(
        any(part in f.f_code.co_filename.replace("\\", "/") for part in _WAITS)
        for f in _outward(frame)
    )


def _locate(frames: list[FrameType]) -> tuple[Schedule | None, int, int, str] | None:
    """(schedule, rank, position in its program, what it waits for), from the innermost
    frame of zbkit's ``ScheduleRunner._walk`` (the step's loop, which keeps the count), else
    of ``ScheduleRunner.step`` (its start); torch's schedules: ``TorchProgress``."""
    for f in frames:
        path = f.f_code.co_filename.replace("\\", "/")
        name = f.f_code.co_name
        if name in ("_walk", "step") and path.endswith("/zbkit/pipeline/runner.py"):
            return _zbkit_spot(f.f_locals)
    return None


def _zbkit_spot(local: dict[str, Any]) -> tuple[Schedule, int, int, str]:
    # ScheduleRunner._walk's own bookkeeping: `done` compute actions finished, `item` the
    # plan step it is on (a receive waits for the next action; a send follows the last one)
    runner, done, item = local["self"], local.get("done", 0), local.get("item")
    program = runner.schedule.program[runner.rank]
    sending = isinstance(item, Comm) and item.op is CommOp.SEND
    position = done - 1 if sending or done >= len(program) else done
    if item is None:
        what = "the step's start"
    elif isinstance(item, Comm):
        what = f"{item} ({item.explain()})"
    else:
        what = str(item)
    if done >= len(program) and not sending:
        what = f"the end of the step (sends still on the wire, or averaging gradients after {what})"
    return runner.schedule, runner.rank, position, what


def _write(stream: TextIO | None, text: str) -> None:
    """To ``stream``, or straight to fd 2: sys.stderr's lock may be held by a thread that
    will never run again, and os._exit follows (nothing buffered would be flushed)."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    if stream is not None:
        with contextlib.suppress(Exception):
            stream.write(text)
            stream.flush()
            return
    data = text.encode(errors="replace")
    while data:
        data = data[os.write(2, data) :]


def _stacks(skip: int | None = None) -> str:
    """The Python stack of every thread but the watchdog's (and ``skip``), most recent
    call last."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        name = names.get(ident, f"thread {ident}")
        if name == "zbkit-debug" or ident == skip:
            continue
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"stack of thread {name} (most recent call last):\n{stack}")
    return "".join(parts)
