"""The first step's handshake: every rank of a group runs the same schedule, or all stop.

Ranks built with different schedules (4 microbatches on one, 2 on another) would otherwise
meet only as a receive that never completes, a full timeout later. So before its first
step each rank gathers every rank's fingerprint of its schedule (name, sizes, placement and
a hash of the program) in one small all-gather of bytes (not pickles: nothing received is
executed) and, where they differ, every rank raises at once, naming who runs what.
"""

from __future__ import annotations

import datetime
import hashlib

import torch
import torch.distributed as dist

from zbkit.pipeline._comms import CommTimeout
from zbkit.pipeline._shapes import from_bytes_tensor, to_bytes_tensor
from zbkit.schedules import Schedule

_BYTES = 512  # one fingerprint: its length, then UTF-8
# the gather's tensors, per (device, group size), kept for the process: gloo's worker may
# hold a finished gather's tensors a while after it is waited, so a step's memory (the
# planner's measure) would count them or not by timing; kept, they count the same each run
_BUFFERS: dict[tuple[str, int], list[torch.Tensor]] = {}


def fingerprint(schedule: Schedule, extra: str = "") -> str:
    """A line naming the schedule; equal lines mean the same program on the same placement
    (and the same `extra`: what else every rank must agree on, e.g. the tied weights)."""
    rows = [f"{r}:" + " ".join(map(str, schedule.program[r])) for r in sorted(schedule.program)]
    text = f"{schedule.stage_to_rank}|{schedule.microbatches}|" + "\n".join(rows)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    placement = schedule.stage_to_rank
    where = str(placement) if len(placement) <= 16 else f"{len(placement)} stages"
    return (
        f"{schedule.name[:60]!r} pp={schedule.pp} microbatches={schedule.microbatches} "
        f"placement={where} program #{digest}" + (f" tied={extra}" if extra else "")
    )


def agree_on_schedule(
    schedule: Schedule,
    group: dist.ProcessGroup | None,
    device: torch.device,
    timeout: float,
    what: str,
    extra: str = "",
) -> None:
    """Raises ValueError on every rank of ``group`` unless all run ``schedule``'s twin.

    ``what`` names the group in messages ("pipeline", "data-parallel").
    """
    mine = to_bytes_tensor(fingerprint(schedule, extra).encode()[: _BYTES - 4], _BYTES, device)
    size = dist.get_world_size(group)
    kept = _BUFFERS.setdefault(
        (str(device), size), [torch.empty_like(mine) for _ in range(size + 1)]
    )
    buf, gathered = kept[0].copy_(mine), kept[1:]
    rank = dist.get_rank(group)
    try:
        work = dist.all_gather(gathered, buf, group=group, async_op=True)
        assert work is not None, "async_op=True returns a Work"
        work.wait(datetime.timedelta(seconds=timeout))
    except RuntimeError as exc:
        raise CommTimeout(
            f"rank {rank}: not every rank of the {what} group reached its first step within "
            f"{timeout:g} s to agree on the schedule; one probably failed before it (see its "
            f"error) or never calls step(). [{str(exc).strip()[:300]}]"
        ) from exc
    seen: dict[str, list[int]] = {}
    for r, t in enumerate(gathered):
        text = from_bytes_tensor(t).decode(errors="replace")
        seen.setdefault(text, []).append(r)
    if len(seen) > 1:
        sides = "; ".join(f"{_ranks(rs)} {text}" for text, rs in seen.items())
        raise ValueError(
            f"rank {rank}: the ranks of the {what} group were built with different schedules: "
            f"{sides}. Every rank must build the same schedule (the same name, pp, "
            "microbatches and placement), or their transfers never meet"
        )


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks)) + " run"
