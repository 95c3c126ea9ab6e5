"""The validator's negative cases: each names rank, position and action and marks the grid."""

import pytest

from zbkit.schedules import Action, Schedule, ScheduleError, build_schedule, simulate, validate

GOOD = [["0F0", "0F1", "0I0", "0W0", "0I1", "0W1"], ["1F0", "1I0", "1W0", "1F1", "1I1", "1W1"]]


def schedule_with(rank, edit):
    program = [list(r) for r in GOOD]
    edit(program[rank])
    return Schedule.from_program(program, stage_to_rank=[0, 1], microbatches=2)


def swap(i, j):
    def edit(row):
        row[i], row[j] = row[j], row[i]

    return edit


def check(schedule, *needles):
    with pytest.raises(ScheduleError) as info:
        validate(schedule)
    text = str(info.value)
    for needle in needles:
        assert needle in text, text
    assert "<-- ERROR HERE" in text
    return text


def test_the_good_program_validates():
    validate(schedule_with(0, lambda row: None))


def test_missing_action():
    check(schedule_with(1, lambda row: row.remove("1F1")), "1I1", "1F1 is missing", "position 3")
    check(schedule_with(0, lambda row: row.remove("0F1")), "rank 0, position 3", "0F1 is missing")

    def drop_backward(row):
        row.remove("1I1")
        row.remove("1W1")

    check(
        schedule_with(1, drop_backward), "rank 1", "missing the backward of stage 1, microbatch 1"
    )


def test_repeated_action():
    check(schedule_with(0, lambda row: row.append("0W1")), "rank 0, position 6", "repeated")


def test_unknown_stage_and_microbatch():
    check(schedule_with(0, lambda row: row.append("0F5")), "position 6", "unknown action 0F5")
    s = Schedule.from_program(GOOD, stage_to_rank=[0, 1], microbatches=2)
    s.program[1].append(s.program[1][0].__class__(2, "F", 0))
    check(s, "rank 1, position 6", "unknown action 2F0")


def test_w_before_its_i():
    check(schedule_with(0, swap(2, 3)), "rank 0, position 2", "0W0", "before its input grad 0I0")


def test_i_without_w():
    check(
        schedule_with(1, lambda row: row.remove("1W1")), "rank 1, position 4", "1I1", "no matching"
    )


def test_backward_before_forward():
    check(schedule_with(1, swap(0, 1)), "rank 1, position 0", "1I0", "before its forward")


def test_stage_on_two_ranks():
    program = [list(r) for r in GOOD]
    program[0].append("1F1")
    program[1].remove("1F1")
    s = Schedule.from_program(program, stage_to_rank=[0, 1], microbatches=2)
    check(s, "rank 0, position 6", "stage 1 lives on rank 1")


def test_wrong_number_of_ranks():
    s = Schedule.from_program(GOOD + [["0F0"]], stage_to_rank=[0, 1], microbatches=2)
    with pytest.raises(ScheduleError, match="one program per rank 0..1"):
        validate(s)


def test_backward_twice():
    check(schedule_with(0, lambda row: row.append("0B1")), "0B1", "second time")


def test_cross_rank_deadlock_names_who_waits_on_whom():
    # rank 0 wants B0 before sending F1; rank 1 wants F1 before returning B0
    s = Schedule.from_program([["0F0", "0B0", "0F1", "0B1"], ["1F0", "1F1", "1B0", "1B1"]])
    text = check(
        s,
        "deadlock",
        "rank 0, position 1: 0B0 (stage 0, microbatch 0) waits for 1B0 (rank 1, position 2)",
        "rank 1, position 1: 1F1 (stage 1, microbatch 1) waits for 0F1 (rank 0, position 2)",
    )
    assert text.count("<-- ERROR HERE") == 2
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(s)


def test_errors_on_long_programs_show_a_window():
    s = build_schedule("zb-h1", pp=4, microbatches=64)
    row = s.program[2]
    i, w = row.index(Action.parse("2I40")), row.index(Action.parse("2W40"))
    row[i], row[w] = row[w], row[i]
    with pytest.raises(ScheduleError, match=f"rank 2, position {i}: 2W40") as info:
        validate(s)
    grid = str(info.value).split("\n", 1)[1]
    assert "..." in grid and max(len(line) for line in grid.splitlines()) < 200
