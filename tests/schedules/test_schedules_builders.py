"""Every builder across sizes, checked against the papers' closed forms (comm = 0)."""

import itertools

import pytest

from zbkit.schedules import Costs, ScheduleError, build_schedule, simulate, validate
from zbkit.schedules.builders import check_counts

PP = (2, 3, 4, 8)
MS = (1, 2, 3, 5, 8, 13, 16, 24)
EQUAL = Costs(F=1.5, I=1.5, W=1.5)  # the closed forms for ZB-H2/ZB-V assume F = I = W
UNEQUAL = Costs(F=1.0, I=1.3, W=0.6)


def rate(bubble, work):
    return bubble / (work + bubble)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1", "zb-h2", "zb-v", "zb-auto"])
def test_every_builder_validates_for_many_sizes(name):
    for p, m in itertools.product(PP, MS):
        s = build_schedule(name, pp=p, microbatches=m)
        validate(s)
        check_counts(s)
        v = 2 if name == "zb-v" else 1
        assert s.pp == p and s.num_stages == v * p and s.microbatches == m
        assert (
            sum(len(prog) for prog in s.program.values())
            == (2 if name in "gpipe1f1b" else 3) * v * p * m
        )


def test_interleaved_1f1b_accepts_multiples_of_pp_only():
    for p, k, v in itertools.product(PP, (1, 2, 3), (2, 3)):
        s = build_schedule("interleaved-1f1b", pp=p, microbatches=k * p, stages_per_rank=v)
        validate(s)
        assert s.stage_to_rank == [st % p for st in range(v * p)]
        sim = simulate(s, EQUAL, check=False)
        # Megatron: bubble (p-1)(F+B)/v per rank against m(F+B) of work
        t = EQUAL.F + EQUAL.I + EQUAL.W
        assert sim.bubble_rate == pytest.approx(rate((p - 1) * t / v, k * p * t))
    with pytest.raises(ValueError, match="microbatches=6 must be a multiple of pp=4.*try 8"):
        build_schedule("interleaved-1f1b", pp=4, microbatches=6)


@pytest.mark.parametrize("costs", [EQUAL, UNEQUAL])
def test_gpipe_and_1f1b_bubble_is_p_minus_1_times_f_plus_b(costs):
    t = costs.F + costs.I + costs.W
    for name, p, m in itertools.product(("gpipe", "1f1b"), PP, MS):
        sim = simulate(build_schedule(name, pp=p, microbatches=m), costs)
        assert sim.bubble_rate == pytest.approx(rate((p - 1) * t, m * t)), (name, p, m)
        expected_peak = [m] * p if name == "gpipe" else [min(p - r, m) for r in range(p)]
        assert sim.peak_memory == expected_peak


@pytest.mark.parametrize("costs", [EQUAL, UNEQUAL])
def test_zb_h1_bubble_is_p_minus_1_times_f_plus_i_minus_w(costs):
    t = costs.F + costs.I + costs.W
    for p, m in itertools.product(PP, MS):
        if m < p:
            continue  # the formula is for a full pipeline
        sim = simulate(build_schedule("zb-h1", pp=p, microbatches=m), costs)
        bubble = (p - 1) * (costs.F + costs.I - costs.W)
        assert sim.bubble_rate == pytest.approx(rate(bubble, m * t)), (p, m)
        assert sim.peak_memory == [p - r for r in range(p)]  # same as 1F1B


def test_zb_h2_has_zero_bubble_from_2p_minus_1_microbatches():
    for p, m in itertools.product(PP, MS):
        sim = simulate(build_schedule("zb-h2", pp=p, microbatches=m), EQUAL)
        if m >= 2 * p - 1:
            assert sim.bubble_rate == pytest.approx(0.0, abs=1e-12), (p, m)
        else:
            assert sim.bubble_rate > 0
        assert sim.peak_memory == [min(2 * (p - r) - 1, m) for r in range(p)]


def test_zb_v_zero_bubble_at_1f1b_peak_memory():
    for p, m in itertools.product(PP, MS):
        s = build_schedule("zb-v", pp=p, microbatches=m)
        assert s.stage_to_rank == list(range(p)) + list(reversed(range(p)))
        sim = simulate(s, EQUAL)
        # a stage here is half of a 1F1B stage: 1F1B's peak of p microbatches is 2p halves
        assert max(sim.peak_memory) <= 2 * p
        if m >= 2 * p:
            assert sim.bubble_rate == pytest.approx(0.0, abs=1e-12), (p, m)


def test_builders_refuse_bad_options():
    # issue 15's sibling: a costs string was read as a list of its characters
    with pytest.raises(ValueError, match=r"got str '1,1,1' \(Costs.parse\('1,1,1'\) reads"):
        build_schedule("zb-auto", pp=2, microbatches=4, costs="1,1,1")
    with pytest.raises(ValueError, match="got dict"):
        simulate(build_schedule("1f1b", pp=2, microbatches=2), {"F": 1})
    with pytest.raises(ValueError, match="takes no costs"):
        build_schedule("1f1b", pp=2, microbatches=2, costs=EQUAL)
    # zb-v with costs or a limit is zb-auto's V search, under the same name
    for extra in ({"memory_limit": 6}, {"costs": UNEQUAL}):
        got = build_schedule("zb-v", pp=2, microbatches=4, **extra)
        want = build_schedule("zb-auto", pp=2, microbatches=4, placement="v", **extra)
        assert got.program == want.program and got.name == "zb-v"
    with pytest.raises(ValueError, match="memory_limit=0.5 is too small.*at least 1"):
        build_schedule("zb-auto", pp=2, microbatches=4, placement="v", memory_limit=0.5)
    with pytest.raises(ValueError, match="placement must be one of"):
        build_schedule("zb-auto", pp=2, microbatches=4, placement="w")
    with pytest.raises(ValueError, match="bad option 'stages_per_rank'.*no options"):
        build_schedule("gpipe", pp=2, microbatches=2, stages_per_rank=2)
    with pytest.raises(ValueError, match="bad option 'placement'"):
        build_schedule("zb-v", pp=2, microbatches=2, placement="v")


def test_a_broken_builder_output_is_caught_by_the_invariant():
    s = build_schedule("zb-h1", pp=2, microbatches=2)
    s.program[1].pop()
    with pytest.raises(AssertionError, match="stage 1 on rank 1 does the parts .*'W': 1"):
        check_counts(s)
    with pytest.raises(ScheduleError):
        validate(s)
    moved = build_schedule("1f1b", pp=2, microbatches=2)
    moved.program[0].append(moved.program[1].pop())  # 1B1 on rank 0
    with pytest.raises(AssertionError, match="1B1 on rank 0, but stage 1 lives on rank 1"):
        check_counts(moved)


def test_cli_zb_auto_and_zb_v_name_the_candidate_they_kept(capsys):
    import argparse

    from zbkit.schedules.cli import add_arguments
    from zbkit.schedules.cli import main as cli_main

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    # equal costs, the default limit 2p: the search keeps the paper's V (zero bubble)
    assert cli_main(parser.parse_args(["zb-auto", "--pp", "4", "-m", "8", "--placement", "v"])) == 0
    out = capsys.readouterr().out
    assert "zb-auto kept: paper's ZB-V (" in out and "bubble rate: 0.0000" in out
    unit = "rank-microbatches x mem_activation"  # ZB-V holds what 1F1B's rank 0 holds
    assert f"peak memory per rank ({unit}): 4, 4, 4, 4" in out
    # zb-v with a limit or costs is the V search, under its own name
    assert cli_main(parser.parse_args(["zb-v", "--memory-limit", "3", "--costs", "2,3,1"])) == 0
    out = capsys.readouterr().out
    assert "zb-v kept: " in out and "Schedule('zb-v'" in out
    assert f"peak memory per rank ({unit}): 3, 3, 3, 3" in out
    assert cli_main(parser.parse_args(["zb-v"])) == 0  # the paper's: no search, no "kept"
    assert "kept" not in capsys.readouterr().out
    assert cli_main(parser.parse_args(["zb-v", "--costs", "2,3,1", "--placement", "linear"])) == 1
    assert "drop --placement" in capsys.readouterr().err
    assert cli_main(parser.parse_args(["zb-h1", "--placement", "v"])) == 1
    assert "bad option 'placement'" in capsys.readouterr().err


def test_every_closed_form_shown_is_the_simulated_bubble():
    """Wherever `formulas.bubble` gives a number (the CLI and the explorer print it), it is
    the simulation's; where its assumptions fail (zb-h1 with m < p) it gives none."""
    from zbkit.schedules.formulas import CONDITIONS, bubble

    shown = 0
    for name in ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v"):
        for p, m in itertools.product((2, 3, 4, 6), range(1, 15)):
            try:
                schedule = build_schedule(name, pp=p, microbatches=m)
            except ValueError:
                continue  # interleaved-1f1b: m must be a multiple of p
            for c in (Costs(1, 1, 1), Costs(2, 3, 1), Costs(1.5, 1.2, 0.5), Costs(1, 1, 2)):
                form = bubble(name, p, m, schedule.stages_per_rank, c)
                if form is not None:
                    rate = simulate(schedule, c).bubble_rate
                    assert rate == pytest.approx(form.rate, abs=1e-12), (name, p, m, c)
                    shown += 1
    assert shown > 500
    assert bubble("zb-h1", 4, 2, 1, Costs()) is None and "m >= p" in CONDITIONS["zb-h1"]
