"""Rich displays: Schedule / Simulation / Trace as an HTML grid, kinds coloured, numbers shown.

Oracles: the schedule's own programs (every action in one cell, once), the simulation's or
trace's own numbers, and the colours the graph's legend gives each kind (`palette.py`).
"""

from __future__ import annotations

import re
from collections import Counter

import torch
from palette import graph_colours
from torch import nn

from zbkit.pipeline import LocalPipeline
from zbkit.schedules import Costs, build_schedule, simulate


class _Stage(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"x": torch.tanh(self.fc(x))}


def _cells(page: str) -> list[tuple[str, str]]:
    """(style, text) of every grid cell (the header cells are <th>)."""
    return re.findall(r"<td style='([^']*)'>([^<]*)</td>", page)


def test_every_action_once_coloured_by_kind_and_the_numbers_are_the_simulations():
    schedule = build_schedule("zb-v", pp=4, microbatches=8)
    sim = simulate(schedule, Costs(1, 1, 1))
    page = sim._repr_html_()
    actions = [str(a) for r in range(4) for a in schedule.program[r]]
    cells = _cells(page)
    assert Counter(text for _, text in cells) == Counter(actions)  # each once
    assert len(set(actions)) == len(actions)
    colours = graph_colours()  # F, I, W: one palette for graphs and schedules
    for style, text in cells:
        assert colours[text[1]] in style  # 0F3: the kind is the letter after the stage
    assert f"bubble rate <b>{sim.bubble_rate:.2%}</b>" in page
    assert f"makespan <b>{sim.makespan:.4g}</b>" in page
    peaks = ", ".join(f"{p:.4g}" for p in sim.peak_memory)
    assert f"peak memory per rank (rank-microbatches) <b>{peaks}</b>" in page
    # rank r's row holds rank r's program, in order
    rows = re.findall(r"<tr><th[^>]*>rank (\d+)</th>(.*?)</tr>", page)
    for rank, row in rows:
        texts = [t for _, t in _cells(row)]
        assert texts == [str(a) for a in schedule.program[int(rank)]]
    # the schedule alone: the same grid, no numbers
    alone = schedule._repr_html_()
    assert Counter(t for _, t in _cells(alone)) == Counter(actions)
    assert "zb-v" in alone and "bubble" not in alone


def test_a_measured_trace_shows_what_each_rank_ran_and_its_numbers():
    torch.manual_seed(0)
    schedule = build_schedule("zb-h1", pp=2, microbatches=4)
    stages = [_Stage(), _Stage()]
    pipe = LocalPipeline(stages, schedule, lambda out, y: ((out["x"] - y) ** 2).mean())
    pipe.step({"x": torch.randn(8, 3)}, torch.randn(8, 3))
    trace = pipe.trace
    page = trace._repr_html_()
    assert Counter(t for _, t in _cells(page)) == Counter(e.label for e in trace.events)
    assert f"bubble rate <b>{trace.bubble_rate:.2%}</b>" in page
    assert f"makespan <b>{trace.makespan:.4g} s</b>" in page


def test_a_long_program_is_cut_and_says_how_much_is_left():
    sim = simulate(build_schedule("1f1b", pp=2, microbatches=100), Costs())
    page = sim._repr_html_()
    rows = dict(re.findall(r"<tr><th[^>]*>rank (\d+)</th>(.*?)</tr>", page))
    for rank, row in rows.items():
        *shown, last = [t for _, t in _cells(row)]
        # the first actions of the rank's program, in order, then how many are left out
        assert 0 < len(shown) < 2 * 100  # F and B per microbatch on each rank
        assert shown == [str(a) for a in sim.schedule.program[int(rank)][: len(shown)]]
        assert last == f"+{2 * 100 - len(shown)} more"
    assert len(rows) == 2
