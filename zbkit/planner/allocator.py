"""What torch's own allocator did while some code ran: each allocation and free, in order.

On CUDA the allocator keeps counters (`torch.cuda.memory_allocated`); on the CPU it keeps
none, but `torch.profiler` with ``profile_memory=True`` records every allocation and free
with its bytes and time. `watch(fn)` runs `fn` under the profiler and returns those changes
and the spans of the `torch.profiler.record_function` marks `fn` set, so a caller reads the
bytes live at the end of each mark: the oracle the planner's byte counts are held to.

Each profiler start and stop makes torch's Kineto print a `USDT: ... profiler_start` line to
stderr; a profile runs hundreds, which bury a notebook cell's output. Importing this module
sets `KINETO_LOG_LEVEL=6` (above Kineto's highest level, 5, USDT), unless it is set already:
Kineto reads it when the process first profiles.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from itertools import accumulate

import torch
from torch.profiler import ProfilerActivity, profile

__all__ = ["Watched", "settle", "watch"]

os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # before the first profile (module docstring)


@dataclass(frozen=True)
class Watched:
    """The allocator's changes while `fn` ran (bytes, + allocated, - freed, in time order)
    and each mark's (start, end) on the same clock."""

    changes: list[tuple[int, int]]  # (time in ns, bytes)
    marks: dict[str, tuple[int, int]]

    def live_at(self, time: int) -> int:
        """Bytes allocated since the watch began and still held at `time`."""
        return sum(b for t, b in self.changes if t <= time)

    def after(self, mark: str) -> int:
        """Bytes allocated since the watch began and still held when `mark` ended."""
        return self.live_at(self.marks[mark][1])

    def peak_within(self, mark: str) -> int:
        """The most bytes held at once while `mark` ran (counted from the watch's start)."""
        start, end = self.marks[mark]
        level = self.live_at(start)
        most = level
        for t, b in self.changes:
            if start < t <= end:
                level += b
                most = max(most, level)
        return most

    def held(self) -> int:
        """Bytes allocated since the watch began and still held when it ended."""
        return sum(b for _, b in self.changes)

    def peak(self) -> int:
        """The most bytes held at once above what was held when the watch began."""
        return max(0, max(accumulate(b for _, b in self.changes), default=0))


def watch(fn: Callable[[], object], device: torch.device) -> Watched:
    """Run `fn` under `torch.profiler`, recording the allocator's events on `device`."""
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, profile_memory=True) as prof:
        fn()
    changes, marks = [], {}
    for event in _walk(prof.profiler.kineto_results.experimental_event_tree()):
        extra = event.extra_fields
        if hasattr(extra, "alloc_size"):  # an allocation (+) or a free (-)
            if _on(extra, device):
                changes.append((event.start_time_ns, int(extra.alloc_size)))
        elif event.name.startswith("zbkit."):
            marks[event.name] = (event.start_time_ns, event.end_time_ns)
    changes.sort(key=lambda c: c[0])
    return Watched(changes, marks)


def _walk(nodes) -> list:
    out, todo = [], list(nodes)
    while todo:
        node = todo.pop()
        out.append(node)
        todo.extend(node.children)
    return out


def _on(extra, device: torch.device) -> bool:
    """Whether an allocation event is on `device` (CPU: the host allocator)."""
    kind = str(getattr(extra, "device_type", "")).lower()
    return ("cuda" in kind) == (device.type == "cuda")


def settle(device: torch.device) -> None:
    """Keep a CPU process's freed memory for reuse, as torch's CUDA allocator does, so that
    its times are a long run's and the same from run to run.

    glibc hands large freed chunks back to the system and serves the next large allocation
    from fresh pages, each faulted in when first written; when it does depends on what the
    process freed before. Measured on the benchmark's model: the LM head's input pass took
    13 ms or 19 ms by that alone, in one process and the next. Fixing glibc's thresholds
    (`mallopt`: nothing trimmed, chunks up to 32 MiB from the heap) makes it 13 ms every
    time. Process-wide and kept: a process that profiled holds its peak's pages until it
    exits. Nothing is done on CUDA, or where the C library is not glibc."""
    if device.type != "cpu":
        return
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return
    mallopt(_M_TRIM_THRESHOLD, -1)  # -1: never trim the heap's top
    mallopt(_M_MMAP_THRESHOLD, 32 * 2**20)  # glibc's ceiling for it


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


@cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None)
