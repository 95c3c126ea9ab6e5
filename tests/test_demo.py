"""`zbkit demo`: real pipelines agree with one process, the timed comparison reads like the
simulation of the same costs, the tables and the HTML report are there.

The multi-process test runs the demo's own `main` (2 ranks, 2 schedules, 4 microbatches,
synthetic timing) and reads what it printed; the oracle for the gradients is plain
single-process training, which the demo computes and prints the difference from. The fast tests
check the pieces the tables are made of against the simulator: runs whose events are their
simulation's read back the simulated speed-ups. No test asserts a measured time.
"""

from __future__ import annotations

import argparse
import json
import os
import re

import pytest
import torch

from zbkit import demo
from zbkit.demo import _report
from zbkit.models import TinyTransformer, split_stages, stage_spans
from zbkit.pipeline import Trace
from zbkit.schedules import Costs, bubble_rate, build_schedule, simulate
from zbkit.schedules.measure import hop_latency, measured_costs


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.multiprocess
def test_demo_runs_pipelines_and_writes_the_report(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # a busy machine, whatever this one's load is now: the notes below say what that means
    # (read in this process; a quiet reading is tested with fake readings in test_machine.py)
    monkeypatch.setattr(os, "getloadavg", lambda: (2.0 * demo.cores(), 0.0, 0.0))
    out_dir = tmp_path / "report"
    argv = ["--ranks", "2", "--schedules", "1f1b,zb-v", "--microbatches", "4", "--rounds", "1",
            "--timing", "synthetic", "--stage-ms", "20"]  # fmt: skip
    code = demo.main(_args(*argv, "--out", str(out_dir)))
    out = capsys.readouterr().out
    assert code == 0, out
    assert "Timing on synthetic stages" in out and "sleep (no CPU work)" in out
    # the machine read beside each table: the (busy) load on this machine's cores, 2 ranks
    notes = [line for line in out.splitlines() if line.startswith("machine ")]
    assert len(notes) == 2, out  # after the timed table (stages sleep), after the real one
    assert all(f"on {demo.cores()} cores, 2 ranks" in n for n in notes), notes
    assert "the stages sleep" in notes[0] and "the stages sleep" not in notes[1]

    # the timed table: speed-ups over 1f1b, measured and simulated, and their ratio
    lines = out.splitlines()
    head = lines.index(next(line for line in lines if line.startswith("schedule  step ms")))
    timed = {line.split()[0]: line.split() for line in lines[head + 1 : head + 3]}
    assert timed["1f1b"][3:6] == ["1.00x", "1.00x", "1.00"], timed
    run, sim, ratio = (float(c.rstrip("x")) for c in timed["zb-v"][3:6])
    assert ratio == pytest.approx(run / sim, abs=0.011), timed  # rounded to 2 places
    step, sim_ms = float(timed["zb-v"][1]), float(timed["zb-v"][2])
    assert sim == pytest.approx(float(timed["1f1b"][2]) / sim_ms, abs=0.006)
    assert run == pytest.approx(float(timed["1f1b"][1]) / step, abs=0.006)

    # the real transformer: gradients equal to one process, memory in counts and bytes
    real_head = lines.index(next(line for line in lines[head + 1 :] if line.startswith("schedule")))
    real = {line.split()[0]: line for line in lines[real_head + 1 : real_head + 3]}
    assert set(real) == {"1f1b", "zb-v"}, lines[real_head : real_head + 3]
    for name, line in real.items():
        assert float(line.split()[-1]) < 1e-6, f"{name}: gradient differs from one process"
        assert line.split()[-2] in ("KiB", "MiB"), line
    # peak held per rank, run | sim: 1f1b holds pp - rank microbatches (closed form)
    # one unit for both: rank-microbatches (a zb-v chunk holds half of one), run as sim
    assert "2 1 | 2 1" in real["1f1b"] and all(" rank-microbatches " in r for r in real.values())
    held = re.search(r"([\d.]+ [\d.]+) \| ([\d.]+ [\d.]+)", real["zb-v"])
    assert held and held[1] == held[2] and max(map(float, held[1].split())) <= 2, real["zb-v"]
    assert "Real timings differ" in out and "OK" in out.split("Part 2")[1]

    # the report: one file, the plots inlined (synthetic and real per schedule), graph as SVG
    html = (out_dir / "index.html").read_text()
    assert f"report: {out_dir / 'index.html'}" in out
    assert len(re.findall(r'src="data:image/png;base64,[A-Za-z0-9+/=]{1000,}"', html)) == 4
    assert "<svg" in html and "group 0" in html and "one box per layer" in html
    assert "id=1f1b" in html and "id=zb-v" in html
    assert 'src="http' not in html  # self-contained: nothing fetched
    assert html.count("<p>machine ") == 2  # the same notes in the report
    chrome = json.loads((out_dir / "trace-zb-v.json").read_text())["traceEvents"]
    actions = [e for e in chrome if e.get("ph") == "X" and e.get("tid") == 0]
    assert len(actions) == 3 * 4 * 4  # F, I, W of 4 microbatches on zb-v's 2 x 2 stages


def test_bad_options_are_named_before_any_process_starts(capsys):
    assert demo.main(_args("--ranks", "1", "--dim", "8", "--tokens", "2")) == 2
    assert "at least 2 ranks" in capsys.readouterr().err
    assert demo.main(_args("--schedules", "1f1b,nope", "--dim", "8", "--tokens", "2")) == 2
    assert "nope" in capsys.readouterr().err
    assert demo.main(_args("--layers", "4", "--dim", "8", "--tokens", "2")) == 2  # zb-v: 8
    assert "--layers 4" in capsys.readouterr().err
    assert demo.main(_args("--stage-ms", "0", "--dim", "8", "--tokens", "2")) == 2
    assert "--stage-ms" in capsys.readouterr().err
    assert demo.main(_args("--dim", "10", "--heads", "4", "--split-only")) == 2
    captured = capsys.readouterr()
    assert "divisible" in captured.err and "Part 1" not in captured.out  # nothing ran


def test_stages_compose_to_the_model_and_share_its_parameters():
    torch.manual_seed(0)
    model = TinyTransformer(vocab=11, dim=8, heads=2, layers=5, tokens=4)
    stages = split_stages(model, 3)
    assert [s.span for s in stages] == [(0, 2), (2, 4), (4, 5)]
    ids = torch.randint(0, 11, (3, 4))
    h = stages[0](ids)
    for s in stages[1:]:
        h = s(**h)
    torch.testing.assert_close(h["logits"], model(ids), rtol=0, atol=0)
    named = dict(model.named_parameters())
    for s in stages:  # the model's own parameters under the model's names: no copies
        assert all(p is named[n] for n, p in s.named_parameters())
    assert sum(len(list(s.parameters())) for s in stages) == len(named)
    with pytest.raises(ValueError, match="layers >= 6"):
        split_stages(model, 6)


def test_measured_numbers_read_a_simulation_back():
    # events of a simulation with known per-stage costs: the measurement helpers must
    # recover those costs, the hop latency and the simulator's own bubble rate
    schedule = build_schedule("zb-h1", pp=3, microbatches=6)
    costs = [Costs(F=1.0 + s, I=2.0, W=0.5, comm=0.25) for s in range(3)]
    sim = simulate(schedule, costs)
    got = measured_costs(sim.events, 3, comm=hop_latency(sim.events))
    assert got == costs
    assert bubble_rate(sim.events) == pytest.approx(sim.bubble_rate)
    b = simulate(build_schedule("1f1b", pp=3, microbatches=6), Costs(F=1, I=2, W=2))
    assert [c.I for c in measured_costs(b.events, 3)] == [2.0, 2.0, 2.0]  # B = I + W
    assert _report.grad_difference([{"a": torch.ones(2)}], {"a": torch.zeros(2)}) == 1.0
    assert _report.grad_difference([{"a": None}], {"a": torch.zeros(2)}) == float("inf")
    assert _report.grad_difference([{}], {"a": torch.zeros(2)}) == float("inf")


def test_one_cost_set_gives_every_schedule_the_same_work():
    # blocks measured once; a schedule's stage costs its blocks' sum, whatever the split
    blocks = [Costs(F=1.0 + b, I=2.0, W=0.5 * b) for b in range(8)]
    four = _report.stage_costs(blocks, stage_spans(8, 4))
    eight = _report.stage_costs(blocks, stage_spans(8, 8), scale=2.0)
    assert four[0] == Costs(F=3.0, I=4.0, W=0.5) and eight[1] == Costs(F=4.0, I=4.0, W=1.0)
    for part in ("F", "I", "W"):
        total = sum(getattr(c, part) for c in blocks)
        assert sum(getattr(c, part) for c in four) == pytest.approx(total)
        assert sum(getattr(c, part) for c in eight) == pytest.approx(2 * total)
    # memory in rank-microbatches: a stage holds its share of its rank's blocks
    assert [c.mem_activation for c in _report.stage_costs(blocks, stage_spans(8, 4), ranks=4)] == [
        1.0
    ] * 4
    halves = _report.stage_costs(blocks, stage_spans(8, 8), ranks=4)
    assert [c.mem_activation for c in halves] == [0.5] * 8
    zbv = build_schedule("zb-v", pp=4, microbatches=8)
    assert simulate(zbv, halves).peak_memory == simulate(zbv, Costs()).peak_memory == [4.0] * 4


def _fake_runs(schedules, costs, steps):
    """Every rank's {"times", "traces"} as if the run had gone exactly as simulated."""
    runs = {}
    for name, sch in schedules.items():
        sim = simulate(sch, costs[name])
        trace = Trace(events=list(sim.events))
        rank0 = {"times": [steps.get(name, sim.makespan)], "traces": [trace], "grads": {}}
        runs[name] = [rank0] + [{"times": [0.0], "grads": {}}] * (sch.pp - 1)
    return runs


def test_speedups_of_runs_that_match_the_simulation_are_the_simulated_ones():
    # the oracle: runs whose events are their simulation's read back the simulated speed-up
    names = ("1f1b", "zb-h1", "zb-v")
    schedules = {n: build_schedule(n, pp=4, microbatches=8) for n in names}
    blocks = [Costs(F=1.0, I=1.0, W=0.8)] * 8
    with_hop = {
        n: [
            Costs(c.F, c.I, c.W, comm=0.1)
            for c in _report.stage_costs(blocks, stage_spans(8, s.num_stages))
        ]
        for n, s in schedules.items()
    }
    runs = _fake_runs(schedules, with_hop, {})
    costs = {
        n: _report.stage_costs(blocks, stage_spans(8, s.num_stages)) for n, s in schedules.items()
    }
    got, hop = _report.compare(schedules, runs, costs)
    assert hop == pytest.approx(0.1)  # the hop latency read back, one for all schedules
    rows = {r[0]: r for r in _report.speedup_rows(got, "1f1b")}
    base = simulate(schedules["1f1b"], with_hop["1f1b"]).makespan
    for name in names:
        want = base / simulate(schedules[name], with_hop[name]).makespan
        assert rows[name][3] == rows[name][4] == f"{want:.2f}x" and rows[name][5] == "1.00"
    assert float(rows["zb-h1"][4].rstrip("x")) > 1.0  # zero bubble wins on these costs

    # a run twice as slow as its simulation reads as half the simulated speed-up
    slow = _fake_runs(schedules, with_hop, {"zb-h1": 2 * got[1].sim.makespan})
    rows = {
        r[0]: r for r in _report.speedup_rows(_report.compare(schedules, slow, costs)[0], "1f1b")
    }
    assert rows["zb-h1"][5] == "0.50"


def test_memory_is_labelled_in_rank_microbatches_and_bytes():
    # one unit for every schedule: zb-v's chunks hold half a rank's blocks each, so its peak
    # reads p, like 1f1b's rank 0; the run's count is weighed as its simulation's
    blocks = [Costs(F=1.0, I=1.0, W=1.0)] * 4
    peaks = {}
    for name in ("zb-v", "1f1b"):
        sch = build_schedule(name, pp=2, microbatches=4)
        costs = _report.stage_costs(blocks, stage_spans(4, sch.num_stages), ranks=2)
        sim = simulate(sch, costs)
        run = _report.Run(name, sch, 1.0, Trace(events=list(sim.events)), sim)
        assert run.unit == "rank-microbatches" and run.peaks == sim.peak_memory
        peaks[name] = run.peaks
    assert peaks["zb-v"] == [2.0, 2.0] and peaks["1f1b"] == [2.0, 1.0]
    assert _report.format_bytes([3 * 2**20, 2**19]) == "3.00 0.50 MiB"
    assert _report.format_bytes([2048, 512]) == "2.0 0.5 KiB"


def test_auto_timing_is_synthetic_when_ranks_outnumber_cores(monkeypatch):
    monkeypatch.setattr(demo, "cores", lambda: 2)
    assert demo.use_synthetic("auto", 4, "gloo") and not demo.use_synthetic("auto", 2, "gloo")
    assert not demo.use_synthetic("auto", 4, "nccl")  # a GPU each: real timing
    assert demo.use_synthetic("synthetic", 2, "gloo") and not demo.use_synthetic("real", 4, "gloo")


def test_synthetic_timing_says_why_it_was_chosen():
    from zbkit.demo._pipeline import why_synthetic
    from zbkit.launch.machine import machine_load

    crowded = why_synthetic(machine_load(4, load=0.5, cores=2), stage_ms=3.0)
    assert crowded == "4 ranks share 2 CPU cores, so real ~1 ms actions would time the wait " \
        "for a core, not the schedule"  # fmt: skip
    # enough cores: synthetic only because --timing synthetic asked for it
    assert why_synthetic(machine_load(2, load=0.5, cores=8), 3.0) == "as asked (--timing synthetic)"
