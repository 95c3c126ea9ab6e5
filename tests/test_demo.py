"""`zbkit demo`: real pipelines agree with one process, the table and the HTML report are there.

The multi-process test runs the demo's own `main` (2 ranks, 2 schedules, 4 microbatches) and
reads what it printed; the oracle for the gradients is plain single-process training, which
the demo computes and prints the difference from. The fast tests check the pieces the table is
made of against closed forms and the simulator.
"""

from __future__ import annotations

import argparse
import json
import re

import pytest
import torch

from zbkit import _report, demo
from zbkit.models import TinyTransformer, split_stages
from zbkit.schedules import Costs, bubble_rate, build_schedule, simulate
from zbkit.schedules.measure import hop_latency, measured_costs


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.multiprocess
def test_demo_runs_pipelines_and_writes_the_report(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out_dir = tmp_path / "report"
    argv = ["--ranks", "2", "--schedules", "1f1b,zb-v", "--microbatches", "4", "--rounds", "2"]
    code = demo.main(_args(*argv, "--out", str(out_dir)))
    out = capsys.readouterr().out
    assert code == 0, out

    # the table: a header and one row per schedule, gradients equal to one process
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("schedule "))
    rows = {line.split()[0]: line.split() for line in lines[head + 1 : head + 3]}
    assert set(rows) == {"1f1b", "zb-v"}, lines[head : head + 4]
    for name, cells in rows.items():
        assert float(cells[-1]) < 1e-6, f"{name}: gradient differs from one process: {cells}"
        bubble_sim, bubble_run = (float(c.rstrip("%")) for c in cells[4:6])
        assert 0 <= bubble_sim < 100 and 0 <= bubble_run < 100, cells
    # peak activations per rank, run | sim: 1f1b holds pp - rank microbatches (closed form)
    assert " ".join(rows["1f1b"][6:9]) == "2 1 |" and rows["1f1b"][9:11] == ["2", "1"]
    assert "gradients vs one process" in out and "OK" in out.split("Part 2")[1]

    # the report: one file, the plots inlined (one PNG per schedule) and the graph as SVG
    html = (out_dir / "index.html").read_text()
    assert f"report: {out_dir / 'index.html'}" in out
    assert len(re.findall(r'src="data:image/png;base64,[A-Za-z0-9+/=]{1000,}"', html)) == 2
    assert "<svg" in html and "group 0" in html
    assert "id=1f1b" in html and "id=zb-v" in html
    assert 'src="http' not in html  # self-contained: nothing fetched
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
