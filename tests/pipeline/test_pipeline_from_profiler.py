"""Trace.from_profiler: torch.profiler Chrome traces read back as a zbkit Trace (issue 25).

The oracles: torch's own `pipeline_order` for its runtime schedules (what each rank runs,
and the transfers of `pipeline_order_with_comms`), zbkit's `trace_torch` recorder on the
same profiled step for the single-stage schedules, and a hand-written CUDA trace whose
kernel spans are known. One launch of two gloo ranks runs every torch case."""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import torch

from zbkit.launch import launch
from zbkit.pipeline import LocalPipeline, PipelineStage, Trace, schedule_of_trace
from zbkit.schedules import Overlap, build_schedule, simulate, validate
from zbkit.schedules.measure import hop_latency, measured_costs

cloudpickle.register_pickle_by_value(sys.modules[__name__])

FIXTURE = Path(__file__).parent / "fixtures" / "cuda_rank0.json"
# (torch class, stages per rank, with_stack): the runtime's PP:<action> ranges (DualPipeV's
# with OVERLAP_F_B pairs), GPipe's "Forward i" ranges, Schedule1F1B's stage-method calls (it
# marks no ranges)
CASES = [
    ("ScheduleInterleavedZeroBubble", 2, False),
    ("ScheduleDualPipeV", 2, False),
    ("ScheduleGPipe", 1, False),
    ("Schedule1F1B", 1, True),
]
M, DIM = 4, 32


def profiled_runs(out_dir: str) -> list[dict]:
    """Per case, on this rank: one warm-up step, then one step under torch.profiler (and
    zbkit's trace_torch), its Chrome trace written as torchtitan does, one file per rank."""
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage as TorchStage
    from torch.distributed.pipelining import schedules as torch_schedules

    from zbkit.pipeline import trace_torch

    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    report = []
    for cls_name, v, with_stack in CASES:
        n = v * world
        torch.manual_seed(0)
        mods = [nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh()) for _ in range(n)]
        mine = [rank + k * world for k in range(v)]  # looped: rank r holds r, r + p, ...
        if cls_name == "ScheduleDualPipeV":
            mine = [rank, n - 1 - rank]  # a V
        stages = [TorchStage(mods[s], s, n, torch.device("cpu")) for s in mine]
        cls = getattr(torch_schedules, cls_name)
        loss = lambda out, y: (out - y).pow(2).mean()  # noqa: E731
        schedule = cls(stages[0] if v == 1 else stages, M, loss_fn=loss)
        x, y = torch.randn(4 * M, DIM), torch.randn(4 * M, DIM)

        def step(schedule=schedule, first=0 in mine, last=n - 1 in mine, x=x, y=y) -> None:
            schedule.step(*((x,) if first else ()), **({"target": y} if last else {}))

        step()  # torch agrees shapes on its first step
        activities = [torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=activities, with_stack=with_stack) as prof:
            with trace_torch(schedule) as rec:
                step()
        suffix = ".json.gz" if rank == 1 else ".json"  # torch gzips a .gz name
        prof.export_chrome_trace(f"{out_dir}/{cls_name}/trace_rank{rank}{suffix}")
        order = getattr(schedule, "pipeline_order_with_comms", None) or {}
        ops = [str(a) for a in order.get(rank, []) if a is not None]
        report.append(
            {
                "recorded": [e.label for e in rec.trace.events],
                "torch_compute": [  # an OVERLAP_F_B pair: its halves, in order
                    str(half)
                    for a in schedule.pipeline_order[rank]
                    if a is not None and a.is_compute_op
                    for half in (a.sub_actions or (a,))
                ],
                "torch_transfers": [op for op in ops if "SEND" in op or "RECV" in op],
            }
        )
        dist.barrier()
    return report


def _check_times(trace: Trace) -> None:
    """From 0; per rank, each action after the one before it (no overlap)."""
    assert min(e.start for e in trace.events) == 0.0
    for r in range(trace.num_ranks):
        mine = sorted((e for e in trace.events if e.rank == r), key=lambda e: e.start)
        assert all(e.start <= e.end for e in mine)
        assert all(a.end <= b.start for a, b in zip(mine, mine[1:], strict=False)), r


def _draw(runs: list[tuple[Trace, Any]]) -> None:
    """plot_schedule (beside and over the simulation) and RunViewer show each read trace: a
    box per action and per simulated one, a bar per wait on a receive, the run's own numbers.
    Called after every other check: without the notebook extra only this part is skipped."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("ipywidgets")
    from zbkit import viz
    from zbkit.widgets import RunViewer

    for trace, sim in runs:
        beside = viz.plot_schedule(trace, simulation=sim, comm=True)
        layers = {c.get_gid(): c for c in beside.axes[0].collections}
        assert len(layers["actions"].get_paths()) == len(trace.events) + len(sim.events)
        waits = sum(c.end > c.start for c in [*trace.comm, *sim.comm])  # the run's, the sim's
        if waits:
            assert len(layers["comm"].get_paths()) == waits
        else:
            assert "comm" not in layers  # no bar drawn where nothing was waited for
        over = viz.plot_schedule(trace, simulation=sim, compare="overlay")
        layers = {c.get_gid(): c for c in over.axes[0].collections}
        assert len(layers["actions"].get_paths()) == len(trace.events)
        assert len(layers["simulated"].get_paths()) == len(sim.events)
        numbers = RunViewer(trace, sim).numbers.value
        assert f"run: makespan {trace.makespan:.4g}, bubble {trace.bubble_rate:.1%}" in numbers
        assert f"sim: makespan {sim.makespan:.4g}, bubble {sim.bubble_rate:.1%}" in numbers


@pytest.mark.multiprocess
def test_from_profiler_reads_torchs_runs_in_torchs_order(tmp_path: Path) -> None:
    for cls_name, _, _ in CASES:
        (tmp_path / cls_name).mkdir()
    out = launch(profiled_runs, str(tmp_path), nprocs=2, timeout=300)
    drawn = []
    for i, (cls_name, _, with_stack) in enumerate(CASES):
        folder = tmp_path / cls_name
        # stage calls name no stage: the schedule places them (GPipe's: stage r on rank r)
        schedule = build_schedule("1f1b", pp=2, microbatches=M) if with_stack else None
        trace = Trace.from_profiler(folder, schedule)
        for r in range(2):
            got = [e.label for e in trace.events if e.rank == r]
            assert got == out[r][i]["recorded"], (cls_name, r)  # zbkit's recorder
            if cls_name != "Schedule1F1B":  # torch's program (its drawn 1F1B is off by one)
                assert got == out[r][i]["torch_compute"], (cls_name, r)
            comm = [c.label for c in sorted(trace.comm, key=lambda c: c.start) if c.rank == r]
            assert comm == out[r][i]["torch_transfers"], (cls_name, r)  # none: single-stage
        _check_times(trace)
        # the same files, ranks given, read the same
        files = sorted(folder.iterdir())
        assert [p.name for p in files] == ["trace_rank0.json", "trace_rank1.json.gz"]
        assert Trace.from_profiler(files, ranks=[0, 1]).events == trace.events
        # the program it ran, checked and simulated with its own measured costs
        placement = {e.stage: e.rank for e in trace.events}
        ran = schedule_of_trace(trace, [placement[s] for s in range(len(placement))])
        validate(ran)
        pairs = [a for r in range(2) for a in ran.program[r] if isinstance(a, Overlap)]
        assert bool(pairs) == (cls_name == "ScheduleDualPipeV")
        costs = measured_costs(trace.events, ran.num_stages, comm=hop_latency(trace.events))
        sim = simulate(ran, costs)
        assert 0.0 <= trace.bubble_rate < 1.0 and sim.makespan > 0
        drawn.append((trace, sim))
    _draw(drawn)


def test_from_profiler_gives_device_times_from_the_kernels() -> None:
    """The fixture: CPU ranges PP:0F0, an overlapped pair, PP:0B1, with runtime launches
    linked to kernels by correlation (and ac2g flows), and Kineto's GPU-side copies of two
    ranges (gpu_user_annotation: not actions); times in microseconds from 1000."""
    trace = Trace.from_profiler(FIXTURE)
    us = [(e.label, e.paired, round(e.start * 1e6), round(e.end * 1e6)) for e in trace.events]
    assert us == [
        ("0F0", False, 0, 60),  # two kernels: 1080..1140, not the host's 1000..1100
        ("0F1", True, 170, 210),  # the pair's forward half: its kernel, not the NCCL wait
        ("0B0", True, 250, 310),  # launched from autograd's thread after the split at 1300
        ("0B1", False, 480, 490),  # a device copy
    ]
    assert [(c.label, round(c.start * 1e6), round(c.end * 1e6)) for c in trace.comm] == [
        ("0SEND_F0", 20, 30)
    ]
    assert trace.events == Trace.from_profiler([FIXTURE], step=0).events  # its one ProfilerStep


def test_from_profiler_reads_gzip_and_zbkit_runs(tmp_path: Path) -> None:
    packed = tmp_path / "cuda_rank0.json.gz"
    with open(FIXTURE, "rb") as f, gzip.open(packed, "wb") as g:
        shutil.copyfileobj(f, g)
    assert Trace.from_profiler(packed).events == Trace.from_profiler(FIXTURE).events
    # a single-process zbkit run: one file; the schedule puts each stage on its rank
    torch.manual_seed(0)
    sch = build_schedule("zb-h1", pp=2, microbatches=4)
    mods = [torch.nn.Linear(8, 8) for _ in range(2)]
    pipe = LocalPipeline([PipelineStage(m, s, 2) for s, m in enumerate(mods)], sch, _mse)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        pipe.step(torch.randn(16, 8), torch.randn(16, 8))
    prof.export_chrome_trace(str(tmp_path / "zbkit.json"))
    trace = Trace.from_profiler(tmp_path / "zbkit.json", sch)
    for r in range(2):
        got = [e.label for e in trace.events if e.rank == r]
        assert got == [e.label for e in pipe.trace.events if e.rank == r]
    _check_times(trace)


def _mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (out - y).pow(2).mean()


def test_from_profiler_errors_say_what_was_found(tmp_path: Path) -> None:
    def refused(path: Path | list[Path], match: str, **options) -> None:
        with pytest.raises(ValueError, match=match) as caught:
            Trace.from_profiler(path, **options)
        assert "\n" not in str(caught.value)  # one line

    text = tmp_path / "notes.json"
    text.write_text("epoch 1: loss 0.3")
    refused(text, r"notes.json: not a Chrome trace \(not JSON")
    other = tmp_path / "config.json"
    other.write_text(json.dumps({"lr": 0.1}))
    refused(other, r"not a Chrome trace: expected a JSON object with a 'traceEvents' list")
    bare = tmp_path / "bare.json"
    ops = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0,
            "dur": 5}, {"ph": "X", "cat": "user_annotation", "name": "gloo:send", "pid": 1,
            "tid": 1, "ts": 6, "dur": 2}]  # fmt: skip
    bare.write_text(json.dumps({"traceEvents": ops}))
    found = r"found 1 cpu_op, 1 user_annotation ranges \(annotations: gloo:send\)"
    refused(bare, rf"no pipeline actions: no PP:<action> ranges.*; {found}; .*torch.profiler")
    refused([FIXTURE, FIXTURE], r"cuda_rank0.json and .*cuda_rank0.json are both rank 0")
    refused([FIXTURE], r"ranks=\[0, 1\] names 2 ranks for 1 trace files", ranks=[0, 1])
    refused(FIXTURE, r"step=2, but the trace holds 1 ProfilerSteps", step=2)
    twice = tmp_path / "twice.json"
    doc = json.loads(FIXTURE.read_text())
    ranges = [e for e in doc["traceEvents"] if e["ph"] == "X" and "Step" not in e["name"]]
    doc["traceEvents"] = ranges + [dict(e, ts=e["ts"] + 10_000) for e in ranges]  # 2 steps
    twice.write_text(json.dumps(doc))
    refused(twice, r"0F0 ran twice: the trace holds several steps")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no .json or .json.gz trace files"):
        Trace.from_profiler(empty)
