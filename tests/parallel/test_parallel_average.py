"""`pp_dp_groups` and `average_gradients`: the pieces the pipeline runner's data-parallel
reduce is built from.

One rank in this process (the store given to `init_process_group` on a socket bound to
127.0.0.1, as zbkit.launch does), then one launch of 4 real gloo ranks that checks every
layout and compares every average with the mean computed here, rank by rank (the oracle:
each replica's gradients are recomputed in-process from its seed and data).
"""

from __future__ import annotations

import socket
import sys

import _parallel_oracle
import pytest
import torch
import torch.distributed as dist
from _parallel_oracle import loss_fn, make_data, make_model
from torch import nn

from zbkit.parallel import average_gradients, init_process_group, pp_dp_groups

WORLD = 4


def replica(rank: int, world: int, scale: float = 1.0) -> nn.Module:
    """Replica `rank`'s model after a backward on its own data; `extra` gets no gradient."""
    model = make_model()
    model.extra = nn.Parameter(torch.ones(2))  # registered first, never used: .grad is None
    x, y = make_data(world, 2)
    (scale * loss_fn(model(x[rank]), y[rank])).backward()
    return model


def mean_grads(ranks: list[int], world: int, scale: float = 1.0) -> list[torch.Tensor | None]:
    """The oracle: each parameter's gradient averaged over `ranks`, in one process."""
    models = [replica(r, world, scale) for r in ranks]
    per_param = zip(*[[p.grad for p in m.parameters()] for m in models], strict=True)
    return [None if gs[0] is None else torch.stack(gs).mean(0) for gs in per_param]


def grads_match(model: nn.Module, expected: list[torch.Tensor | None]) -> bool:
    grads = [p.grad for p in model.parameters()]
    return len(grads) == len(expected) and all(
        (g is None and e is None)
        or (g is not None and e is not None and torch.allclose(g, e, rtol=1e-6, atol=1e-7))
        for g, e in zip(grads, expected, strict=True)
    )


def test_one_rank_store_group_layout_and_average() -> None:
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="pp_dp_groups needs a process group"):
        pp_dp_groups(1, 1)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="backend='nccl' needs CUDA"):
            init_process_group("nccl", rank=0, world_size=1, store=dist.HashStore())
    # As zbkit.launch does: the store serves a socket we bound to loopback ourselves
    # (TCPStore's own bind would listen on every address).
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    port = sock.getsockname()[1]
    try:
        store = dist.TCPStore("127.0.0.1", port, 1, is_master=True, master_listen_fd=sock.fileno())
        init_process_group("gloo", rank=0, world_size=1, store=store, timeout=30)
        assert (dist.get_rank(), dist.get_world_size(), dist.get_backend()) == (0, 1, "gloo")

        pp_group, dp_group, pp_rank, dp_rank = pp_dp_groups(1, 1)
        assert (pp_rank, dp_rank) == (0, 0)
        assert dist.get_process_group_ranks(pp_group) == dist.get_process_group_ranks(dp_group)
        with pytest.raises(ValueError, match="pp=2 x dp=1 = 2 ranks, but the world has 1"):
            pp_dp_groups(2, 1)

        model = replica(0, 1)
        expected = mean_grads([0], 1)  # the mean over one replica: its own gradients
        pending = average_gradients(model.parameters(), dp_group, timeout=30, label="stage 0")
        assert repr(pending) == "PendingAverage('stage 0', 4 gradients, in flight)"
        pending.wait()
        pending.wait()  # a second wait does nothing (no second division)
        assert pending.done and "done" in repr(pending)
        assert grads_match(model, expected) and model.extra.grad is None

        empty = average_gradients(make_model().parameters())  # no .grad anywhere: still fine
        empty.wait()
        assert empty.done
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        sock.close()


def _rank_checks() -> dict:
    """Runs on every rank inside zbkit.launch; raises on the first mismatch."""
    import torch
    import torch.distributed as dist
    from _parallel_oracle import make_model

    from zbkit.parallel import average_gradients, pp_dp_groups

    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    members = dist.get_process_group_ranks

    # -- layouts: dp pipelines of pp consecutive ranks; a dp group holds one stage-rank each
    layouts = {}
    for pp, dp in [(2, 2), (4, 1), (1, 4)]:
        pp_group, dp_group, pp_rank, dp_rank = pp_dp_groups(pp, dp)
        assert rank == dp_rank * pp + pp_rank, (pp, dp, pp_rank, dp_rank)
        assert members(pp_group) == list(range(dp_rank * pp, dp_rank * pp + pp)), (pp, dp)
        assert members(dp_group) == list(range(pp_rank, world, pp)), (pp, dp)
        layouts[f"{pp}x{dp}"] = (members(pp_group), members(dp_group), pp_rank, dp_rank)
    try:
        pp_dp_groups(3, 1)
        bad = "no error"
    except ValueError as exc:
        bad = str(exc)

    # -- the average over this rank's dp group of pp=2 x dp=2 equals the oracle's mean
    _, dp_group, _, _ = pp_dp_groups(2, 2)
    model = replica(rank, world)
    average_gradients(model.parameters(), dp_group, timeout=60, label="stage 0").wait()
    assert grads_match(model, mean_grads(members(dp_group), world)), f"rank {rank}: dp group"
    assert model.extra.grad is None

    # -- two averages in flight at once over the world, finished in the other order
    a, b = replica(rank, world), replica(rank, world, scale=3.0)
    pending_a = average_gradients(a.parameters(), timeout=60, label="a")
    pending_b = average_gradients(b.parameters(), timeout=60, label="b")
    pending_b.wait()
    pending_a.wait()
    pending_a.wait()  # no second division
    everyone = list(range(world))
    assert grads_match(a, mean_grads(everyone, world)), f"rank {rank}: world, a"
    assert grads_match(b, mean_grads(everyone, world, scale=3.0)), f"rank {rank}: world, b"

    # -- no gradients anywhere: every replica still takes part, nothing is written
    empty = make_model()
    average_gradients(empty.parameters(), dp_group, timeout=60).wait()
    assert all(p.grad is None for p in empty.parameters())

    # -- a replica that never starts its average: the other one times out, naming it.
    # Last, on a group of its own: the abandoned all-reduce stays on that group.
    lonely = dist.new_group([0, 1])
    timeout = "not run"
    if rank == 0:
        pending = average_gradients(replica(0, world).parameters(), lonely, timeout=1, label="x")
        try:
            pending.wait()
            timeout = "no error"
        except TimeoutError as exc:
            timeout = str(exc)
    return {"rank": rank, "layouts": layouts, "bad": bad, "timeout": timeout}


@pytest.mark.multiprocess
def test_layouts_and_averages_match_the_oracle_on_four_gloo_ranks() -> None:
    import cloudpickle

    from zbkit.launch import launch

    # The ranks are fresh processes that cannot import this test folder by name:
    # ship the oracle module and this one by value.
    cloudpickle.register_pickle_by_value(_parallel_oracle)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    results = launch(_rank_checks, nprocs=WORLD, backend="gloo", timeout=120)

    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    # pp=2 x dp=2: rank 3 is stage-rank 1 of pipeline 1, averaging with rank 1
    assert results[3]["layouts"]["2x2"] == ([2, 3], [1, 3], 1, 1)
    assert results[2]["layouts"]["4x1"] == ([0, 1, 2, 3], [2], 2, 0)
    assert results[1]["layouts"]["1x4"] == ([1], [0, 1, 2, 3], 0, 1)
    assert {r["bad"] for r in results} == {"pp=3 x dp=1 = 3 ranks, but the world has 4"}
    assert results[0]["timeout"].startswith(
        "rank 0: averaging x's gradients over the data-parallel group did not finish within 1 s"
    ), results[0]["timeout"]
    assert [r["timeout"] for r in results[1:]] == ["not run"] * 3
