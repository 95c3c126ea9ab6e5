import pytest

from zbkit.schedules import SCHEDULES, Action, Schedule, ScheduleError, build_schedule


def test_text_form_round_trips_and_is_hashable():
    a = Action(1, "I", 2)
    assert str(a) == "1I2"
    assert Action.parse("1I2") == a
    assert Action.parse(" 12w30 ") == Action(12, "W", 30)
    assert len({a, Action(1, "I", 2), Action(1, "W", 2)}) == 2
    with pytest.raises(AttributeError):
        a.stage = 3  # frozen


@pytest.mark.parametrize("bad", ["1X2", "F2", "1F", "", "one F two", "1SEND_F2"])
def test_parse_rejects_garbage_with_a_hint(bad):
    with pytest.raises(ValueError, match="0F3|unknown action kind"):
        Action.parse(bad)


def test_constructor_checks_kind_and_indices():
    with pytest.raises(ValueError, match="unknown action kind 'Q'"):
        Action(0, "Q", 0)
    with pytest.raises(ValueError, match=">= 0"):
        Action(-1, "F", 0)
    with pytest.raises(TypeError, match="not bools"):
        Action(True, "F", 0)
    with pytest.raises(TypeError, match="must be ints"):
        Action(0, "F", 1.0)


def test_from_program_accepts_strings_and_infers_placement():
    s = Schedule.from_program([["0F0", "0B0"], ["1F0", "1B0"]])
    assert s.stage_to_rank == [0, 1] and s.microbatches == 1 and s.pp == 2
    assert s.program[1][1] == Action(1, "B", 0)
    assert s.is_first_stage(0) and s.is_last_stage(1) and not s.is_last_stage(0)
    with pytest.raises(ScheduleError, match="rank 1, position 0"):
        Schedule.from_program([["0F0"], ["xx"]])
    with pytest.raises(ScheduleError, match="stage 0.*rank 0 also runs"):
        Schedule.from_program([["0F0"], ["0B0"]])


def test_grid_lists_every_rank_and_marks_errors():
    s = build_schedule("1f1b", pp=3, microbatches=4)
    grid = str(s)
    rows = grid.splitlines()
    assert len(rows) == 4 and rows[1].startswith("rank 0") and "0F0" in rows[1]
    marked = s.to_grid([(2, 3)])
    line = next(r for r in marked.splitlines() if r.startswith("rank 2"))
    assert "[" in line and line.endswith("<-- ERROR HERE")
    assert f"[{str(s.program[2][3]):^3}]" in line


def test_every_name_builds_and_an_unknown_one_is_refused_with_the_choices():
    # behaviour, not a pinned list: every listed name builds; a wrong one names them all
    assert len(set(SCHEDULES)) == len(SCHEDULES) and "zb-h3" not in SCHEDULES
    for name in SCHEDULES:
        assert build_schedule(name, pp=2, microbatches=4).pp == 2, name
    with pytest.raises(ValueError, match="unknown schedule 'zb-h3'") as refused:
        build_schedule("zb-h3", pp=2, microbatches=2)
    assert all(name in str(refused.value) for name in SCHEDULES)
    with pytest.raises(ValueError, match="pp must be an int >= 1"):
        build_schedule("1f1b", pp=0, microbatches=2)


def test_a_trusted_action_is_the_same_action():
    a, b = Action.trusted(1, "I", 2), Action(1, "I", 2)
    assert a == b and hash(a) == hash(b) and str(a) == "1I2" and a < Action(1, "I", 3)
    # the V builders make theirs this way: the same programs as a checked construction
    s = build_schedule("v-half", pp=3, microbatches=6)
    assert s.program == {r: [Action(a.stage, a.kind, a.microbatch) for a in row]
                         for r, row in s.program.items()}  # fmt: skip
