"""Every schedule's record across sizes (builds, validates, simulates, its closed forms, its
torch class, its options), the papers' closed forms (comm = 0), and a schedule registered
in a test reaching every place that lists schedules."""

import itertools
from dataclasses import replace

import pytest

from zbkit.schedules import (
    KINDS,
    SCHEDULES,
    Costs,
    ScheduleError,
    build_schedule,
    compare_with_torch,
    simulate,
    validate,
)
from zbkit.schedules.builders import check_counts
from zbkit.schedules.catalog import RECORDS, register, stage_to_rank
from zbkit.schedules.formulas import bubble, conditions, peak_memory

PP = (2, 3, 4, 8)
MS = (1, 2, 3, 5, 8, 13, 16, 24)
EQUAL = Costs(F=1.5, I=1.5, W=1.5)  # the closed forms for ZB-H2/ZB-V assume F = I = W
UNEQUAL = Costs(F=1.0, I=1.3, W=0.6)


def rate(bubble, work):
    return bubble / (work + bubble)


# sizes every schedule builds (m a multiple of 2p fits every builder's rule)
SIZES = ((1, 2), (2, 4), (2, 8), (3, 6), (4, 8), (4, 16))


# a proof's size: sizes above it are left out for the records that prove (zb-opt), which
# would take seconds to a minute each here (they refuse above `record.largest` anyway)
PROOF_ACTIONS = 48


def _proof_too_large(record, p: int, m: int) -> bool:
    return record.largest is not None and 3 * len(record.stage_to_rank(p)) * m > PROOF_ACTIONS


def _build(record, p: int, m: int, **options):
    if record.searches == "always":  # a search plans for costs
        options.setdefault("costs", UNEQUAL)
    return build_schedule(record.name, pp=p, microbatches=m, **options)


@pytest.mark.parametrize("name", RECORDS)
def test_every_record_builds_validates_and_simulates(name):
    record = RECORDS[name]
    for p, m in SIZES:
        if _proof_too_large(record, p, m):
            continue
        s = _build(record, p, m)
        validate(s)
        check_counts(s)
        assert (s.name, s.pp, s.microbatches) == (name, p, m)
        assert s.stage_to_rank == record.stage_to_rank(p)  # where its record says
        # every stage does F, I and W once per microbatch, fused (B) or not
        parts = sum(len(KINDS[a.kind].parts) for r in s.program for a in s.actions(r))
        assert parts == 3 * s.num_stages * m
        sim = simulate(s, UNEQUAL)
        work = m * (UNEQUAL.F + UNEQUAL.I + UNEQUAL.W)  # a rank's share, whatever its chunks
        assert sim.makespan >= work - 1e-9 and 0 <= sim.bubble_rate < 1


@pytest.mark.parametrize("name", [n for n, r in RECORDS.items() if r.formulas is not None])
def test_a_records_closed_forms_equal_the_simulator_where_they_hold(name):
    """Wherever a record's formulas give a number (the CLI and the explorer print it), it
    is the simulation's; where their assumptions fail they give none, and the record's
    conditions say what they need."""
    shown = 0
    for p, m in itertools.product((2, 3, 4, 6), range(1, 15)):
        try:
            schedule = build_schedule(name, pp=p, microbatches=m)
        except ValueError:
            continue  # interleaved-1f1b: m must be a multiple of p
        v = schedule.stages_per_rank
        for c in (Costs(1, 1, 1), Costs(2, 3, 1), Costs(1.5, 1.2, 0.5), Costs(1, 1, 2)):
            sim = simulate(schedule, c)
            form = bubble(name, p, m, v, c)
            if form is not None:
                assert sim.bubble_rate == pytest.approx(form.rate, abs=1e-12), (name, p, m, c)
                shown += 1
            peak = peak_memory(name, p, m, v, c)
            if peak is not None:
                assert sim.peak_memory == pytest.approx(peak[1]), (name, p, m, peak[0])
                shown += 1
    assert shown > 50
    if RECORDS[name].formulas.conditions:  # some settings fall outside, and it says so
        assert conditions(name) == RECORDS[name].formulas.conditions


def test_a_closed_form_outside_its_conditions_is_none():
    assert bubble("zb-h1", 4, 2, 1, Costs()) is None and "m >= p" in conditions("zb-h1")
    assert bubble("zb-auto", 4, 8, 1, Costs()) is None  # a search has none
    assert bubble("loaded from a file", 4, 8, 1, Costs()) is None  # a name with no record


@pytest.mark.parametrize("name", [n for n, r in RECORDS.items() if r.torch])
def test_a_records_torch_class_round_trips_through_from_torch(name):
    torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    from zbkit.schedules import Schedule

    record = RECORDS[name]
    for cls in record.torch:
        if not hasattr(torch_schedules, cls):
            continue  # an older torch without it
        theirs = Schedule.from_torch(cls, pp=4, microbatches=8)
        assert theirs.name == name and theirs.stage_to_rank == record.stage_to_rank(4)
        assert compare_with_torch(name, pp=4, microbatches=8).name == name


def test_frontier_styles_are_unique_and_every_schedule_has_one():
    pytest.importorskip("matplotlib")
    from zbkit.viz.frontier import STYLES

    assert len(set(STYLES.values())) == len(STYLES)
    points = [r.name for r in RECORDS.values() if not r.placements]
    curves = [f"{r.name} ({p})" for r in RECORDS.values() for p in r.placements]
    assert sorted(STYLES) == sorted(points + curves)


def test_a_torch_class_belongs_to_one_record():
    with pytest.raises(ValueError, match="torch's ScheduleGPipe is already 'gpipe'"):
        register(replace(RECORDS["gpipe"], name="grey-again"))
    assert "grey-again" not in SCHEDULES


@pytest.mark.parametrize("name", RECORDS)
def test_a_record_takes_its_options_and_refuses_others(name):
    record = RECORDS[name]
    plain = _build(record, 2, 4)
    for option, default in record.options.items():  # its default, given: the same schedule
        assert _build(record, 2, 4, **{option: default}).program == plain.program, option
    takes = ", ".join(record.options) or "no options"
    with pytest.raises(ValueError, match=f"bad option 'bogus' \\({name} takes {takes}\\)"):
        _build(record, 2, 4, bogus=1)
    if record.searches == "never":
        with pytest.raises(ValueError, match="takes no costs"):
            build_schedule(name, pp=2, microbatches=4, costs=EQUAL)
    else:  # it builds for costs, under a limit
        s = build_schedule(name, pp=2, microbatches=4, costs=UNEQUAL, memory_limit=4)
        assert max(simulate(s, UNEQUAL).peak_memory) <= 4 + 1e-9


def test_one_placement_function_for_every_schedule():
    assert stage_to_rank("linear", 3) == [0, 1, 2] == stage_to_rank("looped", 3, 1)
    assert stage_to_rank("looped", 3, 2) == [0, 1, 2, 0, 1, 2]  # Megatron's and torch's loop
    assert stage_to_rank("v", 3) == [0, 1, 2, 2, 1, 0]  # down the ranks and back up
    with pytest.raises(ValueError, match="placement must be"):
        stage_to_rank("w", 3)


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


@pytest.fixture
def toy():
    """GPipe under another name: a record and a tiny builder, registered for one test."""
    from zbkit.schedules.catalog import ScheduleRecord

    def gpipe_again(pp: int, m: int, name: str):
        schedule = build_schedule("gpipe", pp=pp, microbatches=m)
        schedule.name = name
        return schedule

    record = ScheduleRecord("gpipe-again", gpipe_again, "GPipe, registered by a test")
    register(record)
    try:
        yield record
    finally:
        del RECORDS[record.name]
    assert "gpipe-again" not in SCHEDULES


def test_a_registered_record_reaches_every_place_that_lists_schedules(toy, capsys):
    """One record and one builder, nothing else: the name is in SCHEDULES, builds, is a
    choice of the CLI, a point on the frontier and a schedule in the explorer's dropdown."""
    import argparse

    from zbkit.schedules import cli

    assert SCHEDULES[-1] == "gpipe-again" and "gpipe-again" in SCHEDULES
    built = build_schedule("gpipe-again", pp=3, microbatches=4)
    assert built.program == build_schedule("gpipe", pp=3, microbatches=4).program
    with pytest.raises(ValueError, match="bad option 'stages_per_rank'"):
        build_schedule("gpipe-again", pp=3, microbatches=4, stages_per_rank=2)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.main(parser.parse_args(["gpipe-again", "--pp", "3", "-m", "4"])) == 0
    out = capsys.readouterr().out
    assert "Schedule('gpipe-again'" in out and "GPipe, registered by a test" in parser.format_help()
    pytest.importorskip("matplotlib")
    from zbkit.viz import plot_frontier

    fig = plot_frontier(3, 6, schedules=["gpipe", "gpipe-again"])
    assert [p.label for p in fig.points] == ["gpipe", "gpipe-again"]
    assert fig.points[0][2:] == fig.points[1][2:]  # the same memory and bubble as GPipe
    gids = {line.get_gid() for line in fig.axes[0].get_lines()}
    assert "point:gpipe-again" in gids
    pytest.importorskip("ipywidgets")
    from zbkit.widgets import ScheduleExplorer

    explorer = ScheduleExplorer("gpipe-again", pp=3, microbatches=4)
    assert "gpipe-again" in explorer.controls["schedule"].options
    assert explorer.simulation.schedule.name == "gpipe-again" and explorer.error is None
