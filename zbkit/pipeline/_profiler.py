"""torch.profiler Chrome traces of a pipeline run, read back as a zbkit `Trace`.

    # on every rank (e.g. under torchrun), around one step:
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        schedule.step(...)
    prof.export_chrome_trace(f"trace_rank{rank}.json")      # .json.gz is read too
    # later, anywhere:
    trace = Trace.from_profiler("traces/")                  # a folder, a file, or a list

What names an action in a trace, looked for in this order on each rank:

    PP:0F3, PP:(0F1;1B0)OVERLAP_F_B   torch's runtime schedules (Interleaved1F1B, the
                                      zero-bubble ones, ZBV, DualPipeV) run every action
                                      inside record_function("PP:<action>")
    0F3                               zbkit's runners (one range per action, also per half
                                      of an overlapped pair)
    Forward 3, Backward 3             torch's ScheduleGPipe: ranges of the rank's one stage
    ...stage.py(857): forward_one_chunk  torch's Schedule1F1B marks nothing: profiled with
                                      with_stack=True, its stage's method calls show; the
                                      k-th forward (backward) of a step is microbatch k

For the last two the stage comes from `schedule` (the rank's one stage), or is the rank
(torch's single-stage schedules put stage r on rank r). A rank is its file's (torch writes
it in ``distributedInfo``), or with `schedule` the rank it places the stage on: one file
of a single-process run (`LocalPipeline`) holds every rank's actions. An overlapped pair's
halves run one after the other inside its range: they are split where the backward's
first autograd function starts (the middle of the range when the trace has no CPU ops).

Times: the traces' ``ts`` are microseconds of one clock per host (the ranks of one host
line up); the earliest action is put at 0 and times are seconds, as in every `Trace`.
On CPU an action's time is its range's, and torch's runtime waits for a received input
inside the action that consumes it, so a wait shows as compute. Where the trace has CUDA
activity, an action's time is its device time: the span of the kernels (and copies)
launched inside its range, found by the launch's ``correlation`` id (what the trace's
``ac2g`` arrows join); NCCL kernels are left out, their span is a wait on the peer.

Communication: torch's transfer actions (``PP:0SEND_F0``, ``PP:1RECV_B2``) go into
`Trace.comm` as their ranges (posting a send or a receive; the wait is in the compute
action, above). The single-stage schedules' and zbkit's transfers are not read.
Memory is not in a profile: `Trace.memory_for(costs)` weighs the actions by the costs' rule.

This module reads and `Trace.from_profiler` builds: it hands back each rank's events and
transfers (`RankProfile`), so imports run one way, trace -> _profiler.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
from collections.abc import Iterable
from os import PathLike
from pathlib import Path
from typing import Any, NamedTuple

from zbkit.schedules import CommEvent, Event, Schedule

US = 1e-6  # Chrome traces count microseconds; a Trace counts seconds
Paths = str | PathLike | Iterable[str | PathLike]

_ACTION = r"(\d+)([FIBW])(\d+)"
_RUNTIME = re.compile(rf"^PP:{_ACTION}$")  # torch's _get_profiler_function_name
_ZBKIT = re.compile(rf"^{_ACTION}$")  # zbkit's StepState.run
_OVERLAP = re.compile(r"^PP:\((\d+[FIBW]\d+);(\d+[FIBW]\d+)\)OVERLAP_F_B$")
_TRANSFER = re.compile(r"^PP:(\d+(?:SEND|RECV)_[FB]\d+)$")
_GPIPE = re.compile(r"^(Forward|Backward) (\d+)$")
_METHOD = re.compile(  # python_function events of torch's stage methods (with_stack=True)
    r"pipelining/stage\.py\(\d+\): "
    r"(forward_one_chunk|backward_one_chunk|backward_weight_one_chunk)$"
)
_GPU = {"kernel", "gpu_memcpy", "gpu_memset"}  # device activity, by correlation id
_LAUNCH = {"cuda_runtime", "cuda_driver"}  # cudaLaunchKernel, cudaMemcpyAsync, cuLaunchKernel
# on the GPU's rows: the activity, and Kineto's copies of the host ranges around it
_DEVICE_SIDE = {*_GPU, "gpu_user_annotation"}
_HOW = (
    "record a step as: with torch.profiler.profile(activities=[ProfilerActivity.CPU, "
    "ProfilerActivity.CUDA]) as prof: schedule.step(...), then prof.export_chrome_trace(path)"
)


class Span(NamedTuple):
    """One compute action as a trace shows it (microseconds, the trace's clock)."""

    stage: int
    kind: str
    microbatch: int
    start: float
    end: float
    paired: bool = False  # a half of torch's OVERLAP_F_B


class RankProfile(NamedTuple):
    """What one rank's trace file holds, in seconds of the trace's clock (not yet from 0)."""

    events: list[Event]  # compute actions, in the order they ran
    comm: list[CommEvent]  # torch's transfer actions


def read_profiles(
    paths: Paths,
    schedule: Any = None,
    *,
    ranks: list[int] | None = None,
    step: int = -1,
) -> list[RankProfile]:
    """For `Trace.from_profiler`: every rank's compute actions (and torch's transfers) from
    its Chrome trace, one `RankProfile` a file (see the module doc)."""
    files = _files(paths)
    if schedule is not None and not isinstance(schedule, Schedule):
        schedule = Schedule.from_torch(schedule)  # a torch schedule object
    if ranks is not None and len(ranks) != len(files):
        raise ValueError(f"ranks={ranks} names {len(ranks)} ranks for {len(files)} trace files")
    seen: dict[int, Path] = {}
    per_rank = []
    for i, path in enumerate(files):
        doc = load(path)
        rank = _rank_of(doc, i, ranks)
        if rank in seen:
            raise ValueError(
                f"{seen[rank]} and {path} are both rank {rank}; pass ranks=[...] (one per "
                "file, in order) to say which pipeline rank each file is"
            )
        seen[rank] = path
        per_rank.append(_rank_profile(doc["traceEvents"], rank, schedule, step, path))
    return per_rank


# ---------------------------------------------------------------------------- files
def _files(paths: Paths) -> list[Path]:
    """The trace files: a folder's .json and .json.gz files (rank2 before rank10), one file,
    or a list of files."""
    if isinstance(paths, str | PathLike):
        path = Path(paths)
        if not path.is_dir():
            return [path]
        found = [p for p in path.iterdir() if p.name.endswith((".json", ".json.gz"))]
        if not found:
            raise FileNotFoundError(f"no .json or .json.gz trace files in {path}")
        return sorted(
            found, key=lambda p: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]
        )
    files = [Path(p) for p in paths]
    if not files:
        raise ValueError("from_profiler needs at least one trace file (one per rank)")
    return files


def load(path: Path) -> dict[str, Any]:
    """A Chrome trace's JSON object (gzip-compressed if its name ends in .gz); ValueError
    saying what the file is otherwise."""
    opener: Any = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            doc = json.load(f)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{path}: not a Chrome trace (not JSON: {err.msg} at line {err.lineno})"
        ) from None
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as err:
        raise ValueError(f"{path}: not a Chrome trace ({type(err).__name__}: {err})") from None
    if isinstance(doc, list):  # the format's bare-array form
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        found = f"keys {sorted(doc)[:6]}" if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(
            f"{path}: not a Chrome trace: expected a JSON object with a 'traceEvents' list, "
            f"found {found}"
        )
    return doc


def _rank_of(doc: dict[str, Any], index: int, ranks: list[int] | None) -> int:
    """`ranks[index]` if given, else the rank torch.profiler wrote (distributedInfo, present
    when torch.distributed was initialised), else the file's position."""
    if ranks is not None:
        return int(ranks[index])
    info = doc.get("distributedInfo") or {}
    return int(info["rank"]) if "rank" in info else index


# ---------------------------------------------------------------------------- one rank
def _rank_profile(
    events: list[dict], rank: int, schedule: Schedule | None, step: int, path: Path
) -> RankProfile:
    host = [
        e for e in events if e.get("ph") == "X" and "dur" in e and e.get("cat") not in _DEVICE_SIDE
    ]
    ranges = _in_step(host, step, path)
    spans = _spans(ranges, rank, schedule)
    if not spans:
        raise ValueError(f"{path} (rank {rank}): {_nothing_found(ranges)}; {_HOW}")
    _check_once(spans, rank, path)
    spans = _device_times(spans, events, _pid(ranges, spans))
    place = _placement(schedule, spans, rank, path)
    actions = [
        Event(place[s.stage], s.stage, s.kind, s.microbatch, s.start * US, s.end * US, s.paired)
        for s in sorted(spans, key=lambda s: s.start)
    ]
    transfers = [
        CommEvent(rank, m.group(1), e["ts"] * US, (e["ts"] + e["dur"]) * US)
        for e in sorted(ranges, key=lambda e: e["ts"])
        if (m := _TRANSFER.match(str(e.get("name", ""))))
    ]
    return RankProfile(actions, transfers)


def _in_step(ranges: list[dict], step: int, path: Path) -> list[dict]:
    """The ranges inside the `step`-th ProfilerStep (torch marks one per `prof.step()`); all
    of them when the trace marks no steps."""
    steps = sorted((e for e in ranges if str(e.get("name", "")).startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])  # fmt: skip
    if not steps:
        return ranges
    if not -len(steps) <= step < len(steps):
        raise ValueError(f"{path}: step={step}, but the trace holds {len(steps)} ProfilerSteps")
    lo, hi = steps[step]["ts"], steps[step]["ts"] + steps[step]["dur"]
    return [e for e in ranges if lo <= e["ts"] <= hi]


def _spans(ranges: list[dict], rank: int, schedule: Schedule | None) -> list[Span]:
    """The rank's compute actions, from the first kind of name the trace has (module doc)."""
    named = [(e, str(e.get("name", ""))) for e in sorted(ranges, key=lambda e: e["ts"])]
    out: list[Span] = []
    for e, name in named:  # torch's runtime, then zbkit's names
        m = _RUNTIME.match(name) or _ZBKIT.match(name)
        if m:
            out.append(Span(int(m[1]), m[2], int(m[3]), e["ts"], e["ts"] + e["dur"]))
        elif m := _OVERLAP.match(name):
            out += _split_pair(e, m[1], m[2], ranges)
    if out:
        return out
    gpipe = [(e, m) for e, name in named if (m := _GPIPE.match(name))]
    if gpipe:
        stage = _stage_of(schedule, rank)
        return [Span(stage, m[1][0], int(m[2]), e["ts"], e["ts"] + e["dur"]) for e, m in gpipe]
    calls = [(e, m[1]) for e, name in named if (m := _METHOD.search(name))]
    return _counted(calls, _stage_of(schedule, rank)) if calls else []


def _counted(calls: list[tuple[dict, str]], stage: int) -> list[Span]:
    """Schedule1F1B's stage-method calls as actions: the k-th forward (backward, weight)
    call is microbatch k; a backward is I where W calls follow it, else B."""
    split = any(method == "backward_weight_one_chunk" for _, method in calls)
    kinds = {"forward_one_chunk": "F", "backward_one_chunk": "I" if split else "B",
             "backward_weight_one_chunk": "W"}  # fmt: skip
    count: dict[str, int] = {}
    out = []
    for e, method in calls:
        kind = kinds[method]
        count[kind] = count.get(kind, 0) + 1
        out.append(Span(stage, kind, count[kind] - 1, e["ts"], e["ts"] + e["dur"]))
    return out


def _split_pair(e: dict, first: str, second: str, ranges: list[dict]) -> list[Span]:
    """The halves of torch's OVERLAP_F_B range, run one after the other: split where the
    backward half's first autograd function starts (or the last one ends, when the backward
    runs first); in the middle when the trace has no CPU ops inside."""
    start, end = e["ts"], e["ts"] + e["dur"]
    a, b = (_parse(first), _parse(second))
    engine = [r for r in ranges if start <= r["ts"] <= end and r.get("pid") == e.get("pid")
              and str(r.get("name", "")).startswith("autograd::engine::")]  # fmt: skip
    if not engine:
        cut = (start + end) / 2
    elif a[1] == "F":  # the forward first: the backward starts with the autograd engine
        cut = min(r["ts"] for r in engine)
    else:
        cut = max(r["ts"] + r["dur"] for r in engine)
    return [Span(*a, start, cut, True), Span(*b, cut, end, True)]


def _parse(text: str) -> tuple[int, str, int]:
    m = _ZBKIT.match(text)
    assert m is not None, f"{text}: matched by _OVERLAP as an action"
    return int(m[1]), m[2], int(m[3])


def _placement(schedule: Schedule | None, spans: list[Span], rank: int, path: Path) -> list[int]:
    """stage -> rank: the file's rank, or the schedule's placement when one is given (a
    single-process run, e.g. `LocalPipeline`, holds the actions of every rank in one file)."""
    most = max(s.stage for s in spans)
    if schedule is None:
        return [rank] * (most + 1)
    if most >= schedule.num_stages:
        raise ValueError(
            f"{path}: the trace runs stage {most}, but {schedule.name!r} has "
            f"{schedule.num_stages} stages"
        )
    beyond = max(s.microbatch for s in spans)
    if beyond >= schedule.microbatches:  # counted stage calls of several steps run on
        raise ValueError(
            f"{path}: the trace runs microbatch {beyond}, but {schedule.name!r} has "
            f"{schedule.microbatches}: it holds several steps; profile one step, or call "
            "prof.step() after each and pick one with step="
        )
    return list(schedule.stage_to_rank)


def _stage_of(schedule: Schedule | None, rank: int) -> int:
    """The one stage on `rank` of a single-stage schedule; the rank itself without one."""
    if schedule is None:
        return rank
    stages = schedule.stages_on(rank)
    if len(stages) != 1:
        raise ValueError(
            f"rank {rank} holds stages {stages} in {schedule.name!r}, but 'Forward i' / "
            "stage-method ranges name no stage: only a single-stage schedule (one stage per "
            "rank) is read from them"
        )
    return stages[0]


def _check_once(spans: list[Span], rank: int, path: Path) -> None:
    seen: set[tuple[int, str, int]] = set()
    for s in spans:
        key = (s.stage, s.kind, s.microbatch)
        if key in seen:
            raise ValueError(
                f"{path} (rank {rank}): {s.stage}{s.kind}{s.microbatch} ran twice: the trace "
                "holds several steps; profile one step, or call prof.step() after each "
                "(torch marks ProfilerStep#N) and pick one with step="
            )
        seen.add(key)


def _nothing_found(ranges: list[dict]) -> str:
    """What the trace holds instead of pipeline actions, for the error message."""
    cats: dict[str, int] = {}
    for e in ranges:
        cats[str(e.get("cat"))] = cats.get(str(e.get("cat")), 0) + 1
    names = sorted({str(e.get("name")) for e in ranges if e.get("cat") == "user_annotation"})
    found = (
        ", ".join(f"{n} {c}" for c, n in sorted(cats.items())) + " ranges" if cats else "no ranges"
    )
    marks = f" (annotations: {', '.join(names[:5])})" if names else ""
    return (
        "no pipeline actions: no PP:<action> ranges (torch's runtime schedules), zbkit action "
        "names, 'Forward i'/'Backward i' (ScheduleGPipe) or stage-method calls (Schedule1F1B, "
        f"profiled with with_stack=True); found {found}{marks}"
    )


# ---------------------------------------------------------------------------- device time
def _pid(ranges: list[dict], spans: list[Span]) -> Any:
    """The process the actions ran in (the launches counted are this process's)."""
    first = min(spans, key=lambda s: s.start)
    return next((e.get("pid") for e in ranges if e["ts"] == first.start), None)


def _device_times(spans: list[Span], events: list[dict], pid: Any) -> list[Span]:
    """Each action's device time where kernels were launched inside its range: from the
    first kernel's start to the last one's end (NCCL's left out: a wait on the peer)."""
    gpu: dict[Any, list[dict]] = {}
    for e in events:
        if e.get("cat") in _GPU and not str(e.get("name", "")).startswith("nccl"):
            gpu.setdefault((e.get("args") or {}).get("correlation"), []).append(e)
    if not gpu:
        return spans
    launches = sorted(
        (e["ts"], (e.get("args") or {}).get("correlation"))
        for e in events
        if e.get("cat") in _LAUNCH and e.get("pid") == pid
    )
    times = [t for t, _ in launches]
    out = []
    for s in spans:
        lo, hi = bisect.bisect_left(times, s.start), bisect.bisect_right(times, s.end)
        kernels = [k for _, c in launches[lo:hi] for k in gpu.get(c, ())]
        if kernels:
            s = s._replace(start=min(k["ts"] for k in kernels),
                           end=max(k["ts"] + k["dur"] for k in kernels))  # fmt: skip
        out.append(s)
    return out
