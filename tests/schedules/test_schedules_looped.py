"""looped-bfs and interleaved-zb against torch's own ScheduleLoopedBFS and
ScheduleInterleavedZeroBubble: the same actions per rank, in the same order."""

import itertools
from types import SimpleNamespace

import pytest

from zbkit.schedules import Costs, build_schedule, simulate, validate

TORCH_CLASS = {"looped-bfs": "ScheduleLoopedBFS", "interleaved-zb": "ScheduleInterleavedZeroBubble"}


def torch_order(name: str, p: int, m: int, v: int) -> dict[int, list[str]]:
    """torch's pipeline_order for rank 0's object (every rank computes all ranks' orders),
    its idle cells (None) dropped. Built with stand-in stages: no process group needed."""
    torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    # just what the constructors read from a stage
    stage = SimpleNamespace(num_stages=v * p, group_size=p, group_rank=0, submod=None)
    stages = [stage] * v
    schedule = getattr(torch_schedules, TORCH_CLASS[name])(stages, m)
    return {r: [str(a) for a in row if a is not None] for r, row in schedule.pipeline_order.items()}


@pytest.mark.parametrize("name", TORCH_CLASS)
def test_program_equals_torch_pipeline_order(name):
    for p, v, m in itertools.product((1, 2, 3, 4, 8), (1, 2, 3), range(1, 25)):
        if name == "interleaved-zb" and m % max(1, m // p):
            continue  # torch refuses these too (next test)
        ours = build_schedule(name, pp=p, microbatches=m, stages_per_rank=v)
        assert {r: [str(a) for a in row] for r, row in ours.program.items()} == torch_order(
            name, p, m, v
        ), (name, p, m, v)
        assert ours.stage_to_rank == [s % p for s in range(v * p)]
        validate(ours)


def test_interleaved_zb_refuses_what_torch_refuses():
    torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    stages = [SimpleNamespace(num_stages=8, group_size=4, group_rank=0, submod=None)] * 2
    with pytest.raises(ValueError, match=r"microbatches=9 must be a multiple.*= 2.*try 8"):
        build_schedule("interleaved-zb", pp=4, microbatches=9)
    with pytest.raises(ValueError, match="multiple of the number of rounds"):
        torch_schedules.ScheduleInterleavedZeroBubble(stages, 9)


def test_looped_bfs_is_gpipe_looped_round_the_ranks():
    # memory: every forward of every chunk before any backward: m*v chunk-microbatches
    # per rank, each 1/v of the rank's share, so m like GPipe's
    for p, m, v in itertools.product((2, 4), (4, 8), (1, 2)):
        s = build_schedule("looped-bfs", pp=p, microbatches=m, stages_per_rank=v)
        assert simulate(s, Costs()).peak_memory == pytest.approx([m * v / v] * p)
    # with v = 1 it is GPipe, action for action
    assert (
        build_schedule("looped-bfs", pp=4, microbatches=8, stages_per_rank=1).program
        == build_schedule("gpipe", pp=4, microbatches=8).program
    )


def test_interleaved_zb_fills_interleaved_1f1bs_bubble_with_w():
    # same placement and memory bound as interleaved 1F1B, less bubble once W is split off
    costs = Costs(F=1.0, I=1.0, W=1.0)
    for p, k in itertools.product((2, 4, 8), (1, 2, 3)):
        m = k * p
        zb = simulate(build_schedule("interleaved-zb", pp=p, microbatches=m), costs)
        il = simulate(build_schedule("interleaved-1f1b", pp=p, microbatches=m), costs)
        assert zb.bubble_rate < il.bubble_rate, (p, m)
        # each rank holds its warm-up forwards plus one: (v-1) rounds of p, plus p - r
        # chunk-microbatches, each half of the rank's share (v = 2)
        assert zb.peak_memory == [(p + p - r) / 2 for r in range(p)]
