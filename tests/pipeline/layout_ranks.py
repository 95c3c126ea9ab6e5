"""An HF-like model whose messages change layout between microbatches, and the functions the
layout tests run on every rank (shipped by value).

As ``transformers``' ``create_causal_mask`` does, stage 0 returns ``mask4d = None`` for a
microbatch without padding and a bool ``[b, 1, s, s]`` mask for one with padding; the first
block turns a mask into an additive float32 one (HF's eager attention), so the next edge
carries None or float32. A second step changes the sequence length and the padding's dtype.
"""

from __future__ import annotations

import copy
import time

import torch
import torch.distributed as dist
from torch import nn

from zbkit.pipeline import LocalPipeline, PipelineStage, ScheduleRunner
from zbkit.schedules import build_schedule

D = 8  # hidden width
M = 4  # microbatches
ROWS = 2  # rows per microbatch


def causal_mask(pad: torch.Tensor) -> torch.Tensor | None:
    """None without padding (attention is plainly causal), else bool[b, 1, s, s]."""
    if bool(pad.all()):
        return None
    s = pad.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    return causal[None, None] & pad.bool()[:, None, None, :]  # (b, 1, s, s)


class Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> dict:
        return {"hidden": self.lin(x), "mask4d": causal_mask(pad), "pad": pad}  # (b, s, D)


class Block(nn.Module):
    """Attention over the sequence; a bool mask becomes an additive float32 one."""

    def __init__(self) -> None:
        super().__init__()
        self.v = nn.Linear(D, D)

    def forward(self, hidden: torch.Tensor, mask4d: torch.Tensor | None, pad: torch.Tensor) -> dict:
        s = hidden.shape[1]
        if mask4d is None:  # no padding: causal only
            mask4d = torch.zeros(s, s).masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), -1e4)
            out_mask = None
        elif mask4d.dtype == torch.bool:
            mask4d = out_mask = torch.zeros(mask4d.shape).masked_fill(~mask4d, -1e4)
        else:
            out_mask = mask4d
        scores = hidden @ hidden.transpose(1, 2) / D**0.5 + mask4d.reshape(-1, s, s)  # (b, s, s)
        h = hidden + torch.softmax(scores, -1) @ self.v(hidden)  # (b, s, D)
        return {"hidden": h, "mask4d": out_mask, "pad": pad}


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(D, D)

    def forward(self, hidden: torch.Tensor, mask4d: torch.Tensor | None, pad: torch.Tensor):
        return self.out(hidden) * pad.unsqueeze(-1)  # a Tensor, torch's form; padding zeroed


def make_model(num_stages: int) -> list[nn.Module]:
    torch.manual_seed(0)
    return [Embed()] + [Block() for _ in range(num_stages - 2)] + [Head()]


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(out, target)


def batch(seq: int, padded: list[int], dtype: torch.dtype, seed: int):
    """(x, pad), y for M microbatches; the microbatches in `padded` have padding."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M * ROWS, seq, D, generator=g)
    y = torch.randn(M * ROWS, seq, D, generator=g)
    pad = torch.ones(M * ROWS, seq, dtype=dtype)
    for j in padded:  # the microbatch's second row ends early
        pad[j * ROWS + 1, seq // 2 :] = 0
    return (x, pad), y


STEPS = [  # steps in a row: sequence length, the padded microbatches, the padding's dtype
    (16, [1, 3], torch.int64),
    (12, [0], torch.int32),  # every layout new
    (12, [0], torch.int32),  # the same again: the steady state
    (1040, [2], torch.int64),  # hidden over 64 KiB: its header travels on its own
    (1040, [2], torch.int64),
    (16, [1, 3], torch.int64),  # back to the first step's layouts (known: no shape message)
]


def oracle(mods: list[nn.Module], inputs: tuple, y: torch.Tensor):
    """Plain autograd on the whole batch: (loss, grads by stage as name -> grad)."""
    mods = copy.deepcopy(mods)
    out = mods[0](*inputs)
    for m in mods[1:-1]:
        out = m(**out)
    loss = loss_fn(mods[-1](**out), y)
    loss.backward()
    return loss.item(), [{n: p.grad for n, p in m.named_parameters()} for m in mods]


def _max_err(mods, expected) -> float:
    worst = 0.0
    for m, exp in zip(mods, expected, strict=True):
        for n, p in m.named_parameters():
            if p.grad is None or exp[n] is None:
                return float("inf")
            worst = max(worst, (p.grad - exp[n]).abs().max().item())
    return worst


def check_layouts(names: list[str]) -> list[dict]:
    """Each schedule on 2 ranks, two steps: this rank's losses and gradients against plain
    autograd on the whole batch and against LocalPipeline."""
    rank, report = dist.get_rank(), []
    for name in names:
        sch = build_schedule(name, pp=2, microbatches=M)
        mods = make_model(sch.num_stages)
        local_mods = copy.deepcopy(mods)
        mine = sch.stages_on(rank)
        stages = [PipelineStage(mods[s], s, sch.num_stages) for s in mine]
        runner = ScheduleRunner(sch, stages, loss_fn, timeout=120)
        local = LocalPipeline(local_mods, sch, loss_fn)
        for k, (seq, padded, dtype) in enumerate(STEPS):
            inputs, y = batch(seq, padded, dtype, seed=k)
            loss, expected = oracle(mods, inputs, y)
            for m in mods + local_mods:
                m.zero_grad(set_to_none=True)
            losses = runner.step(inputs, target=y)
            local_losses = local.step(inputs, target=y)
            here = sch.num_stages - 1 in mine
            report.append(
                {
                    "case": f"{name} step {k} rank {rank}",
                    "loss_err": abs(torch.stack(losses).mean().item() - loss) if here else 0.0,
                    "local_loss_err": abs(torch.stack(local_losses).mean().item() - loss),
                    "grad_err": _max_err([mods[s] for s in mine], [expected[s] for s in mine]),
                    "local_grad_err": _max_err(local_mods, expected),
                    "pending": runner.p2p.pending,
                }
            )
    return report


class Unsendable(nn.Module):
    """Stage 0, returning what cannot travel for microbatch 1: a str, or 65 tensors."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.lin, self.what, self.calls = nn.Linear(D, D), what, 0

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> dict:
        self.calls += 1
        out = {"hidden": self.lin(x), "mask4d": causal_mask(pad), "pad": pad}
        if self.calls == 2 and self.what == "a str":
            out["note"] = "a str"  # type: ignore[assignment]
        if self.calls == 2 and self.what == "65 tensors":
            out.update({f"extra{i}": pad for i in range(62)})
        return out


def check_unsendable(cases: list[str], timeout: float) -> list[dict]:
    """Each case on a fresh group: both ranks' errors and how long each took to fail."""
    report = []
    for case in cases:
        group = dist.new_group([0, 1])
        dist.barrier(group)  # start together: the elapsed times compare with the timeout
        rank = dist.get_rank()
        sch = build_schedule("1f1b", pp=2, microbatches=M)
        mods = make_model(2)
        mods[0] = Unsendable(case)
        stage = PipelineStage(mods[rank], rank, 2)
        runner = ScheduleRunner(sch, stage, loss_fn, group=group, timeout=timeout)
        inputs, y = batch(16, [1], torch.int64, seed=0)
        began = time.monotonic()
        try:
            runner.step(inputs, target=y)
            outcome = "ok"
        except Exception as exc:  # the test asserts on the type and the message
            notes = "\n".join(getattr(exc, "__notes__", []))
            outcome = f"{type(exc).__name__}: {exc}\n{notes}"
        report.append(
            {"case": case, "rank": rank, "outcome": outcome, "took": time.monotonic() - began}
        )
    return report
