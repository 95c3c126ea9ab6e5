"""DDP and FSDP on 2 real gloo ranks against the single-process oracle.

One launch runs every case on both ranks (backends ddp and fsdp; accumulation 1, 2, 3;
with and without a final partial window; SGD and AdamW; an LR scheduler; two epochs)
and checks, on each rank: parameters equal the oracle's (rtol 1e-5) and the other
rank's; for DDP, gradients differ across ranks after a non-synchronising micro-step
(no_sync in effect) and agree after a synchronising one; the reduction counter moves
only on synchronising micro-steps; all-reduces == optimizer steps x buckets (for FSDP,
reduce-scatters == steps x sharded modules) with the closed-form byte counts.
Then a plain `loss.backward()` in place of `backend.backward(loss)`: DDP still matches
the oracle; FSDP (which cannot divide it) refuses it on the first micro-step.
"""

from __future__ import annotations

import sys

import _parallel_oracle
import pytest

pytestmark = pytest.mark.multiprocess

WORLD = 2


def _rank_checks() -> dict:
    """Runs on every rank inside zbkit.launch; raises on the first mismatch."""
    import math

    import torch
    import torch.distributed as dist
    from _parallel_oracle import (
        BATCH,
        backend_train,
        full_params,
        make_data,
        make_model,
        num_windows,
        params_match,
        reference_train,
    )
    from torch.utils.data import DataLoader, TensorDataset

    from zbkit.parallel import (
        create_backend,
        get_local_rank,
        get_rank,
        get_world_size,
        init_distributed,
    )

    torch.set_num_threads(1)
    rank, world = get_rank(), get_world_size()
    group = dist.group.WORLD
    assert init_distributed() is True and dist.group.WORLD is group, "re-initialised the group"

    def gathered(t: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(out, t.contiguous())
        return out

    def flat_grads(model) -> torch.Tensor:
        return torch.cat([p.grad.reshape(-1) for p in model.parameters()])

    shapes = [p.shape for p in make_model().parameters()]
    param_bytes = sum(math.prod(s) * 4 for s in shapes)
    # FSDP shards dim 0 into `world` equal, zero-padded pieces: [5, 3] -> 2 x [3, 3]
    padded_bytes = sum(math.ceil(s[0] / world) * world * math.prod(s[1:]) * 4 for s in shapes)
    cases = []
    for name in ("ddp", "fsdp"):
        for k in (1, 2, 3):
            for batches in (6, 7):  # 7 batches: a final partial window for k = 2 and 3
                for opt_name in ("sgd", "adamw"):
                    x, y = make_data(world, batches)
                    ref, ref_steps = reference_train(x, y, k, 2, opt_name)
                    # reductions per optimizer step, and the bytes they carry
                    if name == "fsdp":  # one reduce-scatter per sharded Linear
                        options, per_step, step_bytes = {}, 2, padded_bytes
                    elif batches == 7 and opt_name == "sgd":  # one bucket per tensor
                        options = {"bucket_cap_mb_list": [1e-6] * len(shapes)}
                        per_step, step_bytes = len(shapes), param_bytes
                    else:  # the tiny model fits one default bucket
                        options, per_step, step_bytes = {}, 1, param_bytes
                    backend = create_backend(name, grad_accum_steps=k, **options)
                    loader = DataLoader(TensorDataset(x[rank], y[rank]), batch_size=BATCH)
                    micro = []  # (sync, grads equal on all ranks, reductions so far)

                    def probe(b, model, micro=micro, name=name) -> None:
                        same = None  # FSDP's grads are shards: compared through the counter
                        if name == "ddp":
                            g = flat_grads(model)
                            same = all(torch.equal(g, other) for other in gathered(g))
                        micro.append((b.sync_gradients, same, b.comm_stats.reductions))

                    model, _, sched = backend_train(backend, loader, 2, opt_name, probe=probe)
                    label = f"{name} k={k} batches={batches} {opt_name} rank={rank}"
                    steps = num_windows(batches, k, 2)
                    assert backend.optimizer_steps == ref_steps == steps, label
                    assert params_match(model, ref), f"{label}: parameters differ from the oracle"
                    flat = torch.cat([p.reshape(-1) for p in full_params(model)])
                    assert all(torch.equal(flat, o) for o in gathered(flat)), (
                        f"{label}: ranks differ"
                    )
                    # no_sync on non-sync micro-steps: local grads (different data) differ;
                    # after a synchronising backward every rank holds the same average
                    for i, (sync, same, _) in enumerate(micro):
                        assert same in (None, sync), f"{label}: step {i} sync={sync} same={same}"
                    # ... and the reduction counter moves exactly on synchronising steps
                    counts = [0] + [count for *_, count in micro]
                    moved = [b - a for a, b in zip(counts, counts[1:], strict=False)]
                    assert moved == [per_step if s else 0 for s, *_ in micro], label
                    assert backend.comm_stats.reductions == steps * per_step, label
                    assert backend.comm_stats.bytes == steps * step_bytes, label
                    assert sched.scheduler.last_epoch == steps, label
                    cases.append((name, k, batches, opt_name, steps, backend.comm_stats.reductions))

    # plain loss.backward() inside the context (issue 15): DDP divides it through the
    # parameters' hooks; FSDP refuses it, naming backend.backward(loss)
    x, y = make_data(world, 7)
    ref, _ = reference_train(x, y, 3, 2, "sgd")
    loader = DataLoader(TensorDataset(x[rank], y[rank]), batch_size=BATCH)
    model, _, _ = backend_train(
        create_backend("ddp", grad_accum_steps=3), loader, 2, "sgd", plain_backward=True
    )
    assert params_match(model, ref), f"ddp plain loss.backward() rank={rank}: differs from oracle"
    try:
        backend_train(
            create_backend("fsdp", grad_accum_steps=3), loader, 1, "sgd", plain_backward=True
        )
        plain = "fsdp accepted a plain loss.backward()"
    except RuntimeError as e:
        plain = str(e)
    return {
        "rank": rank,
        "world": world,
        "local_rank": get_local_rank(),
        "cases": cases,
        "plain": plain,
    }


def test_ddp_and_fsdp_match_single_process_oracle_on_two_gloo_ranks() -> None:
    import cloudpickle

    from zbkit.launch import launch

    # The ranks are fresh processes that cannot import this test folder by name:
    # ship the oracle module and this function's module by value.
    cloudpickle.register_pickle_by_value(_parallel_oracle)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    results = launch(_rank_checks, nprocs=WORLD, backend="gloo", timeout=120)

    assert [r["rank"] for r in results] == [0, 1]
    assert [r["world"] for r in results] == [WORLD, WORLD]
    assert [r["local_rank"] for r in results] == [0, 1]  # one machine: local == global
    assert results[0]["cases"] == results[1]["cases"]
    assert len(results[0]["cases"]) == 24
    for r in results:
        assert "with the fsdp backend" in r["plain"], r["plain"]
        assert "call backend.backward(loss) instead" in r["plain"], r["plain"]
