"""Notebook 06's exercises: DDP's buckets, uneven epochs, schedulers, what scales with ranks.

None of them needs ranks to work the answer out: DDP's buckets come from torch's own bucket
assignment (the function DDP calls) over the order the gradients become ready, and the
windows from zbkit's accumulation (the "single" backend runs the same windows as "ddp").
The model is the notebook's: Linear(3, 8), Tanh, Linear(8, 2), 50 parameters.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from zbkit.exercises._core import exercise, is_count
from zbkit.parallel import create_backend

BATCHES = 10  # micro-batches per rank per epoch, as in the notebook
MB = 1024 * 1024  # DDP reads bucket_cap_mb in MiB


def notebook_model() -> nn.Sequential:
    with torch.random.fork_rng(devices=[]):  # the learner's random stream stays as it was
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))


def rebuilt_buckets(bucket_cap_mb: float) -> list[list[str]]:
    """The buckets DDP reduces from its second backward on: it rebuilds them in the order
    the gradients became ready in the first, each closed once it holds >= the cap."""
    model = notebook_model()
    names: dict[torch.Tensor, str] = {p: n for n, p in model.named_parameters()}
    ready: list[torch.Tensor] = []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(ready.append)
    with torch.random.fork_rng(devices=[]):
        model(torch.randn(4, 3)).pow(2).mean().backward()
    cap = int(bucket_cap_mb * MB)
    indices, _ = dist._compute_bucket_assignment_by_size(ready, [cap])
    return [[names[ready[i]] for i in bucket] for bucket in indices]


def synchronising_steps(batches: int, k: int, scheduler_steps: bool = False) -> int:
    """Micro-steps that end a window (all-reduce + optimizer step) in an epoch of `batches`
    with grad_accum_steps=k; or, with `scheduler_steps`, the steps of a prepared scheduler."""
    backend = create_backend("single", grad_accum_steps=k)
    with torch.random.fork_rng(devices=[]):
        plain = nn.Linear(1, 1)
    adamw = torch.optim.AdamW(plain.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(adamw, step_size=1, gamma=0.5)
    model, opt, loader, prepared = backend.prepare(plain, adamw, range(batches), sched)
    syncs = 0
    for _ in loader:
        with backend.accumulate(model):
            backend.backward(model(torch.ones(1, 1)).sum())
            opt.step()
            prepared.step()  # acts only when the window ends
            opt.zero_grad()
        syncs += backend.sync_gradients
    return sched.last_epoch if scheduler_steps else syncs


@exercise("06.1", "the all-reduces (an int) of each synchronising backward after the first")
def small_buckets(answer: Any) -> tuple[bool, str]:
    buckets = rebuilt_buckets(0.0001)
    n, cap = len(buckets), int(0.0001 * MB)
    if not is_count(answer):
        return False, f"give a number of all-reduces, got {answer!r}"
    if answer == n:
        shown = " | ".join(", ".join(b) for b in buckets)
        return True, (
            f"{n} per backward from the second on: buckets of at least {cap} bytes, filled in "
            f"the order the gradients become ready ({shown}). The first backward is one "
            "all-reduce: DDP starts with a single bucket holding every gradient and rebuilds "
            "the buckets only once it has seen that order."
        )
    if answer == 1:
        return False, (
            "1 is the first backward only: DDP rebuilds its buckets after it; read "
            "comm_stats.per_backward[1:]"
        )
    if answer == sum(len(b) for b in buckets):
        return False, (
            "not one per parameter: a bucket takes gradients until it holds at least "
            f"bucket_cap_mb ({cap} bytes), then the next one starts"
        )
    return False, (
        f"DDP closes a bucket once it holds at least bucket_cap_mb ({cap} bytes) and starts the "
        "next, one all-reduce per bucket: count the buckets the gradients make in the order "
        "they become ready (print backend.comm_stats.per_backward to see them)"
    )


def as_ints(answer: Any) -> set[int] | None:
    items = [answer] if is_count(answer) else answer
    if not isinstance(items, set | frozenset | list | tuple) or not all(map(is_count, items)):
        return None
    return set(items)


@exercise("06.2", "the set of k in 1..10 for which the epoch hangs (10 micro-batches vs 9)")
def uneven_epochs(answer: Any) -> tuple[bool, str]:
    steps = {k: (synchronising_steps(BATCHES, k), synchronising_steps(BATCHES - 1, k))
             for k in range(1, BATCHES + 1)}  # fmt: skip
    hang = {k for k, (a, b) in steps.items() if a != b}
    got = as_ints(answer)
    if got is None:
        return False, f"give a set of ints such as {{1, 2}}, got {answer!r}"
    counts = ", ".join(f"k={k}: {a} vs {b}" for k, (a, b) in steps.items() if k in hang)
    if got == hang:
        return True, (
            f"k in {sorted(hang)}: there the ranks sync a different number of times ({counts}), "
            "so rank 0's last all-reduce has no partner and waits forever. For every other k it "
            "does not hang, yet it is wrong: the last all-reduce averages rank 0's window with "
            "rank 1's shorter one, two means of different lengths weighted equally. Every rank "
            "must see the same number of batches (a DistributedSampler, drop_last, or DDP's "
            "join())."
        )
    extra, missing = sorted(got - hang), sorted(hang - got)
    if any(k not in steps for k in extra):
        return False, f"k counts micro-batches per window, from 1 to {BATCHES}: got {sorted(got)}"
    if extra:
        k = extra[0]
        return False, (
            f"k={k} does not hang: both ranks end {steps[k][0]} windows, so their all-reduces "
            "pair up (count each rank's windows: the last one may be shorter)"
        )
    k = missing[0]
    return False, (
        f"k={k} hangs too: rank 0 ends {steps[k][0]} windows, rank 1 only {steps[k][1]}, so "
        "rank 0's last all-reduce has no partner"
    )


@exercise("06.3", "how many times (an int) the prepared scheduler steps in one epoch, k = 4")
def scheduler_steps(answer: Any) -> tuple[bool, str]:
    steps = synchronising_steps(BATCHES, 4, scheduler_steps=True)
    if not is_count(answer):
        return False, f"give a number of steps, got {answer!r}"
    if answer == steps:
        return True, (
            f"{steps}: the prepared scheduler steps once per optimizer step, on a window's last "
            "micro-step, the short last window included. The oracle still matches with AdamW: "
            "each step sees the same mean gradient as one process would, and each rank steps "
            "its own scheduler (not once per rank)."
        )
    if answer == BATCHES:
        return False, (
            "the prepared scheduler skips the micro-steps that only accumulate: it steps when "
            "backend.sync_gradients is True"
        )
    if answer == BATCHES // 4:
        return False, (
            "the short last window (2 micro-batches) is stepped too: it ends the epoch, so its "
            "last micro-step synchronises like any window's, and the scheduler steps with it"
        )
    if answer == 2 * steps:
        return False, "each rank steps its own scheduler once per window: no multiplying by ranks"
    return False, (
        "the prepared scheduler steps with the optimizer, once per window (on the micro-step "
        "where backend.sync_gradients is True): count the windows of 10 micro-batches at k = 4"
    )


def gradient_bytes() -> int:
    return sum(p.numel() * p.element_size() for p in notebook_model().parameters())


@exercise("06.4", "the bytes (an int) rank 0 puts into all-reduces in one epoch, 4 ranks, k = 3")
def bytes_per_rank(answer: Any) -> tuple[bool, str]:
    windows, size = synchronising_steps(BATCHES, 3), gradient_bytes()
    if not is_count(answer):
        return False, f"give a number of bytes, got {answer!r}"
    if answer == windows * size:
        return True, (
            f"{windows * size}, as with 2 ranks: each window's last micro-step all-reduces the "
            f"whole gradient ({size} bytes, one bucket) on every rank, {windows} windows, "
            "whatever the world size. No number in the table changes: windows and all-reduces "
            "count each rank's own micro-batches. What grows with ranks is the traffic inside "
            "an all-reduce (a ring sends 2(n-1)/n of the buffer per rank), not what goes in."
        )
    if answer == 2 * windows * size:
        return False, (
            "doubling the ranks does not double what each rank reduces: every rank all-reduces "
            "its own copy of the gradient, the same size on 2 ranks or 4"
        )
    if answer in (windows * size // 2, windows * size // 4):
        return False, (
            "DDP does not split the gradient over ranks (FSDP's reduce-scatter does): every "
            "rank all-reduces all of it"
        )
    return False, (
        f"one all-reduce of the whole gradient per window: count the windows of {BATCHES} "
        f"micro-batches at k = 3 and the gradient's bytes ({size // 4} float32)"
    )
