"""Single-process tests of zbkit.parallel: the "single" backend against the oracle,
the accumulation window, the wrappers and the factory's errors."""

from __future__ import annotations

import pytest
import torch
from _parallel_oracle import (
    BATCH,
    backend_train,
    loss_fn,
    make_data,
    make_model,
    num_windows,
    params_match,
    reference_train,
)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from zbkit.parallel import (
    BACKENDS,
    DDPBackend,
    SingleBackend,
    TrainingBackend,
    create_backend,
)
from zbkit.parallel._placement import replica_device

WORLD = 2  # the single backend sees both "ranks'" micro-batches side by side


def concat_loader(x: torch.Tensor, y: torch.Tensor) -> DataLoader:
    """Micro-batch b = rank 0's batch b followed by rank 1's: [WORLD * BATCH, ...]."""
    world, samples, _ = x.shape
    batches = samples // BATCH

    def interleave(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(world, batches, BATCH, -1).transpose(0, 1).reshape(samples * world, -1)

    return DataLoader(TensorDataset(interleave(x), interleave(y)), batch_size=WORLD * BATCH)


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
@pytest.mark.parametrize("batches", [6, 7])  # 7: a final partial window for k = 2 and 3
@pytest.mark.parametrize("k", [1, 2, 3])
def test_single_backend_matches_oracle(k: int, batches: int, opt_name: str) -> None:
    x, y = make_data(WORLD, batches)
    ref, ref_steps = reference_train(x, y, k, epochs=2, opt_name=opt_name)
    backend = create_backend("single", grad_accum_steps=k)
    model, opt, sched = backend_train(backend, concat_loader(x, y), 2, opt_name)

    assert params_match(model, ref)
    assert backend.optimizer_steps == ref_steps == num_windows(batches, k, 2)
    # the scheduler stepped once per optimizer step: LambdaLR(0.5**step)
    assert sched.scheduler.last_epoch == ref_steps
    base_lr = opt.param_groups[0]["initial_lr"]
    assert sched.get_last_lr() == [pytest.approx(base_lr * 0.5**ref_steps)]


def test_both_loop_orders_and_loaders_without_len_agree() -> None:
    k, batches = 3, 7
    x, y = make_data(WORLD, batches)
    ref, _ = reference_train(x, y, k, epochs=2, opt_name="sgd")

    # zero_grad() at the top of the loop must not wipe the window's earlier micro-steps
    zero_first, _, _ = backend_train(
        SingleBackend(grad_accum_steps=k), concat_loader(x, y), 2, "sgd", zero_first=True
    )
    assert params_match(zero_first, ref)

    class NoLen:  # an iterable without __len__: the window is found by reading ahead
        def __init__(self, loader: DataLoader) -> None:
            self.loader = loader

        def __iter__(self):
            yield from self.loader

    no_len, _, _ = backend_train(SingleBackend(k), NoLen(concat_loader(x, y)), 2, "sgd")
    assert params_match(no_len, ref)


def test_without_prepared_loader_windows_are_fixed_length() -> None:
    k, batches = 3, 6  # 6 = 2 windows of 3, so fixed counting is exact
    x, y = make_data(WORLD, batches)
    ref, ref_steps = reference_train(x, y, k, epochs=1, opt_name="sgd")
    backend = SingleBackend(k)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5**s)
    model, opt, _, sched = backend.prepare(model, opt, None, sched)
    for xb, yb in concat_loader(x, y):  # the raw loader: no announcements
        with backend.accumulate(model):
            backend.backward(loss_fn(model(xb), yb))
            opt.step()
            sched.step()
            opt.zero_grad()
    assert params_match(model, ref)
    assert backend.optimizer_steps == ref_steps == 2


def test_window_positions_lengths_and_loss_scale() -> None:
    # 10 batches, k = 4: windows 4, 4, 2 (DESIGN of accumulate.py); twice (2 epochs)
    backend = SingleBackend(grad_accum_steps=4)
    w = torch.ones(1, requires_grad=True)
    model = nn.Linear(1, 1)
    _, _, loader, _ = backend.prepare(model, None, list(range(10)), None)
    seen = []
    for _ in range(2):
        for i in loader:
            with backend.accumulate(model):
                w.grad = None
                backend.backward((w * (i + 1)).sum())
                seen.append((backend.sync_gradients, backend.window_length, w.grad.item()))
    lengths = [4] * 8 + [2] * 2
    syncs = [i in (3, 7, 9) for i in range(10)]
    expected = [(s, n, (i + 1) / n) for i, (s, n) in enumerate(zip(syncs, lengths, strict=True))]
    assert seen == expected * 2
    assert len(loader) == 10 and loader.loader == list(range(10))


def test_usage_errors_are_clear() -> None:
    backend = SingleBackend(2)
    model = nn.Linear(2, 1)
    with pytest.raises(RuntimeError, match="inside `with backend.accumulate"):
        backend.backward(model(torch.ones(2)).sum())
    with backend.accumulate(model):
        with pytest.raises(RuntimeError, match="do not nest"):
            with backend.accumulate(model):
                pass
        with pytest.raises(ValueError, match=r"scalar loss, got shape \(3,\)"):
            backend.backward(torch.ones(3, requires_grad=True))
        with pytest.raises(TypeError, match="loss tensor, got float"):
            backend.backward(1.0)
    with pytest.raises(TypeError, match="nn.Module as model, got str"):
        backend.prepare("model")
    with pytest.raises(TypeError, match="torch.optim.Optimizer, got list"):
        backend.prepare(model, [1])
    with pytest.raises(TypeError, match="iterable dataloader, got int"):
        backend.prepare(model, None, 3)
    with pytest.raises(TypeError, match="step\\(\\) method, got int"):
        backend.prepare(model, None, None, 3)

    for bad, exc in [(0, ValueError), (-2, ValueError), (2.0, TypeError), (True, TypeError)]:
        with pytest.raises(exc, match="grad_accum_steps"):
            create_backend("single", grad_accum_steps=bad)


def test_registry_is_a_plain_dict_and_options_are_checked() -> None:
    assert {"ddp", "fsdp", "single"} <= set(BACKENDS)
    assert BACKENDS["ddp"] is DDPBackend and BACKENDS["single"] is SingleBackend
    with pytest.raises(ValueError, match="unknown backend 'dpp'; known backends: .*ddp.*single"):
        create_backend("dpp")
    with pytest.raises(TypeError, match="unknown option.*grad_acum_steps.*accepts: grad_accum"):
        create_backend("single", grad_acum_steps=4)
    with pytest.raises(TypeError, match="unknown option.*bucket_cap"):
        create_backend("single", bucket_cap_mb=1)
    with pytest.raises(TypeError, match="unknown option.*no_such_thing"):
        create_backend("ddp", no_such_thing=1)
    with pytest.raises(TypeError, match="sets device_ids itself"):
        create_backend("ddp", device_ids=[0])

    class Mine(TrainingBackend):
        name = "test-mine"

        def __init__(self, grad_accum_steps: int = 1, *, tag: str = "") -> None:
            super().__init__(grad_accum_steps)
            self.tag = tag

    BACKENDS["test-mine"] = Mine  # a notebook's own backend: one dict entry
    try:
        made = create_backend("test-mine", grad_accum_steps=2, tag="x")
        assert isinstance(made, Mine) and made.tag == "x" and made.grad_accum_steps == 2
        with pytest.raises(
            TypeError,
            match="'test-mine' got unknown option.*colour.*accepts: grad_accum_steps, tag",
        ):
            create_backend("test-mine", colour=1)
    finally:
        del BACKENDS["test-mine"]
    with pytest.raises(TypeError, match="unknown option.*bucket_cap_mb.*reshard_after_forward"):
        create_backend("fsdp", bucket_cap_mb=1)
    ddp = create_backend("ddp", grad_accum_steps=3, bucket_cap_mb=1)
    assert isinstance(ddp, DDPBackend) and ddp.grad_accum_steps == 3


def test_ddp_backend_errors_without_a_process_group() -> None:
    backend = create_backend("ddp")
    with pytest.raises(RuntimeError, match="needs a process group.*init_distributed"):
        backend.prepare(nn.Linear(2, 1))
    with pytest.raises(TypeError, match="model returned by backend.prepare"):
        with backend.accumulate(nn.Linear(2, 1)):
            pass
    with pytest.raises(RuntimeError, match="fsdp backend needs a process group"):
        create_backend("fsdp").prepare(nn.Linear(2, 1))


def test_ddp_device_is_the_local_rank() -> None:
    cpu, cuda0, cuda3 = torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 3)
    assert replica_device({cpu}, "gloo", local_rank=1, cuda_count=0) is None
    assert replica_device({cpu}, "gloo", local_rank=1, cuda_count=8) is None  # CPU model: no ids
    # global rank 11 on the second 8-GPU machine is local rank 3 -> cuda:3
    assert replica_device({cpu}, "nccl", local_rank=3, cuda_count=8) == cuda3
    assert replica_device({cuda0}, "gloo", local_rank=3, cuda_count=8) == cuda3
    assert replica_device({cpu}, "nccl", local_rank=3, cuda_count=1) == cuda0  # one visible GPU
    with pytest.raises(RuntimeError, match="LOCAL_RANK=9 but only 8 GPUs"):
        replica_device({cpu}, "nccl", local_rank=9, cuda_count=8)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        replica_device({cpu}, "nccl", local_rank=0, cuda_count=0)


def test_epoch_left_mid_window_warns_and_device_is_reported() -> None:
    backend = SingleBackend(3)
    model = make_model()
    model, opt, loader, _ = backend.prepare(
        model, torch.optim.SGD(model.parameters(), lr=0.1), list(range(5)), None
    )
    assert backend.device == torch.device("cpu")
    for i in loader:
        with backend.accumulate(model):
            backend.backward(model(torch.ones(1, 3)).sum())
        if i == 0:
            break  # stop after one micro-step of a 3-step window
    with pytest.warns(RuntimeWarning, match="1 micro-step.*not yet stepped"):
        next(iter(loader))


@pytest.mark.parametrize("zero_first", [False, True])
@pytest.mark.parametrize("k", [2, 3])
def test_plain_loss_backward_inside_accumulate_matches_oracle(k: int, zero_first: bool) -> None:
    # Issue 15: a plain loss.backward() was neither counted (zero_grad wiped every
    # micro-step) nor divided by the window's length. Now both loops train alike.
    batches = 7  # a final partial window: its gradients are divided by 1 or 2, not k
    x, y = make_data(WORLD, batches)
    ref, ref_steps = reference_train(x, y, k, epochs=2, opt_name="sgd")
    backend = SingleBackend(k)
    model, _, _ = backend_train(
        backend, concat_loader(x, y), 2, "sgd", zero_first=zero_first, plain_backward=True
    )
    assert params_match(model, ref)
    assert backend.optimizer_steps == ref_steps


def test_plain_and_backend_backward_mix_and_terms_outside_the_output_are_divided() -> None:
    # A loss term that reaches the parameters without passing through the model's output
    # (weight decay written into the loss) is divided like the rest.
    def losses(model, xb, yb):
        return loss_fn(model(xb), yb) + 0.1 * sum(p.square().sum() for p in model.parameters())

    k, batches = 3, 6
    x, y = make_data(WORLD, batches)
    loader = concat_loader(x, y)
    ref = make_model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    batches_seen = list(loader)
    for start in range(0, batches, k):
        ref_opt.zero_grad()
        torch.stack(
            [losses(ref, xb, yb) for xb, yb in batches_seen[start : start + k]]
        ).mean().backward()
        ref_opt.step()

    backend = SingleBackend(k)
    model = make_model()
    model, opt, loader, _ = backend.prepare(
        model, torch.optim.SGD(model.parameters(), lr=0.1), loader
    )
    for i, (xb, yb) in enumerate(loader):
        with backend.accumulate(model):
            loss = losses(model, xb, yb)
            if i % 2:
                backend.backward(loss)  # divided once, not twice
            else:
                loss.backward()
            opt.step()
            opt.zero_grad()
    assert params_match(model, ref)


def test_plain_backward_outside_accumulate_is_an_error_when_accumulating() -> None:
    # Without the context the backend cannot tell the window: it would step every batch.
    backend = SingleBackend(3)
    model, _, _, _ = backend.prepare(make_model())
    with pytest.raises(RuntimeError, match=r"outside `with backend.accumulate\(model\):`.*=3"):
        model(torch.ones(1, 3)).sum().backward()
    one = SingleBackend(1)  # k = 1: every batch is its own window, nothing to get wrong
    model, _, _, _ = one.prepare(make_model())
    model(torch.ones(1, 3)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
