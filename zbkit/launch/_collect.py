"""Wait for one round of replies from a set of ranks, and turn failures into messages."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from zbkit.launch import _channel as ch
from zbkit.launch._procs import DIED, POLL_S, RankGroup

# How long a hung rank gets to say where it is: its control thread answers at once unless a
# C call holds the GIL, but on a busy machine "at once" can take seconds (only a rank that
# never answers costs the whole wait)
STACKS_WAIT_S = 30.0
# After one rank fails, how long the others may still report (their own errors, or echoes of
# the first): a rank that answers later is taken for hung, so seconds of a busy machine must
# fit; only ranks stuck in a wait cost the whole of it
FAILURE_GRACE_S = 10.0


@dataclass
class Outcome:
    results: dict[int, Any] = field(default_factory=dict)  # rank -> value
    failures: dict[int, str] = field(default_factory=dict)  # rank -> traceback, in arrival order
    waiting: set[int] = field(default_factory=set)  # failed waiting on another rank: echoes
    died: set[int] = field(default_factory=set)  # ranks whose process is gone
    running: list[int] = field(default_factory=list)  # ranks that never answered
    stacks: dict[int, str] = field(default_factory=dict)  # rank -> stack, after a timeout
    timeout: float | None = None  # set when we gave up waiting

    @property
    def ok(self) -> bool:
        return not self.failures and not self.running

    def causes_first(self) -> dict[int, str]:
        """The failures, the ranks that failed on their own first (in arrival order), then
        those that failed waiting on another rank: the cause leads even when its echo (a
        peer's closed connection) arrived first."""
        order = sorted(self.failures, key=lambda rank: rank in self.waiting)  # stable
        return {rank: self.failures[rank] for rank in order}


def collect(
    group: RankGroup,
    task_id: int,
    ranks: Iterable[int],
    *,
    want: str,
    timeout: float | None,
    grace: float = FAILURE_GRACE_S,
) -> Outcome:
    """Wait until each rank in `ranks` answered `want` for `task_id`, failed or died.

    After the first failure the others get `grace` seconds to answer (they may fail too,
    which is worth showing); then we stop waiting and report the rest as `running`.
    Past `timeout`, the ranks still running are asked for their stacks.
    """
    out = Outcome()
    pending = set(ranks)
    now = time.monotonic()
    deadline = None if timeout is None else now + timeout
    give_up = None  # set at the first failure
    try:
        while pending:
            now = time.monotonic()
            if give_up is not None and now >= give_up:
                break
            if deadline is not None and now >= deadline:
                out.timeout = timeout
                break
            wake = min(t for t in (deadline, give_up, now + POLL_S) if t is not None)
            for message in group.step(max(0.0, wake - now)):
                if _settle(out, group, message, task_id, want, pending):
                    pending.discard(message[0])
                    if out.failures and give_up is None:
                        give_up = time.monotonic() + grace
        out.running = sorted(pending)
        if out.timeout is not None and out.running:
            out.stacks = _ask_stacks(group, out.running)
    finally:
        group.drain()
    return out


def _settle(
    out: Outcome,
    group: RankGroup,
    message: tuple[int, str, int, bytes],
    task_id: int,
    want: str,
    pending: set[int],
) -> bool:
    """Books one message from a rank into `out`; True when it settles that rank (it
    answered `want` for `task_id`, failed, or died), False when it is not the awaited one."""
    rank, kind, tid, payload = message
    if kind == DIED:
        out.died.add(rank)
        if rank in pending:
            out.failures[rank] = "died without a Python exception: " + group.status(rank)
        return True
    if rank not in pending:
        return False  # a late answer to an earlier request
    if kind == ch.FATAL:
        out.failures[rank] = "could not start:\n" + payload.decode()
    elif tid != task_id or kind not in (want, ch.ERROR, ch.WAITING_ERROR):
        return False  # READY before the first result, stale stacks...
    elif kind in (ch.ERROR, ch.WAITING_ERROR):
        out.failures[rank] = payload.decode()
        if kind == ch.WAITING_ERROR:
            out.waiting.add(rank)
    else:
        try:
            out.results[rank] = ch.loads(payload) if kind == ch.RESULT else None
        except Exception as exc:
            out.failures[rank] = (
                f"returned a value that cannot be unpickled here: {type(exc).__name__}: {exc}"
            )
    return True


def _ask_stacks(group: RankGroup, ranks: list[int]) -> dict[int, str]:
    asked = [r for r in ranks if r in group.conns]
    for rank in asked:
        group.send(rank, ch.STACKS)
    stacks: dict[int, str] = {}
    end = time.monotonic() + STACKS_WAIT_S
    while len(stacks) < len(asked) and time.monotonic() < end:
        for rank, kind, _, payload in group.step(max(0.0, end - time.monotonic())):
            if kind == ch.STACKS:
                stacks[rank] = payload.decode()
    for rank in ranks:
        stacks.setdefault(rank, "(no answer: stuck in C code that holds the GIL?)\n")
    return stacks


def _ranks(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def describe(out: Outcome, what: str, after: str) -> str:
    """A learner-readable account: who failed how, who was still running, and then what."""
    if out.timeout is not None:
        head = (
            f"{what} timed out after {out.timeout:g} s: {_ranks(out.running)} still running "
            f"({after}). Where each one was (most recent call last):"
        )
        blocks = [f"--- rank {r}: stack ---\n{out.stacks[r]}" for r in out.running]
    else:
        first = [r for r in out.failures if r not in out.waiting] or list(out.failures)
        head = f"{what} failed on {_ranks(first)}"
        echoes = [r for r in out.failures if r not in first]
        if echoes:
            head += f"; then {_ranks(echoes)} failed waiting on another rank"
        if out.running:
            head += f"; {_ranks(out.running)} did not finish ({after})"
        head += "."
        blocks = []
    for rank, text in out.causes_first().items():  # the cause first
        label = "traceback" if text.startswith("Traceback") else "status"
        blocks.append(f"--- rank {rank}: {label} ---\n{text.rstrip()}\n")
    return "\n".join([head, *blocks])
