"""What the trace_torch tests run on every rank: torch's own pipelines (torch.distributed.
pipelining's PipelineStage and schedule classes), traced with zbkit (shipped by value)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as torch_schedules

from zbkit.pipeline import trace_torch

V_PLACED = ("ScheduleZBVZeroBubble", "ScheduleDualPipeV")
DIM, ROWS = 768, 96  # rows per microbatch; each action a few ms of one core, well above noise


def make_module(dim: int) -> nn.Module:
    return nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, dim))


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (output - target).pow(2).mean()


def _grads(stages) -> list[torch.Tensor]:
    return [p.grad.clone() for st in stages for p in st.submod.parameters()]


def traced_runs(cases: list[tuple[str, int]], steps: int = 3) -> list[dict]:
    """Per (torch class, microbatches): one untraced step, then `steps` traced ones; what
    ran, whether the methods came back, gradients with and without tracing."""
    torch.set_num_threads(1)  # ranks share 2 cores: one thread each keeps timings steady
    rank, world = dist.get_rank(), dist.get_world_size()
    report = []
    for cls_name, m in cases:
        v = 2 if cls_name in V_PLACED else 1
        n = v * world
        torch.manual_seed(0)
        mods = [make_module(DIM) for _ in range(n)]  # every rank builds all, keeps its own
        mine = [rank] if v == 1 else [rank, 2 * world - 1 - rank]
        stages = [PipelineStage(mods[s], s, n, torch.device("cpu")) for s in mine]
        cls = getattr(torch_schedules, cls_name)
        schedule = cls(stages[0] if v == 1 else stages, m, loss_fn=loss_fn)
        x, y = torch.randn(ROWS * m, DIM), torch.randn(ROWS * m, DIM)
        first, last = 0 in mine, n - 1 in mine

        def step(schedule=schedule, stages=stages, x=x, y=y, first=first, last=last) -> None:
            for st in stages:
                st.submod.zero_grad(set_to_none=False)
            args = (x,) if first else ()
            kwargs = {"target": y, "losses": []} if last else {}
            schedule.step(*args, **kwargs)  # the user's torch code, as it is

        step()  # warm-up: torch infers shapes and sets up its buffers on the first step
        untraced = _grads(stages)
        recorders = []
        for _ in range(steps):
            with trace_torch(schedule) as rec:
                step()
            recorders.append(rec)
        traced = _grads(stages)
        restored = all(
            name not in st.__dict__
            for st in stages
            for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
        )
        # a step that fails inside the block: the methods come back all the same
        try:
            with trace_torch(schedule):
                raise RuntimeError("user code failed")
        except RuntimeError:
            pass
        restored_after_error = all("forward_one_chunk" not in st.__dict__ for st in stages)
        report.append(
            {
                "case": f"{cls_name} m={m} rank {rank}",
                "cls": cls_name,
                "m": m,
                "orders": [r.trace.events for r in recorders],  # this rank's, per step
                "traces": [r.gather_trace() for r in recorders],  # all ranks', per step
                "samples": [len(r.trace.memory_samples) for r in recorders],
                "restored": restored and restored_after_error,
                "grads_equal": all(
                    torch.equal(a, b) for a, b in zip(untraced, traced, strict=True)
                ),
            }
        )
        dist.barrier()
    return report
