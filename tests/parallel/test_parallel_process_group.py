"""Process-group helpers with and without torchrun's environment, and a real one-rank
gloo group in this process (DDP wrapping, comm counting) torn down at the end."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
from _parallel_oracle import (
    BATCH,
    backend_train,
    make_data,
    make_model,
    num_windows,
    params_match,
    reference_train,
)
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from zbkit.parallel import (
    create_backend,
    get_local_rank,
    get_rank,
    get_world_size,
    init_distributed,
)

TORCHRUN_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    assert not dist.is_initialized()
    return monkeypatch


def test_no_process_group_answers_single_process(clean_env: pytest.MonkeyPatch) -> None:
    assert (get_rank(), get_world_size(), get_local_rank()) == (0, 1, 0)
    assert init_distributed() is False
    assert not dist.is_initialized()


def test_torchrun_environment_is_read(clean_env: pytest.MonkeyPatch) -> None:
    # second machine of 2 x 4 processes: global rank 6 is local rank 2
    clean_env.setenv("RANK", "6")
    clean_env.setenv("WORLD_SIZE", "8")
    clean_env.setenv("LOCAL_WORLD_SIZE", "4")
    assert (get_rank(), get_world_size(), get_local_rank()) == (6, 8, 2)
    clean_env.setenv("LOCAL_RANK", "1")  # torchrun's own answer wins
    assert get_local_rank() == 1
    clean_env.delenv("LOCAL_WORLD_SIZE")
    clean_env.delenv("LOCAL_RANK")
    assert get_local_rank() == 6  # unknown machine size: one machine assumed


def test_bad_environments_give_clear_errors(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("RANK", "two")
    with pytest.raises(ValueError, match="RANK='two' is not an integer"):
        get_rank()
    clean_env.setenv("RANK", "1")
    with pytest.raises(RuntimeError, match="WORLD_SIZE is not set but RANK is"):
        init_distributed()
    clean_env.setenv("WORLD_SIZE", "1")
    with pytest.raises(ValueError, match="RANK=1 is outside 0..WORLD_SIZE-1"):
        init_distributed()
    clean_env.setenv("RANK", "0")
    with pytest.raises(RuntimeError, match="MASTER_ADDR is not set"):
        init_distributed()
    if not torch.cuda.is_available():
        clean_env.setenv("MASTER_ADDR", "127.0.0.1")
        clean_env.setenv("MASTER_PORT", "1")
        with pytest.raises(RuntimeError, match="backend='nccl' needs CUDA"):
            init_distributed("nccl")
    assert not dist.is_initialized()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_one_rank_group_ddp_counts_allreduces(clean_env: pytest.MonkeyPatch) -> None:
    for name, value in [("RANK", 0), ("WORLD_SIZE", 1), ("MASTER_ADDR", "127.0.0.1")]:
        clean_env.setenv(name, str(value))
    clean_env.setenv("MASTER_PORT", str(_free_port()))
    try:
        assert init_distributed("gloo", timeout=60) is True
        world = dist.group.WORLD
        assert init_distributed() is True and dist.group.WORLD is world  # not re-initialised
        assert (get_rank(), get_world_size(), get_local_rank()) == (0, 1, 0)

        k, batches, epochs = 3, 7, 2
        x, y = make_data(1, batches)
        ref, ref_steps = reference_train(x, y, k, epochs, "sgd")
        param_bytes = sum(p.numel() * p.element_size() for p in make_model().parameters())
        n_params = len(list(make_model().parameters()))
        steps = num_windows(batches, k, epochs)
        # (DDP options, all-reduces per synchronising backward). Default: the tiny model is
        # one bucket. A 1-byte cap: one bucket per tensor, except in the first backward,
        # where DDP always uses one bucket and then rebuilds them; a per-bucket cap list
        # applies from the first backward on.
        cases = [
            ({}, [1] * steps),
            ({"bucket_cap_mb": 1e-6}, [1] + [n_params] * (steps - 1)),
            ({"bucket_cap_mb_list": [1e-6] * n_params}, [n_params] * steps),
        ]
        for options, per_backward in cases:
            backend = create_backend("ddp", grad_accum_steps=k, **options)
            loader = DataLoader(TensorDataset(x[0], y[0]), batch_size=BATCH)
            seen: list[tuple[bool, int]] = []
            probe = lambda b, m, seen=seen: seen.append((b.sync_gradients, b.comm_stats.reductions))
            model, _, _ = backend_train(backend, loader, epochs, "sgd", probe=probe)
            assert params_match(model, ref)
            stats = backend.comm_stats
            assert backend.optimizer_steps == ref_steps == steps
            assert stats.per_backward == per_backward
            assert stats.reductions == sum(per_backward)
            assert stats.buckets_seen == set(range(per_backward[-1]))
            assert stats.bytes == steps * param_bytes  # every gradient once per step
            # the counter moves only on synchronising micro-steps (no_sync elsewhere)
            moves = [b - a for (_, a), (_, b) in zip([(True, 0), *seen], seen, strict=False)]
            assert [m > 0 for m in moves] == [sync for sync, _ in seen]
            assert sum(sync for sync, _ in seen) == steps
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_prepare_places_cpu_replica_without_device_ids(clean_env: pytest.MonkeyPatch) -> None:
    for name, value in [("RANK", 0), ("WORLD_SIZE", 1), ("MASTER_ADDR", "127.0.0.1")]:
        clean_env.setenv(name, str(value))
    clean_env.setenv("MASTER_PORT", str(_free_port()))
    try:
        init_distributed("gloo", timeout=60)
        backend = create_backend("ddp")
        plain = make_model()
        model, *_ = backend.prepare(plain)
        assert isinstance(model, DDP) and model.device_ids is None
        assert backend.unwrap_model(model) is plain
        with pytest.raises(TypeError, match="already wrapped in DistributedDataParallel"):
            backend.prepare(model)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_one_rank_group_fsdp_matches_oracle(clean_env: pytest.MonkeyPatch) -> None:
    for name, value in [("RANK", 0), ("WORLD_SIZE", 1), ("MASTER_ADDR", "127.0.0.1")]:
        clean_env.setenv(name, str(value))
    clean_env.setenv("MASTER_PORT", str(_free_port()))
    try:
        init_distributed("gloo", timeout=60)
        k, batches, epochs = 3, 7, 2
        x, y = make_data(1, batches)
        ref, ref_steps = reference_train(x, y, k, epochs, "adamw")
        backend = create_backend("fsdp", grad_accum_steps=k)
        loader = DataLoader(TensorDataset(x[0], y[0]), batch_size=BATCH)
        model, opt, _ = backend_train(backend, loader, epochs, "adamw")
        assert params_match(model, ref)  # also proves the optimizer got the sharded params
        assert backend.optimizer_steps == ref_steps
        assert backend.comm_stats.reductions == 2 * ref_steps  # one per sharded Linear

        stepped = make_model()
        opt = torch.optim.SGD(stepped.parameters(), lr=0.1, momentum=0.9)
        stepped(torch.ones(1, 3)).sum().backward()
        opt.step()
        with pytest.raises(ValueError, match="optimizer already has state"):
            create_backend("fsdp").prepare(stepped, opt)
        with pytest.raises(TypeError, match="sharded with fully_shard"):
            with create_backend("fsdp").accumulate(make_model()):
                pass
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
