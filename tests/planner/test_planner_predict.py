"""`planner.predict`: per-rank bytes against the modules' own sizes and the simulator's own
peak, the balanced cut against every cut, and the errors for stages that cannot be."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest
import torch
from torch import nn

from zbkit import planner
from zbkit.planner import LayerProfile, Profile, Timing
from zbkit.schedules import Costs, build_schedule, simulate

V, H, S, B = 256, 32, 8, 2


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(H, 4 * H), nn.GELU(), nn.Linear(4 * H, H))


def _model() -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Embedding(V, H), *[_mlp() for _ in range(4)], nn.Linear(H, V)]


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out.reshape(-1, V), target.reshape(-1))


@pytest.fixture(scope="module")
def measured() -> tuple[list[nn.Module], Profile]:
    layers = _model()
    g = torch.Generator().manual_seed(2)
    sample = (torch.randint(0, V, (B, S), generator=g), torch.randint(0, V, (B, S), generator=g))
    return layers, planner.profile(layers, sample, loss_fn=_loss, repeats=2)


def _bytes(modules: list[nn.Module]) -> int:
    return sum(p.numel() * p.element_size() for m in modules for p in m.parameters())


def test_each_ranks_parameters_are_its_stages_modules(measured):
    layers, prof = measured
    for name in ("1f1b", "zb-v", "interleaved-1f1b", "dualpipev"):
        pred = planner.predict(prof, name, pp=2, microbatches=4)
        where = pred.schedule.stage_to_rank
        for r, rank in enumerate(pred.ranks):
            mine = [layers[i] for s, part in enumerate(pred.stages) if where[s] == r for i in part]
            assert rank.parameters == _bytes(mine), (name, r)
            assert rank.optimizer == 2 * _bytes(mine) + 4 * sum(
                len(list(m.parameters())) for m in mine
            )
    v = planner.predict(prof, "zb-v", pp=2, microbatches=4)
    # the V puts the first and the last stage on rank 0: the embedding and the head
    assert v.schedule.stage_to_rank == [0, 1, 1, 0]
    assert 0 in v.stages[0] and len(layers) - 1 in v.stages[-1]


def test_the_peak_is_what_the_simulator_holds_plus_what_never_leaves(measured):
    _, prof = measured
    pred = planner.predict(prof, "1f1b", pp=2, microbatches=4)
    # the simulator's own peak on the stages' activations (1F1B keeps no W state): the
    # same number the breakdown replays
    alone = simulate(pred.schedule, [Costs(mem_activation=c.mem_activation) for c in pred.costs])
    first, second = pred.stages
    for r, rank in enumerate(pred.ranks):
        assert rank.weight_state == 0
        assert rank.activations == alone.peak_memory[r]
        # a receive buffer per microbatch: rank 0 the gradients of its outputs, rank 1 its
        # inputs (the same shapes), kept across steps
        assert rank.received == 4 * prof.layers[first.stop - 1].output_bytes
        # 1F1B peaks at its first backward's start: every stage's gradients are there
        mine = [s for s, w in enumerate(pred.schedule.stage_to_rank) if w == r]
        grads = sum(prof.layers[i].grad_bytes for s in mine for i in pred.stages[s])
        assert rank.gradients == grads
        if not rank.at_step:
            assert rank.peak_bytes == sum(rank.breakdown.values())
    assert first.stop == second.start


def test_a_split_backward_holds_w_state_and_each_part_counts(measured):
    _, prof = measured
    one = planner.predict(prof, "1f1b", pp=2, microbatches=4)
    h1 = planner.predict(prof, "zb-h1", pp=2, microbatches=4)
    for a, b in zip(one.ranks, h1.ranks, strict=True):
        assert b.weight_state > 0
        assert b.peak_bytes == sum(b.breakdown.values()) or b.at_step
        assert b.parameters == a.parameters and b.optimizer == a.optimizer
    # more warm-up forwards hold more: ZB-H2 over ZB-H1 on rank 0
    h2 = planner.predict(prof, "zb-h2", pp=2, microbatches=4)
    assert h2.ranks[0].activations > h1.ranks[0].activations


def test_the_step_ends_with_each_ranks_optimizer_step(measured):
    _, prof = measured
    pred = planner.predict(prof, "zb-h1", pp=2, microbatches=4, hop=1e-3, overhead=2e-4)
    for r, rank in enumerate(pred.ranks):
        mine = [s for s, w in enumerate(pred.schedule.stage_to_rank) if w == r]
        step = sum(prof.layers[i].step.median for s in mine for i in pred.stages[s])
        last = max(end for _, end in pred.simulation.times[r])
        assert rank.seconds == pytest.approx(last + step)
    assert pred.step_seconds == max(r.seconds for r in pred.ranks)
    forward = sum(prof.layers[i].forward.median for i in pred.stages[0])
    assert pred.costs[0].F == pytest.approx(forward + 2e-4)  # the runtime's own, per action
    assert pred.costs[1].comm == 1e-3


def _synthetic(works: list[float]) -> Profile:
    t = [Timing(w / 3, w / 3, w / 3) for w in works]
    layers = tuple(
        LayerProfile(f"{i}", x, x, x, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, Timing(0, 0, 0), 0)
        for i, x in enumerate(t)
    )
    return Profile(layers, "cpu", "float32")


def _slowest(works: list[float], cuts: tuple[int, ...]) -> float:
    edges = [0, *cuts, len(works)]
    return max(sum(works[a:b]) for a, b in itertools.pairwise(edges))


def test_the_balanced_cut_is_the_best_contiguous_cut():
    rng = random.Random(5)
    for _ in range(40):
        n, k = rng.randint(2, 8), rng.randint(1, 4)
        if k > n:
            continue
        works = [rng.choice([0.5, 1.0, 2.0, 3.0]) for _ in range(n)]
        parts = planner.balanced(_synthetic(works), k)
        assert [i for p in parts for i in p] == list(range(n)) and len(parts) == k

        best = min(_slowest(works, cuts) for cuts in itertools.combinations(range(1, n), k - 1))
        got = max(sum(works[i] for i in p) for p in parts)
        assert got == pytest.approx(best)


def test_a_built_schedule_and_given_stages(measured):
    _, prof = measured
    schedule = build_schedule("zb-h1", pp=2, microbatches=4)
    pred = planner.predict(prof, schedule, pp=2, microbatches=4, stages=[range(0, 2), [2, 3, 4, 5]])
    assert pred.stages == [range(0, 2), range(2, 6)] and pred.schedule is schedule


def test_stages_that_cannot_be_are_named(measured):
    _, prof = measured
    with pytest.raises(ValueError, match="do not cover the 6 layers 0-5 once each"):
        planner.predict(prof, "1f1b", pp=2, microbatches=4, stages=[range(0, 2), range(3, 6)])
    with pytest.raises(ValueError, match="3 stages given, the schedule has 2"):
        planner.predict(prof, "1f1b", pp=2, microbatches=4, stages=[[0, 1], [2, 3], [4, 5]])
    with pytest.raises(ValueError, match=r"stage 0's layers \[0, 2\] are not a contiguous run"):
        planner.predict(prof, "1f1b", pp=2, microbatches=4, stages=[[0, 2], [1, 3, 4, 5]])
    with pytest.raises(ValueError, match="8 stages but 6 layers"):
        planner.predict(prof, "zb-v", pp=4, microbatches=8)
    with pytest.raises(ValueError, match="is for pp=2, m=4, not pp=2, microbatches=8"):
        planner.predict(prof, build_schedule("1f1b", pp=2, microbatches=4), pp=2, microbatches=8)
    with pytest.raises(TypeError, match="takes a planner.Profile"):
        planner.predict({}, "1f1b", pp=2, microbatches=4)
    with pytest.raises(ValueError, match="hop must be seconds >= 0"):
        planner.predict(prof, "1f1b", pp=2, microbatches=4, hop=-1)
    with pytest.raises(ValueError, match="unknown schedule 'zb-x'"):
        planner.predict(prof, "zb-x", pp=2, microbatches=4)


def test_a_wire_charges_each_stage_by_the_bytes_it_moves(measured):
    _, prof = measured
    wire = planner.Wire(latency=1e-4, per_byte=1e-9, overhead=5e-5)
    pred = planner.predict(prof, "1f1b", pp=2, microbatches=4, wire=wire)
    plain = planner.predict(prof, "1f1b", pp=2, microbatches=4)
    for s, layers in enumerate(pred.stages):
        received = prof.layers[layers.start - 1].output_bytes if layers.start else 0
        sent = prof.layers[layers.stop - 1].output_bytes
        assert pred.costs[s].comm == pytest.approx(1e-4 + 1e-9 * max(received, sent))
        assert pred.costs[s].F == pytest.approx(plain.costs[s].F + 5e-5)
    assert pred.step_seconds > plain.step_seconds
    with pytest.raises(ValueError, match="hop and overhead, or a measured wire, not both"):
        planner.predict(prof, "1f1b", pp=2, microbatches=4, wire=wire, hop=1e-3)


def test_the_printed_table_has_a_heading_for_each_number(measured):
    _, prof = measured
    pred = planner.predict(prof, "zb-h1", pp=2, microbatches=4)
    lines = str(pred).splitlines()
    head, rows = lines[1].split(), lines[2:4]
    assert head == ["rank", "peak", "params", "grads", "optim", "activ", "W", "state", "recv",
                    "sent", "transient"]  # fmt: skip
    for r, row in enumerate(rows):
        cells = row.split()
        assert len(cells) == 10 and cells[0] == str(r)
        rank = pred.ranks[r]
        assert cells[1] == f"{rank.peak_bytes / 2**20:.3f}"
        assert cells[8] == f"{rank.sent / 2**20:.3f}"
        assert cells[9] == f"{rank.transient / 2**20:.3f}"


def test_crowding_slows_an_action_by_the_ranks_computing_beside_it():
    # ranks sharing a host's cores: an action runs max(1, crowding * k / p) slower, k the
    # ranks computing meanwhile. GPipe with one microbatch never computes on two ranks at
    # once: nothing slows. With eight, the ranks overlap: slower, but never by more than
    # crowding (every rank computing all the time)
    prof = _synthetic([3.0, 3.0])
    crowded = planner.Wire(0.0, 0.0, 0.0, crowding=2.0)
    alone = planner.Wire(0.0, 0.0, 0.0)
    one = [planner.predict(prof, "gpipe", pp=2, microbatches=1, wire=w) for w in (alone, crowded)]
    assert one[1].step_seconds == pytest.approx(one[0].step_seconds)
    many = [planner.predict(prof, "gpipe", pp=2, microbatches=8, wire=w) for w in (alone, crowded)]
    assert many[0].step_seconds < many[1].step_seconds < 2.0 * many[0].step_seconds
    # the steady state's F on stage 1 runs beside stage 0's next F: nearly twice as long
    assert 1.5 < many[1].costs[1].F / many[0].costs[1].F <= 2.0
    assert many[1].costs[0].F >= many[0].costs[0].F  # its first F ran alone


def test_timing_picks_the_profiles_medians_or_its_fastest():
    base = _synthetic([3.0, 3.0])
    fast = Timing(0.5, 0.25, 2.0)  # median, fastest, slowest
    layers = tuple(replace(x, forward=fast, input_grad=fast, weight_grad=fast) for x in base.layers)
    prof = replace(base, layers=layers)
    for timing, seconds in (("median", 0.5), ("fastest", 0.25)):
        pred = planner.predict(prof, "1f1b", pp=2, microbatches=2, timing=timing)
        assert pred.costs[1].F == seconds and pred.costs[1].I == seconds
        assert pred.costs[0].W == 2 * seconds  # stage 0: its whole backward at W
    with pytest.raises(ValueError, match="timing is 'median' or 'fastest', got 'mean'"):
        planner.predict(prof, "1f1b", pp=2, microbatches=2, timing="mean")


@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_a_stages_w_is_the_mean_of_its_first_and_its_adding_weight_passes(m):
    """A step's first W makes the gradients, its m - 1 others add into them; the profile
    times both, and a stage's W (stage 1: no whole backward folded in) is their mean."""
    prof = _synthetic([3e-3] * 4)
    slow = Timing(5e-3, 5e-3, 5e-3)
    prof = replace(prof, layers=tuple(replace(x, weight_grad_accumulate=slow)
                                      for x in prof.layers))  # fmt: skip
    pred = planner.predict(prof, "1f1b", pp=2, microbatches=m, stages=[[0, 1], [2, 3]])
    assert pred.costs[1].W == pytest.approx(2 * (1e-3 + (m - 1) * 5e-3) / m)
    # stage 0's W is its whole backward: its I too, which adds into nothing
    assert pred.costs[0].W == pytest.approx(2 * 1e-3 + 2 * (1e-3 + (m - 1) * 5e-3) / m)
    # without it (a profile from before, or from closed forms): W as the first
    plain = planner.predict(_synthetic([3e-3] * 4), "1f1b", pp=2, microbatches=m,
                            stages=[[0, 1], [2, 3]])  # fmt: skip
    assert plain.costs[1].W == pytest.approx(2e-3)


def test_the_adding_weight_pass_is_profiled_and_saved(tmp_path):
    torch.manual_seed(0)
    layers = [nn.Linear(64, 64), nn.Linear(64, 64)]
    prof = planner.profile(layers, torch.randn(4, 64), repeats=2)
    assert all(x.weight_grad_accumulate is not None for x in prof.layers)
    assert all(x.weight_grad_accumulate.fastest > 0 for x in prof.layers)
    path = tmp_path / "p.json"
    prof.save(path)
    assert planner.Profile.load(path) == prof
    assert all(p.grad is None for layer in layers for p in layer.parameters())  # none left
