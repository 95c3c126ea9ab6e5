"""Stage modules and the plain-autograd oracle shared by the pipeline tests.

Every stage takes ``x`` (and ``skip`` and integer ``ids`` after stage 0) and returns a dict,
so each message between stages carries three tensors, one of them not differentiable.
Stage 1 is deliberately awkward for split backward: a weight used twice along one path, a
custom autograd Function with two outputs, and a parameter the outputs never depend on.
"""

from __future__ import annotations

import contextlib
import copy
import os
import socket
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn

from zbkit.schedules import Costs, build_schedule

WIDTH = 6
# where make_stages and batch put modules and data: cpu here; benchmarks/gpu_check.sh runs
# the LocalPipeline tests with ZBKIT_TEST_DEVICE=cuda (the same oracle, on a GPU)
DEVICE = torch.device(os.environ.get("ZBKIT_TEST_DEVICE", "cpu"))
ALL_SCHEDULES = (
    "gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "zb-auto",
    "looped-bfs", "interleaved-zb", "v-half", "v-min", "dualpipev",
)  # fmt: skip


class TwoOut(torch.autograd.Function):
    """(h * s, sin(h)): two outputs, one parameter, hand-written backward."""

    @staticmethod
    def forward(ctx, h, s):
        ctx.save_for_backward(h, s)
        return h * s, torch.sin(h)

    @staticmethod
    def backward(ctx, ga, gb):
        h, s = ctx.saved_tensors
        gh = ga * s + gb * torch.cos(h)
        gs = (ga * h).sum(0)
        return gh, gs


class First(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        h = torch.tanh(self.lin(x))  # (b, WIDTH)
        ids = (x > 0).sum(1)  # (b,) int64: data that travels along without a gradient
        return {"x": h, "skip": 0.5 * h, "ids": ids}


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, x, skip, ids):
        return {"x": torch.tanh(self.lin(x)) + skip, "skip": skip, "ids": ids}


class Awkward(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)
        self.lin2 = nn.Linear(WIDTH, WIDTH)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, WIDTH))
        self.unused = nn.Parameter(torch.ones(3))  # never reaches the outputs

    def forward(self, x, skip, ids):
        h = self.lin(torch.tanh(self.lin(x)))  # the same weight twice along one path
        a, b = TwoOut.apply(h, self.scale)
        return {"x": a + self.lin2(b), "skip": skip * b, "ids": ids}


class Last(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(WIDTH, 2)

    def forward(self, x, skip, ids):
        scale = (1 + ids % 3).unsqueeze(1)  # (b, 1): the integer input changes the output
        return {"y": self.head(x + skip) * scale}


def make_stages(num_stages: int, seed: int = 0) -> list[nn.Module]:
    torch.manual_seed(seed)
    mods: list[nn.Module] = [First()]
    for s in range(1, num_stages - 1):
        mods.append(Awkward() if s == 1 else Plain())
    mods.append(Last())
    return [m.to(DEVICE) for m in mods]


def loss_fn(outputs: dict, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(outputs["y"], target)


def batch(rows: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(rows, WIDTH, generator=g), torch.randn(rows, 2, generator=g)
    return x.to(DEVICE), y.to(DEVICE)


def oracle(mods: list[nn.Module], x: torch.Tensor, y: torch.Tensor):
    """Plain full-batch autograd on copies: (loss, grads per stage as name -> grad)."""
    mods = copy.deepcopy(mods)
    out = {"x": x}
    for m in mods:
        out = m(**out)
    loss = loss_fn(out, y)
    loss.backward()
    return loss.detach(), [{n: p.grad for n, p in m.named_parameters()} for m in mods]


def schedule(name: str, pp: int, m: int):
    """`name` for pp ranks and m microbatches (dualpipev, which needs m >= 2 pp, at m = 2 pp)."""
    if name == "dualpipev":
        m = max(m, 2 * pp)
    extra = {"costs": Costs(F=1, I=1, W=1)} if name == "zb-auto" else {}
    return build_schedule(name, pp=pp, microbatches=m, **extra)


def assert_grads_match(mods, expected, where: str, atol: float = 1e-6) -> None:
    for s, (m, exp) in enumerate(zip(mods, expected, strict=True)):
        for n, p in m.named_parameters():
            if exp[n] is None:
                assert p.grad is None, f"{where}: stage {s} {n} got a gradient, oracle has none"
                continue
            assert p.grad is not None, f"{where}: stage {s} {n} has no gradient"
            err = (p.grad - exp[n]).abs().max().item()
            assert err <= atol, f"{where}: stage {s} {n} differs by {err:.3g}"


@contextlib.contextmanager
def one_rank_group() -> Iterator[None]:
    """A real gloo group of one rank in this process, its store on a loopback socket we
    bound (as zbkit.launch does): a ScheduleRunner without a second process."""
    from zbkit.parallel import init_process_group

    assert not dist.is_initialized()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        store = dist.TCPStore(
            "127.0.0.1", sock.getsockname()[1], 1, is_master=True, master_listen_fd=sock.fileno()
        )
        init_process_group("gloo", rank=0, world_size=1, store=store, timeout=120)
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        sock.close()
