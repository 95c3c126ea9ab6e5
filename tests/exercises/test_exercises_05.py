"""Notebook 05's exercises, each against an answer worked out here.

The oracles: simulated makespans and events read directly (05.1, 05.3, 05.5), one
`PipelineStage` driven call by call (05.2), and transformer stages run by `LocalPipeline`
against plain autograd (05.4). Every wrong answer says the idea that gives the right one, and
every right answer explains it. Then the notebook: the ranks are stopped before the
exercises, and one `Costs` simulates every schedule of the run. (What every exercise shares,
its check cell and folded solution, is tested in test_exercises_all.py.)
"""

from __future__ import annotations

import copy

import pytest
import torch
from notebook_cells import cell_source, find_cell, read_cells
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
    assert "bubble" in why and "warm-up" in why  # the idea: W fills the bubble, V its ends
    assert best not in why  # the idea, not the answer
    right, why = _judged("05.1", "1f1b")
    assert right is False and "baseline" in why and "bubble" in why
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
    right, why = _judged("05.2", 3 * ms)
    assert right is False and "no gradient to send" in why and "one call" in why
    right, why = _judged("05.2", 5)
    assert right is False and "whole backward" in why


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
    right, why = _judged("05.3", 0.5)
    assert right is False and "core" in why and "more than 2" in why


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
    assert right is True and "never idle" in why and "notebook 09" in why
    assert _judged("05.5", int(bound))[0] is True
    right, why = _judged("05.5", spans["1f1b"])
    assert right is False and "1f1b's makespan" in why and "sets the pace" in why
    right, why = _judged("05.5", bound + 1)
    assert right is False and "sets the pace" in why
    right, why = _judged("05.5", bound - 3)
    assert right is False and "below" in why


# ----------------------------------------------------------------- the notebook


@pytest.fixture(scope="module")
def cells() -> list[dict]:
    return read_cells(NOTEBOOK)


def test_the_cluster_is_stopped_before_the_exercises(cells):
    stop = next(i for i, c in enumerate(cells) if cell_source(c).strip() == "%zb_stop")
    later = [c for c in cells[stop + 1 :] if c["cell_type"] == "code"]
    assert later and not any("%%zb" in cell_source(c) for c in later)


def test_one_costs_simulates_every_schedule_of_the_run(cells):
    source = cell_source(find_cell(cells, 'sims["zb-h1"]'))
    assert "Costs(T, T, T, comm=hop)" in source
    assert "T / sch.stages_per_rank" not in source  # the rank's share, never a chunk's
