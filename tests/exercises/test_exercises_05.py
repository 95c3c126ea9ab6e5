"""Notebook 05's exercises and its sizing section, each against an answer worked out here.

The oracles: simulated makespans and events read directly (05.1, 05.3, 05.5, the sizing
tables), one `PipelineStage` driven call by call (05.2), and the notebook's own transformer
stages run by `LocalPipeline` against plain autograd (05.4). Then the notebook: the sizing
section's stored numbers are the simulator's. (What every exercise shares, its check cell and
folded solution, is tested in test_exercises_all.py.)
"""

from __future__ import annotations

import copy
import itertools
import json
import re

import pytest
import torch
from notebook_cells import cell_source, cell_stdout, find_cell, read_cells
from torch import nn

from zbkit.exercises import check
from zbkit.models import TransformerBlock
from zbkit.pipeline import LocalPipeline, PipelineStage, SyntheticStage
from zbkit.schedules import Costs, build_schedule, simulate

NOTEBOOK = "05_running_pipelines"
KEYS = [f"05.{k}" for k in range(1, 6)]
TIMED = ("1f1b", "zb-h1", "zb-h2", "zb-v")


def _judged(key: str, answer: object) -> tuple[bool | None, str]:
    verdict = check(key, answer)
    return verdict.right, verdict.why


def _makespan(name: str, costs: Costs | list[Costs], p: int = 4, m: int = 8, **opts) -> float:
    return simulate(build_schedule(name, pp=p, microbatches=m, **opts), costs).makespan


# ----------------------------------------------------------------- the exercises


def test_05_1_the_schedule_that_gains_most_with_a_short_w():
    spans = {n: _makespan(n, Costs(0.020, 0.020, 0.005)) for n in TIMED}
    best = min(TIMED[1:], key=spans.__getitem__)
    runner_up = sorted(TIMED[1:], key=spans.__getitem__)[1]

    right, why = _judged("05.1", best)
    assert right is True and f"{spans['1f1b'] / spans[best]:.2f}x" in why
    assert _judged("05.1", best.upper())[0] is True  # a name is a name in any case
    right, why = _judged("05.1", runner_up)
    assert right is False and f"{runner_up} gains {spans['1f1b'] / spans[runner_up]:.2f}x" in why
    right, why = _judged("05.1", "1f1b")
    assert right is False and "baseline" in why
    assert _judged("05.1", "gpipe")[0] is False
    right, why = _judged("05.1", 1)
    assert right is False and "name" in why


def test_05_2_stage_0_pays_its_whole_backward_at_w():
    # one stage 0, driven call by call: what does each of I and W pay for?
    mod = SyntheticStage(0, 0, 0, width=4)
    stage = PipelineStage(mod, 0, 2)  # split_first_stage=False, the default
    out = stage.forward(0, torch.ones(2, 4))
    stage.backward_input(0, {"x": torch.ones_like(out["x"])})
    at_i = list(mod.paid)
    stage.backward_weight(0)
    at_w = mod.paid[len(at_i) :]
    assert at_i == [] and at_w == ["IW"]
    ms = 20 * len(at_w[0])  # F = I = W = 20 ms: each part paid takes 20

    right, why = _judged("05.2", ms)
    assert right is True and "empty" in why and f"{ms} ms" in why
    assert _judged("05.2", ms + 0.5)[0] is True  # read off a trace: a little over
    right, why = _judged("05.2", 20)
    assert right is False and "split_first_stage=True" in why
    right, why = _judged("05.2", ms / 1e3)
    assert right is False and "seconds" in why
    right, why = _judged("05.2", "40")
    assert right is False and "number" in why


def _over(sim, cores: int) -> float:
    """Share of the makespan with more than `cores` events running: a +1/-1 sweep."""
    marks = sorted([(e.start, 1) for e in sim.events] + [(e.end, -1) for e in sim.events])
    running, last, total = 0, 0.0, 0.0
    for t, step in marks:  # ends sort before starts at one time: -1 < 1
        if running > cores:
            total += t - last
        running, last = running + step, t
    return total / sim.makespan


def test_05_3_the_time_more_ranks_compute_than_there_are_cores():
    share = {
        n: _over(simulate(build_schedule(n, pp=4, microbatches=8), Costs(1, 1, 1)), 2)
        for n in TIMED
    }
    assert share["zb-v"] > share["1f1b"]  # fewer bubbles, more ranks at work at once

    right, why = _judged("05.3", share["zb-v"])
    assert right is True and f"{share['zb-v']:.0%}" in why
    right, why = _judged("05.3", share["1f1b"])
    assert right is False and "1f1b" in why
    right, why = _judged("05.3", 100 * share["zb-v"])
    assert right is False and "percentage" in why
    assert _judged("05.3", share["zb-v"] + 0.05)[0] is False
    right, why = _judged("05.3", "0.9")
    assert right is False and "fraction" in why


class _Stage(nn.Module):  # notebook 05's transformer stage, as its ranks build it
    def __init__(self, first: bool, last: bool, vocab: int = 32, dim: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim) if first else None
        self.block = TransformerBlock(dim, heads=4)
        self.head = nn.Linear(dim, vocab) if last else None

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.embed(x) if self.embed is not None else x
        h = self.block(h)
        return {"x": self.head(h) if self.head is not None else h}


def test_05_4_the_added_schedules_match_one_process():
    def lm_loss(outputs, targets):
        return nn.functional.cross_entropy(outputs["x"].flatten(0, 1), targets.flatten())

    torch.manual_seed(0)
    tokens, targets = torch.randint(0, 32, (8, 8)), torch.randint(0, 32, (8, 8))
    worst = {}
    for name in ("gpipe", "interleaved-1f1b"):
        sch = build_schedule(name, pp=4, microbatches=4)
        n = sch.num_stages
        stages = [_Stage(s == 0, s == n - 1) for s in range(n)]
        whole = copy.deepcopy(stages)
        out = {"x": tokens}
        for st in whole:  # plain autograd, one process, the full batch
            out = st(**out)
        lm_loss(out, targets).backward()
        LocalPipeline(stages, sch, lm_loss).step(tokens, targets=targets)
        worst[name] = max(
            (a.grad - b.grad).abs().max().item()
            for st, ref in zip(stages, whole, strict=True)
            for a, b in zip(st.parameters(), ref.parameters(), strict=True)
        )
    differ = {n for n, w in worst.items() if w > 1e-5}
    assert differ == set(), worst

    right, why = _judged("05.4", differ)
    assert right is True and "never what" in why
    assert _judged("05.4", []) == _judged("05.4", set())
    right, why = _judged("05.4", {"gpipe"})
    assert right is False and "gpipe: its largest difference" in why
    right, why = _judged("05.4", {"zb-h1"})
    assert right is False and "adds only" in why
    right, why = _judged("05.4", 0)
    assert right is False and "set" in why


def test_05_5_one_slow_stage_sets_the_makespan():
    costs = [Costs(1, 1, 1)] * 3 + [Costs(1.5, 1.5, 1.5)]
    bound = 8 * 4.5 + 3 * 1  # the slow stage's work, after the forwards before it
    spans = {n: _makespan(n, costs) for n in ("1f1b", "zb-h1", "zb-h2")}
    auto = build_schedule("zb-auto", pp=4, microbatches=8, costs=costs)
    spans["zb-auto"] = simulate(auto, costs).makespan
    assert min(spans.values()) == pytest.approx(bound)

    right, why = _judged("05.5", bound)
    assert right is True and "never idle" in why
    assert _judged("05.5", int(bound))[0] is True
    right, why = _judged("05.5", spans["1f1b"])
    assert right is False and "1f1b's makespan" in why
    right, why = _judged("05.5", bound - 3)
    assert right is False and "below" in why
    assert _judged("05.5", bound + 1)[0] is False


# ----------------------------------------------------------------- the notebook


@pytest.fixture(scope="module")
def cells() -> list[dict]:
    return read_cells(NOTEBOOK)


def test_the_cluster_is_stopped_before_the_sizing_and_the_exercises(cells):
    stop = next(i for i, c in enumerate(cells) if cell_source(c).strip() == "%zb_stop")
    later = [c for c in cells[stop + 1 :] if c["cell_type"] == "code"]
    assert later and not any("%%zb" in cell_source(c) for c in later)


def test_one_costs_simulates_every_schedule_of_the_run(cells):
    source = cell_source(find_cell(cells, 'sims["zb-h1"]'))
    assert "Costs(T, T, T, comm=hop)" in source
    assert "T / sch.stages_per_rank" not in source  # the rank's share, never a chunk's


# ----------------------------------------------------------------- the sizing section

LAYERS, DIM, VOCAB, EMBED = 32, 4096, 128_256, 1.0  # the section's assumed model
HEAD = 2 * DIM * VOCAB / (24 * DIM**2)


def _stage_costs(blocks: list[int]) -> list[Costs]:
    extra = [EMBED] + [0.0] * (len(blocks) - 2) + [HEAD]
    return [Costs(b + e, b + e, b + e) for b, e in zip(blocks, extra, strict=True)]


def test_the_sizing_model_is_the_one_tested(cells):
    source = cell_source(find_cell(cells, "def splits(layers, stages)"))
    assert "LAYERS, DIM, VOCAB = 32, 4096, 128_256" in source
    assert "EMBED = 1.0" in source


def test_the_balanced_split_and_its_numbers_are_the_simulators(cells):
    out = cell_stdout(find_cell(cells, "def splits(layers, stages)"))
    # the balanced split, searched here by brute force over the three cuts
    best = min(
        ([a, b - a, c - b, LAYERS - c] for a, b, c in itertools.combinations(range(1, LAYERS), 3)),
        key=lambda blocks: max(c.F for c in _stage_costs(blocks)),
    )
    naive = [8, 8, 8, 8]
    rows = {}
    for line in out.splitlines():
        found = re.match(r"(\S+)\s+(\[[\d, ]+\])\s+\[[^\]]*\]\s+([\d.]+)\s+([\d.]+)\s+(\d+)%", line)
        if found:
            rows[found[1], found[2]] = (float(found[3]), float(found[4]), int(found[5]))
    assert set(rows) == {(n, str(b)) for n in ("1f1b", "zb-h1") for b in (naive, best)}
    for (name, blocks), (span, rate, idle) in rows.items():
        sim = simulate(build_schedule(name, pp=4, microbatches=8), _stage_costs(json.loads(blocks)))
        assert span == pytest.approx(sim.makespan, abs=0.05)
        assert rate == pytest.approx(8 / sim.makespan, abs=5e-5)
        assert idle == round(100 * (1 - sum(sim.busy) / (4 * sim.makespan)))
    for name in ("1f1b", "zb-h1"):
        gain = rows[name, str(naive)][0] / rows[name, str(best)][0]
        assert f"{name}: the balanced split is {gain:.2f}x as fast" in out


def test_the_balancing_text_says_what_the_table_shows(cells):
    out = cell_stdout(find_cell(cells, "def splits(layers, stages)"))
    text = " ".join(cell_source(find_cell(cells, "The naive split's last stage")).split())
    for name, shown in re.findall(r"([\d.]+)x (?:as fast )?under (1F1B|ZB-H1)", text):
        assert f"{shown.lower()}: the balanced split is {name}x" in out, (name, shown)
    assert len(re.findall(r"x (?:as fast )?under", text)) == 2
    stage_f = re.search(r"evens the stages to ([\d., ]+?):", text)[1]
    assert f"[{stage_f}]" in out
    one_third = re.search(r"1f1b\s+\[8, 8, 8, 8\].* (\d+)%", out)[1]
    assert 30 <= int(one_third) <= 37  # "a third of all the ranks' time idle"


def _table(out: str, columns: int) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if re.match(r"\s*\d", line)
            and len(line.split()) == columns]  # fmt: skip


def test_the_depth_table_is_the_simulators(cells):
    rows = _table(cell_stdout(find_cell(cells, "BATCH = 64")), 9)
    assert {(int(r[0]), int(r[1])) for r in rows} == {(p, b) for p in (2, 4, 8) for b in (1, 4)}
    for p, b, m, weights, act_one, act_v, rule, one_rate, v_rate in rows:
        p, b, m = int(p), int(b), int(m)
        assert m == 64 // b and float(weights) == LAYERS / p
        share = b * LAYERS / p
        one = simulate(build_schedule("1f1b", pp=p, microbatches=m), Costs(share, share, share))
        vee = simulate(build_schedule("zb-v", pp=p, microbatches=m), Costs(share, share, share))
        assert float(act_one) == float(act_v) == LAYERS * b  # p microbatches of LAYERS/p blocks
        assert one_rate == f"{(p - 1) / (m + p - 1):.1%}" == f"{one.bubble_rate:.1%}"
        assert rule == f"{(p - 1) / m:.1%}" and v_rate == f"{vee.bubble_rate:.1%}"


def test_the_pp_dp_table_is_the_simulators(cells):
    out = cell_stdout(find_cell(cells, "WORLD = 8"))
    rows = _table(out, 8)
    assert [int(r[0]) for r in rows] == [1, 2, 4, 8]
    for p, d, m, weights, reduced, acts, one_rate, v_rate in rows:
        p, d, m = int(p), int(d), int(m)
        assert p * d == 8 and m == 64 // d and float(weights) == LAYERS / p
        assert float(reduced) == pytest.approx(2 * (d - 1) / d * LAYERS / p)
        share = LAYERS / p
        one = simulate(build_schedule("1f1b", pp=p, microbatches=m), Costs(share, share, share))
        assert one_rate == f"{one.bubble_rate:.1%}" and float(acts) == LAYERS
        if p > 1:
            vee = simulate(build_schedule("zb-v", pp=p, microbatches=m), Costs(share, share, share))
            assert v_rate == f"{vee.bubble_rate:.1%}"
    text = " ".join(cell_source(find_cell(cells, "p = 1 is plain data parallelism")).split())
    assert f"all-reduces {rows[0][4]} blocks' worth" in text
    assert f"{rows[-1][3]} blocks a rank" in text and f"stay at {rows[0][5]} block" in text
