"""The traps the doctor finds in the modules: a parameter two stages of one rank share while
torch scales gradients per stage, one in stages on two ranks (a copy on each), and
DDP-wrapped stages under a split backward. Each shown
failing first, then the finding, then the fix against plain autograd."""

from __future__ import annotations

import cloudpickle
import doctor_ranks
import pytest
import torch
from conftest import batch, grads, mse, oracle, same
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleLoopedBFS, ScheduleZBVZeroBubble
from torch.nn.parallel import DistributedDataParallel

import zbkit.doctor
from zbkit.launch import launch
from zbkit.pipeline import LocalPipeline
from zbkit.schedules import build_schedule

M = 4


class Embed(nn.Module):
    def __init__(self, table: nn.Embedding) -> None:
        super().__init__()
        self.table = table

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids)  # (b, t, 4)


class Head(nn.Module):
    def __init__(self, table: nn.Embedding) -> None:
        super().__init__()
        self.table = table  # the same Embedding: tied input and output embedding

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(h) @ self.table.weight.t()  # (b, t, vocab)


def ce(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())


def _tied() -> list[nn.Module]:
    torch.manual_seed(0)
    table = nn.Embedding(10, 4)
    return [Embed(table), Head(table)]


def _ids() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return torch.randint(10, (8, 3), generator=g), torch.randint(10, (8, 3), generator=g)


def test_tied_embedding_on_one_rank_scaled_twice(gloo_world) -> None:
    mods = _tied()
    x, y = _ids()
    expected = oracle(mods, x, y, M, ce)
    stages = [PipelineStage(m, i, 2, torch.device("cpu")) for i, m in enumerate(mods)]
    schedule = ScheduleZBVZeroBubble(stages, M, loss_fn=ce)  # rank 0: stages 0 and 2p-1 = 1
    schedule.step(x, target=y)  # the failure: a wrong gradient, silently
    assert not same(grads(mods), expected)
    report = zbkit.doctor.check(stages, schedule, inputs=x, target=y, loss_fn=ce)
    assert report.traps() == ["shared-param-scaled-twice"], report
    (finding,) = report
    assert finding.rank == 0 and "stage 0 table.weight" in finding.where
    assert "scale_grads=False" in finding.fix
    # the fix: scale_grads=False and the loss divided by the microbatch count
    for m in mods:
        m.zero_grad(set_to_none=True)
    stages = [PipelineStage(m, i, 2, torch.device("cpu")) for i, m in enumerate(mods)]
    fixed = ScheduleZBVZeroBubble(stages, M, loss_fn=lambda o, t: ce(o, t) / M, scale_grads=False)
    assert zbkit.doctor.check(stages, fixed, inputs=x, target=y, loss_fn=ce).ok
    fixed.step(x, target=y)
    assert same(grads(mods), expected)


def test_zbkit_runtimes_are_exact_for_a_tied_embedding() -> None:
    mods = _tied()
    x, y = _ids()
    expected = oracle(mods, x, y, M, ce)
    zb = build_schedule("zb-v", pp=1, microbatches=M)  # both stages on rank 0, as above
    assert zbkit.doctor.check(mods, zb, inputs=x, target=y, loss_fn=ce).ok
    LocalPipeline(mods, zb, ce).step(x, target=y)  # scales the loss, once per microbatch
    assert same(grads(mods), expected)


def _ddp(world_calls: list[int]) -> list[nn.Module]:
    """Two DDP stages whose all-reduces are counted (a world of one rank: the values do
    not change, so a missing all-reduce shows only as a hook that never ran)."""

    def hook(state, bucket):
        world_calls[state] += 1
        done: torch.futures.Future = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done

    torch.manual_seed(0)
    mods = [DistributedDataParallel(nn.Sequential(nn.Linear(4, 4), nn.Tanh())) for _ in range(2)]
    for i, m in enumerate(mods):
        m.register_comm_hook(i, hook)
    return mods


def test_ddp_stages_under_torchs_split(gloo_world) -> None:
    calls = [0, 0]
    mods = _ddp(calls)
    stages = [PipelineStage(m, i, 2, torch.device("cpu")) for i, m in enumerate(mods)]
    schedule = ScheduleZBVZeroBubble(stages, M, loss_fn=mse)
    schedule.step(*batch()[:1], target=batch()[1])
    assert calls[1] == 0  # the failure: stage 1 (split) never all-reduced
    x, y = batch()
    report = zbkit.doctor.check(stages, schedule, inputs=x, target=y, loss_fn=mse)
    assert report.traps() == ["ddp-under-split"] and report.findings[0].stage == 1, report
    assert "144530" in report.findings[0].happens
    # the fix: a schedule without I/W, where torch drives DDP (no_sync, then the last B)
    calls[:] = [0, 0]
    mods = _ddp(calls)
    stages = [PipelineStage(m, i, 2, torch.device("cpu")) for i, m in enumerate(mods)]
    bfs = ScheduleLoopedBFS(stages, M, loss_fn=mse)
    assert zbkit.doctor.check(stages, bfs, inputs=x, target=y, loss_fn=mse).ok
    bfs.step(x, target=y)
    assert calls[0] >= 1 and calls[1] >= 1


def test_ddp_stages_under_zbkits_runtime(gloo_world) -> None:
    calls = [0, 0]
    mods = _ddp(calls)
    x, y = batch()
    zb = build_schedule("zb-h1", pp=2, microbatches=M)
    LocalPipeline(mods, zb, mse).step(x, target=y)
    assert min(calls) < M  # the failure: some microbatches' backwards never all-reduced
    report = zbkit.doctor.check(mods, zb, inputs=x, target=y, loss_fn=mse)
    assert report.traps() == ["ddp-under-split"] and len(report) == 2, report
    assert "dp_group" in report.findings[0].fix
    # the fix: the bare modules (zbkit's runner averages over its dp_group itself)
    bare = [m.module for m in mods]
    for m in bare:
        m.zero_grad(set_to_none=True)
    assert zbkit.doctor.check(bare, zb, inputs=x, target=y, loss_fn=mse).ok
    expected = oracle(bare, x, y, M)
    LocalPipeline(bare, zb, mse).step(x, target=y)
    assert same(grads(bare), expected)


@pytest.mark.multiprocess
def test_tied_embedding_on_two_ranks_each_holds_a_copy() -> None:
    cloudpickle.register_pickle_by_value(doctor_ranks)
    mods = doctor_ranks.tied_model()
    x, y = doctor_ranks.tied_ids()
    expected = oracle(mods, x, y, M, ce)[0]["table.weight"]
    # the failure: on real ranks each copy gets its stage's part of the gradient, silently
    parts = launch(doctor_ranks.tied_across_ranks, False, nprocs=2, timeout=300)
    for part in parts:
        assert not torch.allclose(part, expected, atol=1e-3)
    torch.testing.assert_close(parts[0] + parts[1], expected)  # the parts add up to it
    zb = build_schedule("zb-h1", pp=2, microbatches=M)
    report = zbkit.doctor.check(mods, zb, inputs=x, target=y, loss_fn=ce)
    assert report.traps() == ["shared-param-across-ranks"], report
    (finding,) = report
    assert "ranks [0, 1]" in finding.where and "all_reduce" in finding.fix
    # the fix: the gradient summed over the two ranks, on each
    for got in launch(doctor_ranks.tied_across_ranks, True, nprocs=2, timeout=300):
        torch.testing.assert_close(got, expected)
    # and a V puts both stages on rank 0: nothing to say
    assert zbkit.doctor.check(mods, build_schedule("zb-v", pp=1, microbatches=M),
                              inputs=x, target=y, loss_fn=ce).ok  # fmt: skip
