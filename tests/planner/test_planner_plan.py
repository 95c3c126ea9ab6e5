"""`planner.plan`: every candidate predicted as `predict` predicts it alone, the chosen the
fastest that fits, the losers with why, the all-reduce priced from the gradients' bytes, the
microbatch's size scaling the bytes; nothing fitting said with the least needed; bad input."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from zbkit import planner
from zbkit.planner import LayerProfile, Profile, Timing
from zbkit.planner.choose import format_bytes

MB = 10**6


def _layer(name: str, secs: float, static: int, act: int, out: int) -> LayerProfile:
    t = Timing(secs, secs, secs)
    return LayerProfile(
        name, t, t, t,
        activation_bytes=act,
        weight_state_bytes=act // 2,
        param_bytes=static,
        grad_bytes=static,
        optimizer_bytes=2 * static,
        output_bytes=out,
        params=static // 4,
        forward_extra_bytes=0,
        input_grad_extra_bytes=0,
        weight_grad_extra_bytes=0,
        step=Timing(1e-4, 1e-4, 1e-4),
        step_bytes=0,
    )  # fmt: skip


def _gpt(blocks: int = 6, microbatch: int = 2, bandwidth: float | None = 1e9) -> Profile:
    """A GPT-like profile: an embedding and a head far heavier than a block."""
    layers = [_layer("embed", 1e-3, 8 * MB, 1 * MB, MB // 2)]
    layers += [_layer(f"block{i}", 4e-3, 2 * MB, 3 * MB, MB // 2) for i in range(blocks)]
    layers += [_layer("head", 12e-3, 8 * MB, 6 * MB, 4 * MB)]
    sample = {"inputs": {"shape": [microbatch, 64], "dtype": "int64"}}
    return Profile(tuple(layers), "cuda", "float32", sample=sample, bandwidth=bandwidth)


def _fits(c: planner.Candidate, limit: int) -> bool:
    return c.prediction is not None and max(r.peak_bytes for r in c.prediction.ranks) <= limit


def test_parse_bytes_reads_sizes_as_vendors_and_torch_print_them():
    assert planner.parse_bytes("80GB") == 80 * 10**9
    assert planner.parse_bytes("80 GiB") == 80 * 2**30
    assert planner.parse_bytes("512MB") == 512 * 10**6
    assert planner.parse_bytes("1.5 gb") == 1_500_000_000
    assert planner.parse_bytes(12345) == 12345
    for bad in ("80 parsecs", "GB", "", "-3GB", 0, True, None):
        with pytest.raises(ValueError, match="memory"):
            planner.parse_bytes(bad)


def test_the_chosen_is_the_fastest_candidate_that_fits_and_each_loser_says_why():
    limit = 80 * MB
    got = planner.plan(_gpt(), world=4, global_batch=16, memory=limit)
    fitting = [c for c in got.candidates if _fits(c, limit)]
    assert got.chosen is not None and got.chosen is got.candidates[0]
    assert got.chosen.step_seconds == min(c.step_seconds for c in fitting)
    assert got.chosen.verdict == "chosen"
    for c in got.candidates[1:]:
        if _fits(c, limit):
            slower = c.step_seconds / got.chosen.step_seconds - 1
            assert c.verdict == f"{slower:.0%} slower" or (
                slower < 0.005 and c.verdict.startswith("as fast")
            ), c
        elif c.prediction is not None:
            peak = max(r.peak_bytes for r in c.prediction.ranks)
            rank = [r.peak_bytes for r in c.prediction.ranks].index(peak)
            assert c.verdict == (f"does not fit: rank {rank} needs {format_bytes(peak)} of 80 MB")
        else:
            assert c.verdict.startswith("not built: ")
    assert got.top(3) == [c for c in got.candidates if _fits(c, limit)][:3]
    # some lose by memory here, so the budget mattered
    assert any(c.verdict.startswith("does not fit") for c in got.candidates)


def test_each_candidate_is_what_predict_says_for_it_alone():
    """The plan's numbers are `predict`'s on the candidate's partition, the profile scaled to
    its microbatch: the activations twice the profile's at twice its microbatch."""
    prof = _gpt(microbatch=2, bandwidth=None)
    got = planner.plan(prof, world=2, global_batch=16, memory="1GB", schedules=["1f1b", "zb-v"])
    assert {c.dp for c in got.candidates} == {1}
    for c in got.candidates:
        assert c.microbatch_size == 16 // c.microbatches
        factor = c.microbatch_size / 2
        pred = c.prediction
        assert pred is not None
        for mine, base in zip(pred.profile.layers, prof.layers, strict=True):
            assert mine.activation_bytes == int(base.activation_bytes * factor)
            assert mine.output_bytes == int(base.output_bytes * factor)
            assert mine.param_bytes == base.param_bytes  # the weights do not scale
            # nor a weight pass's transients: a gradient being made, the weights' size
            assert (
                mine.weight_grad_accumulate_extra_bytes == base.weight_grad_accumulate_extra_bytes
            )
            assert mine.forward.median == pytest.approx(base.forward.median * factor)
        alone = planner.predict(
            pred.profile, c.schedule, pp=2, microbatches=c.microbatches, stages=c.stages
        )
        assert [r.peak_bytes for r in alone.ranks] == [r.peak_bytes for r in pred.ranks]
        assert c.step_seconds == pytest.approx(alone.step_seconds)
        assert c.peak_bytes == max(r.peak_bytes for r in alone.ranks)


def test_the_v_puts_the_embedding_and_the_head_on_rank_0_and_the_partition_balances_it():
    got = planner.plan(_gpt(), world=2, global_batch=8, memory="1GB", schedules=["zb-v"])
    c = got.chosen
    assert c is not None and c.stages[0].start == 0 and c.stages[-1].stop == len(_gpt())
    assert c.prediction.schedule.stage_to_rank[0] == c.prediction.schedule.stage_to_rank[-1] == 0
    naive = planner.partition(c.prediction.profile, 4, placement="v", pp=2)
    assert c.stages == naive.stages  # balanced by time, as partition balances it


def test_data_parallel_adds_the_ring_all_reduce_of_the_fullest_ranks_gradients():
    bandwidth = 2e9
    got = planner.plan(_gpt(bandwidth=bandwidth), world=4, global_batch=16, memory="1GB",
                       dp=2, schedules=["1f1b"])  # fmt: skip
    for c in got.candidates:
        assert (c.pp, c.dp) == (2, 2)
        pred = c.prediction
        grads = [sum(pred.profile.layers[i].grad_bytes for i in part) for part in c.stages]
        assert c.step_seconds == pytest.approx(
            pred.step_seconds + 2 * (2 - 1) / 2 * max(grads) / bandwidth
        )
    # the bandwidth given beats the profile's; without either, dp > 1 is refused
    slow = planner.plan(_gpt(bandwidth=bandwidth), world=4, global_batch=16, memory="1GB",
                        dp=2, schedules=["1f1b"], bandwidth=bandwidth / 10)  # fmt: skip
    assert slow.chosen.step_seconds > got.chosen.step_seconds
    with pytest.raises(ValueError, match="dp=2 replicas.*bandwidth"):
        planner.plan(_gpt(bandwidth=None), world=4, global_batch=16, memory="1GB", dp=2)


def test_too_few_microbatches_for_a_schedule_is_said_not_hidden():
    got = planner.plan(_gpt(), world=4, global_batch=2, memory="1GB", dp=1,
                       schedules=["interleaved-1f1b", "gpipe"])  # fmt: skip
    refused = [c for c in got.candidates if c.schedule == "interleaved-1f1b"]
    assert refused and all(c.verdict.startswith("not built: ") for c in refused)
    assert all("microbatch" in c.verdict for c in refused)
    assert got.chosen.schedule == "gpipe"


def test_a_tight_budget_picks_a_plan_that_fits_where_the_roomy_ones_choice_does_not():
    roomy = planner.plan(_gpt(), world=4, global_batch=16, memory="1GB", dp=1)
    tight_limit = (roomy.chosen.peak_bytes + min(c.peak_bytes for c in roomy.candidates
                                                  if c.prediction is not None)) // 2  # fmt: skip
    tight = planner.plan(_gpt(), world=4, global_batch=16, memory=tight_limit, dp=1)
    assert tight.chosen is not None and tight.chosen.peak_bytes <= tight_limit
    assert tight.chosen.step_seconds >= roomy.chosen.step_seconds
    assert (tight.chosen.schedule, tight.chosen.microbatches) != (
        roomy.chosen.schedule,
        roomy.chosen.microbatches,
    )


def _state(c: planner.Candidate) -> int:
    """The most parameter, gradient and optimizer bytes on one of its ranks."""
    return max(r.parameters + r.gradients + r.optimizer for r in c.prediction.ranks)


def test_nothing_fits_says_the_least_any_candidate_needs_and_what_would_lower_it():
    prof = _gpt()
    roomy = planner.plan(prof, world=4, global_batch=16, memory="1GB")
    state = min(_state(c) for c in roomy.candidates if c.prediction is not None)
    # the model's state fits on the deepest pipeline's ranks, what it holds for the
    # backward does not: what to lower is that
    got = planner.plan(prof, world=4, global_batch=16, memory=state + 1)
    assert got.chosen is None and got.top() == []
    least = min(c.peak_bytes for c in got.candidates if c.prediction is not None)
    assert f"least any candidate needs is {format_bytes(least)}" in got.advice
    assert "nothing fits" in str(got)
    assert f"the model's state fits ({format_bytes(state)}" in got.advice
    assert "Activation checkpointing" in got.advice
    # a budget below the deepest pipeline's state: more devices
    below = planner.plan(prof, world=4, global_batch=16, memory=state - 1)
    assert below.chosen is None
    assert f"alone need {format_bytes(state)}" in below.advice and "more devices" in below.advice


def test_the_plan_prints_a_table_with_every_candidate():
    got = planner.plan(_gpt(), world=2, global_batch=4, memory="1GB", schedules=["1f1b"])
    text = str(got)
    assert text.startswith("plan for 2 devices of 1 GB, global batch 4: 1f1b, pp=2")
    assert len(text.splitlines()) == 2 + len(got.candidates)
    assert "<pre>" in got._repr_html_()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"memory": "10MB"}, "below the parameters, gradients and optimizer state alone"),
        ({"world": 7}, "no pipeline degree fits world=7"),
        ({"world": 1}, "no pipeline degree fits world=1"),
        ({"global_batch": 3, "dp": 2}, "no microbatch count divides the batch"),
        ({"schedules": ["zb-h3"]}, "unknown schedule 'zb-h3'"),
        ({"memory": "80 parsecs"}, "is not a size"),
        ({"dp": 3}, "dp=3 does not divide world=4"),
        ({"world": 0}, "world must be an int >= 1"),
        ({"global_batch": 2.5}, "global_batch must be an int >= 1"),
        ({"bandwidth": -1.0}, "bandwidth is bytes/s > 0"),
    ],
)
def test_bad_input_gets_one_clear_line(kwargs, message):
    args = {"world": 4, "global_batch": 16, "memory": "1GB"} | kwargs
    with pytest.raises(ValueError, match=message) as err:
        planner.plan(_gpt(blocks=3), **args)
    assert "\n" not in str(err.value)


def test_a_profile_is_required():
    with pytest.raises(TypeError, match="plan takes a planner.Profile or a dict of them"):
        planner.plan([], world=2, global_batch=4, memory="1GB")


def test_profiles_by_size_are_taken_as_they_are_and_the_nearest_scaled():
    """A candidate whose microbatch has a profile of its own takes it unscaled; one without
    scales the largest smaller one (here 4 -> 8 from 4, 1 from 2)."""
    two, four = _gpt(microbatch=2), _gpt(microbatch=4, bandwidth=None)
    four = replace(four, layers=tuple(replace(x, activation_bytes=x.activation_bytes + 7)
                                      for x in four.layers))  # fmt: skip
    got = planner.plan({2: two, 4: four}, world=2, global_batch=16, memory="1GB",
                       schedules=["1f1b"])  # fmt: skip
    by_size = {c.microbatch_size: c.prediction.profile for c in got.candidates}
    assert by_size[2] is two and by_size[4] is four
    assert by_size[8].layers[1].activation_bytes == 2 * four.layers[1].activation_bytes
    assert by_size[1].layers[1].activation_bytes == two.layers[1].activation_bytes // 2
    assert planner.profile_sizes(16, 2, two) == [1, 2, 4, 8, 16]
    with pytest.raises(ValueError, match="under size 3 was taken on a microbatch of 2"):
        planner.plan({3: two}, world=2, global_batch=16, memory="1GB")
    with pytest.raises(ValueError, match="not of one model"):
        planner.plan({2: two, 4: _gpt(blocks=2, microbatch=4)}, world=2, global_batch=16,
                     memory="1GB")  # fmt: skip


# ---- check: the top candidates run for real ---------------------------------------------

V, H, S = 128, 32, 8


def _model() -> list:
    torch.manual_seed(0)
    mlp = [nn.Sequential(nn.Linear(H, 4 * H), nn.GELU(), nn.Linear(4 * H, H)) for _ in range(2)]
    return [nn.Embedding(V, H), *mlp, nn.Linear(H, V)]


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out.reshape(-1, V), target.reshape(-1))


def _batch(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, V, (rows, S), generator=g), torch.randint(0, V, (rows, S), generator=g)


@pytest.mark.multiprocess
def test_check_measures_the_top_candidates_each_its_own_program_and_stages():
    layers, batch = _model(), _batch(8)
    prof = planner.profile(layers, (batch[0][:2], batch[1][:2]), loss_fn=_loss, repeats=2)
    got = planner.plan(prof, world=2, global_batch=8, memory="1GB", schedules=["1f1b", "zb-h1"],
                       max_microbatches=4)  # fmt: skip
    lines = []
    checked = planner.check(got, layers, batch, loss_fn=_loss, top=2, rounds=2, steps=2,
                            warmup=2, progress=lines.append)  # fmt: skip
    assert checked.candidates == got.top(2)
    # two rounds, taking turns; each comparison against its candidate's fastest run
    assert lines == [f"measuring {i + 1} of 4: {c.schedule} pp=2 m={c.microbatches}"
                     for i, c in enumerate(got.top(2) * 2)]  # fmt: skip
    for comp, runs in zip(checked.comparisons, checked.runs, strict=True):
        assert len(runs) == 2
        assert comp.measured is min(runs, key=lambda run: run.step_seconds)
    for cand, comp in zip(checked.candidates, checked.comparisons, strict=True):
        assert comp.prediction is cand.prediction
        assert comp.measured.program is cand.prediction.schedule
        assert comp.measured.stages == cand.stages
        # the microbatch's size is the profile's at m = 4, twice it at m = 2: the bytes
        # scaled to it still match the allocator's
        assert all(abs(r - 1) < 0.1 for r in comp.peak_ratios), (cand, comp.peak_ratios)
    secs = checked.measured_seconds
    assert checked.chosen_ratio == pytest.approx(secs[0] / min(secs))
    assert str(checked).startswith("the chosen plan measured")


def test_check_refuses_what_it_cannot_run_before_starting_a_rank():
    prof = _gpt()
    roomy = planner.plan(prof, world=2, global_batch=8, memory="1GB", schedules=["1f1b"])
    with pytest.raises(
        ValueError, match="the batch has 4 rows but the plan is for a global batch of 8"
    ):
        planner.check(roomy, _model(), _batch(4), loss_fn=_loss)
    with pytest.raises(ValueError, match=r"batch is \(inputs, targets\)"):
        planner.check(roomy, _model(), _batch(8)[0], loss_fn=_loss)
    with pytest.raises(ValueError, match="top must be an int >= 1"):
        planner.check(roomy, _model(), _batch(8), loss_fn=_loss, top=0)
    with pytest.raises(ValueError, match="rounds must be an int >= 1"):
        planner.check(roomy, _model(), _batch(8), loss_fn=_loss, rounds=0)
    static = sum(x.param_bytes + x.grad_bytes + x.optimizer_bytes for x in prof.layers)
    none = planner.plan(prof, world=2, global_batch=8, memory=static // 2 + 1)
    assert none.chosen is None
    with pytest.raises(ValueError, match="nothing in the plan fits"):
        planner.check(none, _model(), _batch(8), loss_fn=_loss)
    with pytest.raises(TypeError, match="check takes a planner.plan"):
        planner.check(prof, _model(), _batch(8), loss_fn=_loss)


def test_the_summary_is_the_verdict_and_the_first_rows():
    got = planner.plan(_gpt(), world=4, global_batch=16, memory="80MB")
    lines = str(got).splitlines()
    short = got.summary(5).splitlines()
    assert short[:7] == lines[:7]
    assert short[-1] == f"... and {len(lines) - 7} more candidates"


def test_plot_peaks_stacks_each_ranks_parts_to_its_breakdown():
    pytest.importorskip("matplotlib")
    prof = _gpt()
    preds = [planner.predict(prof, name, pp=2, microbatches=4) for name in ("1f1b", "zb-v")]
    fig = planner.plot_peaks(preds, unit="MB")
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == ["1f1b (m=4)", "zb-v (m=4)"]
    for ax, pred in zip(axes, preds, strict=True):
        tops = {}
        for bar in ax.patches:  # stacked: each rank's bars end at its parts' sum
            rank = round(bar.get_x() + bar.get_width() / 2)
            tops[rank] = max(tops.get(rank, 0), bar.get_y() + bar.get_height())
        for r, rank in enumerate(pred.ranks):
            assert tops[r] == pytest.approx(sum(rank.breakdown.values()) / 1e6)
    with pytest.raises(ValueError, match="unit is GB, GiB, MB or MiB"):
        planner.plot_peaks(preds, unit="furlongs")
    with pytest.raises(ValueError, match="takes a list of planner.predict"):
        planner.plot_peaks([])


def test_the_partition_plot_draws_both_splits_per_rank():
    pytest.importorskip("matplotlib")
    part = planner.partition(_gpt(), 4, placement="v", pp=2)
    left, right = part.plot().axes
    heights = [bar.get_height() for bar in left.patches]
    assert heights == pytest.approx([s * 1e3 for s in (*part.naive_seconds, *part.seconds)])
    heights = [bar.get_height() for bar in right.patches]
    assert heights == pytest.approx([b / 2**20 for b in (*part.naive_bytes, *part.bytes)])
