"""torch's whole vocabulary kept (issue 13): its lowered compute_comms files load, validate,
simulate and write back unchanged; torch loads what zbkit writes; DualPipeV and overlapped
pairs agree with torch's own classes and verdicts. torch's code is the oracle throughout
(its schedule classes run here on stand-in stages: they only read sizes from them)."""

import csv
import io
import itertools
from collections import Counter
from types import SimpleNamespace

import pytest

from zbkit.schedules import (
    Costs,
    Overlap,
    Schedule,
    ScheduleError,
    build_schedule,
    simulate,
    validate,
)

ts = pytest.importorskip("torch.distributed.pipelining.schedules")

MULTI = ["ScheduleDualPipeV", "ScheduleZBVZeroBubble", "ScheduleInterleavedZeroBubble",
         "ScheduleInterleaved1F1B", "ScheduleLoopedBFS"]  # fmt: skip


def torch_schedule(cls: str, p: int, m: int, v: int = 2):
    stages = [SimpleNamespace(num_stages=v * p, group_size=p, group_rank=0, submod=None)
              for _ in range(v)]  # fmt: skip
    return getattr(ts, cls)(stages, m)


def rows_text(order) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for rank in sorted(order):
        writer.writerow([str(a) for a in order[rank] if a is not None])
    return out.getvalue()


@pytest.mark.parametrize("cls", MULTI)
def test_torch_lowered_files_load_validate_and_go_back_into_torch_unchanged(cls, tmp_path):
    for p, m in [(2, 4), (3, 6), (4, 8)]:
        theirs = torch_schedule(cls, p, m)
        text = rows_text(theirs.pipeline_order_with_comms)
        ours = Schedule.from_csv(text)
        validate(ours)  # transfers matched, FSDP actions in order
        assert any(ours.torch_ops.values())
        assert ours.to_csv() == text  # every cell kept, in place
        # the compute is torch's compute-only program, and simulates
        assert ours.to_csv(comms=False) == rows_text(theirs.pipeline_order)
        assert simulate(ours, Costs(1, 1, 1, comm=0.1)).makespan > 0
        # torch's own loader reads zbkit's file back to the same lowered program
        path = tmp_path / f"{cls}_{p}_{m}.csv"
        path.write_text(ours.to_csv())
        again = torch_schedule(cls, p, m)
        again._load_csv(str(path), format="compute_comms")
        assert rows_text(again.pipeline_order_with_comms) == text


def test_transfers_zbkit_derives_are_the_ones_torch_lowers_to():
    """`to_csv(comms=True)` for a schedule zbkit built: the same SEND/RECV per rank as torch's
    own lowering pass of the same compute program."""
    for name, p, m in itertools.product(("1f1b", "zb-h1", "zb-v", "dualpipev", "interleaved-zb"),
                                        (2, 3), (6, 8)):  # fmt: skip
        s = build_schedule(name, pp=p, microbatches=m)
        ours = Schedule.from_csv(s.to_csv(comms=True), stage_to_rank=s.stage_to_rank)
        validate(ours)
        compute = {r: [ts._Action.from_str(c) for c in s.row(r, [])] for r in range(p)}
        lowered = ts._add_send_recv(compute, s.stage_to_rank.__getitem__, s.num_stages)
        for r in range(p):
            want = Counter(str(a) for a in lowered[r] if "SEND" in str(a) or "RECV" in str(a))
            got = Counter(str(op) for _, op in ours.torch_ops[r])
            assert got == want, (name, p, m, r)


TORCH_DUALPIPE = "1UNSHARD,2UNSHARD,1RECV_F0,1F0,1RECV_F1,2F0,2SEND_F0"


@pytest.mark.parametrize(
    "edit,says",
    [
        (lambda t: t.replace("0SEND_F0,", "", 1), "1RECV_F0 has no matching 0SEND_F0 on rank 0"),
        (lambda t: t.replace(",1RECV_F0", "", 1), "0SEND_F0 has no matching 1RECV_F0 on rank 1"),
        (lambda t: t.replace("0F0,0SEND_F0", "0SEND_F0,0F0", 1), "0SEND_F0 comes before 0F0"),
        (
            lambda t: t.replace("0SEND_F0,", "", 1).replace(",1RECV_F0", "", 1),
            "0SEND_F0 is needed (a transfer between ranks) but missing",
        ),  # fmt: skip
        (lambda t: t.replace("0UNSHARD,", "", 1), "0UNSHARD is missing before 0F0"),
        (lambda t: t.replace("0SEND_F0", "0SEND_F", 1), "'0SEND_F': SEND_F takes a microbatch"),
        (lambda t: t.replace("0UNSHARD", "0UNSHARD3", 1), "UNSHARD takes no microbatch"),
    ],
)
def test_a_wrong_transfer_or_fsdp_action_is_named_in_one_line(edit, says):
    text = rows_text(torch_schedule("ScheduleDualPipeV", 2, 4).pipeline_order_with_comms)
    assert "0F0,0SEND_F0" in text and ",1RECV_F0" in text
    with pytest.raises(ScheduleError) as err:
        validate(Schedule.from_csv(edit(text)))
    assert says in str(err.value), str(err.value)


def test_reduce_grad_before_the_last_weight_gradient_is_refused():
    text = rows_text(torch_schedule("ScheduleDualPipeV", 2, 4).pipeline_order_with_comms)
    row0 = text.splitlines()[0].split(",")
    row0.remove("0REDUCE_GRAD")
    row0.insert(row0.index("0UNSHARD") + 2, "0REDUCE_GRAD")
    edited = "\n".join([",".join(row0), *text.splitlines()[1:]]) + "\n"
    with pytest.raises(
        ScheduleError, match="0REDUCE_GRAD comes before the last weight gradient of stage 0"
    ):
        validate(Schedule.from_csv(edited))


# ---- DualPipeV and overlapped pairs ---------------------------------------------------------


def test_dualpipev_program_is_torchs_pipeline_order():
    for p, m in itertools.product(range(1, 7), range(1, 20)):
        if m < 2 * p:  # torch refuses these, and so does zbkit
            with pytest.raises(ValueError, match="at least as many microbatches as stages"):
                torch_schedule("ScheduleDualPipeV", p, m)
            with pytest.raises(ValueError, match=f"at least the number of stages 2.pp = {2 * p}"):
                build_schedule("dualpipev", pp=p, microbatches=m)
            continue
        ours = build_schedule("dualpipev", pp=p, microbatches=m)
        validate(ours)
        theirs = torch_schedule("ScheduleDualPipeV", p, m).pipeline_order
        assert ours.to_csv(comms=False) == rows_text(theirs), (p, m)
        assert ours.stage_to_rank == list(range(p)) + list(reversed(range(p)))


def _torch_accepts(text: str) -> bool:
    """torch's verdict on a compute-only program: its lowering pass schedules the sends and
    receives, or stops ("Malformed compute schedule") when no rank can move on."""
    rows = [[ts._Action.from_str(c) for c in line.split(",")] for line in text.splitlines()]
    compute = dict(enumerate(rows))
    try:
        ts._add_send_recv(compute, lambda s: s, len(rows))
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize(
    "text,ok,says",
    [
        # the case: 0B0 needs 1B0, which needs 1F1, which needs 0F1 of the same pair
        ("0F0,(0F1;0B0)OVERLAP_F_B,0B1\n1F0,1F1,1B0,1B1", False, "deadlock"),
        ("0F0,0F1,0B0,0B1\n1F0,(1F1;1B0)OVERLAP_F_B,1B1", True, ""),
        # a half that needs the other half of its own pair
        ("0F0,(0F1;0B1)OVERLAP_F_B,0B0\n1F0,1F1,1B0,1B1", False, "the other half of its"),
    ],
)
def test_overlapped_pairs_are_accepted_and_refused_as_torch_does(text, ok, says):
    assert _torch_accepts(text) is ok
    schedule = Schedule.from_csv(text + "\n")
    assert any(isinstance(item, Overlap) for row in schedule.program.values() for item in row)
    if ok:
        validate(schedule)
    else:
        with pytest.raises(ScheduleError, match=says):
            validate(schedule)


def test_a_pair_costs_f_plus_b_less_what_it_hides_and_is_drawn_as_two_halves():
    s = Schedule.from_csv("0F0,0F1,0B0,0B1\n1F0,(1F1;1B0)OVERLAP_F_B,1B1\n")
    for overlap, pair in [(0.0, 3.0), (1.0, 2.0), (5.0, 2.0)]:  # never below the longer half
        sim = simulate(s, Costs(F=1, I=1, W=1, overlap=overlap))
        halves = [e for e in sim.events if e.paired]
        assert [(e.stage, e.kind, e.microbatch) for e in halves] == [(1, "F", 1), (1, "B", 0)]
        assert halves[1].end - halves[0].start == pytest.approx(pair)
        assert halves[0].end == halves[1].start  # one box, cut in proportion F : B
        assert (halves[0].end - halves[0].start) * 2 == pytest.approx(
            halves[1].end - halves[1].start
        )
    # the pair's output is there when it ends: 0B0 waits for 1B0's gradient
    sim = simulate(s, Costs(F=1, I=1, W=1))
    pair_end = next(e for e in sim.events if e.paired and e.kind == "B").end
    assert pair_end == 5.0  # 1F0 [1, 2], then the pair [2, 5]
    assert next(e for e in sim.events if e.label == "0B0").start == pair_end


def test_dualpipev_gains_only_what_its_pairs_hide():
    # dense compute (overlap = 0): DualPipeV is no faster than ZB-V; hiding comm, it is
    for p, m in [(4, 8), (4, 16)]:
        dual = build_schedule("dualpipev", pp=p, microbatches=m)
        zbv = build_schedule("zb-v", pp=p, microbatches=m)
        plain = Costs(1, 1, 1)
        assert simulate(dual, plain).makespan >= simulate(zbv, plain).makespan
        hides = Costs(1, 1, 1, overlap=0.5)
        assert simulate(dual, hides).makespan < simulate(zbv, hides).makespan
        # memory: one chunk more than ZB-V's 2p chunks at the peak (measured 2p + 1), each
        # chunk half a rank's share: p + 1/2 against ZB-V's p
        assert max(simulate(dual, plain).peak_memory) == (2 * p + 1) / 2
        assert max(simulate(zbv, plain).peak_memory) == p


def test_the_grid_shows_the_transfers_and_fsdp_actions_in_their_places():
    text = rows_text(torch_schedule("ScheduleDualPipeV", 2, 4).pipeline_order_with_comms)
    loaded = Schedule.from_csv(text)
    grid = loaded.to_grid(comms=True).splitlines()
    assert grid[1].split()[2:] == text.splitlines()[0].split(",")  # rank 0's row, cell by cell
    assert "0UNSHARD" not in loaded.to_grid()  # the compute grid stays compute only
    built = build_schedule("1f1b", pp=2, microbatches=2)  # derived for a schedule zbkit built
    rows = [line.split()[2:] for line in built.to_grid(comms=True).splitlines()[1:]]
    assert rows == [line.split(",") for line in built.to_csv(comms=True).splitlines()]
    assert rows[0][:2] == ["0F0", "0SEND_F0"] and rows[1][:2] == ["1RECV_F0", "1F0"]
