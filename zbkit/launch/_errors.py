"""How a launch failure reads: `LaunchError` (every failed rank and why), a rank's exit
status in words, and an interrupt shown as one line instead of the wait loop's frames."""

from __future__ import annotations

import signal


class LaunchError(RuntimeError):
    """Ranks failed, died, hung or could not start; the message names them and says why.

    ``.ranks`` lists the ranks that failed (or hung) and ``.tracebacks`` maps each of them
    to its formatted traceback, exit status or Python stack.
    """

    def __init__(self, message: str, tracebacks: dict[int, str] | None = None) -> None:
        super().__init__(message)
        self.tracebacks = dict(tracebacks or {})
        self.ranks = sorted(self.tracebacks)

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of the launcher's own frames: the ranks' tracebacks
        # inside the message are the ones a learner needs.
        return [f"LaunchError: {self}"]


def quiet_interrupt(exc: KeyboardInterrupt, message: str) -> None:
    """Have IPython show `message` as the whole traceback of this interrupt: the frames of
    the wait loop where the stop button landed (about 40 lines) teach nothing. It stays a
    KeyboardInterrupt: "run all" stops there and ``except KeyboardInterrupt`` still works."""
    exc._render_traceback_ = lambda: [f"KeyboardInterrupt: {message}"]  # type: ignore[attr-defined]


def exit_status(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (the out-of-memory killer?)" if code == -signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exit code {code}"
