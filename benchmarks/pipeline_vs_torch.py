"""zbkit's runtime against torch.distributed.pipelining, side by side on the same ranks.

Part 1: one 1F1B training step (m = 8, 2 gloo ranks, one thread each), zbkit's
`ScheduleRunner` against torch's `Schedule1F1B` on the same two-stage model, both on the
same process group; the two alternate inside every round and the median step times are
compared. Two models: a compute-bound MLP (each stage 2 x Linear(1024, 1024), 64 rows per
microbatch) and a tiny one (Linear(32, 32), 4 rows) where per-step overhead is all there is.
Targets: zbkit / torch <= 1.00 compute-bound, <= 1.05 tiny.

Part 2: one hop, as a ping-pong between the two ranks (activations out, gradients back, the
size of the tiny model's activations): zbkit's point-to-point layer (`P2P`, the one the runner
uses, shapes already agreed) against bare `dist.isend`/`dist.irecv`, alternating; both sides
send the same tensors (a fixed one each way), so the difference is what P2P adds. Target:
zbkit's round trip within 1.2x of the bare one.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/pipeline_vs_torch.py [--rounds 30]
                                       [--backend gloo|nccl]

With `--backend nccl` (2 GPUs) the same comparison runs on the GPUs, timed with CUDA syncs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

from zbkit.launch import launch

MODELS = {"compute-bound": (1024, 64, 2), "tiny": (32, 4, 1)}  # width, rows/microbatch, layers
M = 8


class Block(nn.Module):
    """The same stage for both runtimes: torch's takes a tensor, zbkit's a dict."""

    def __init__(self, width: int, layers: int, dict_io: bool) -> None:
        super().__init__()
        self.net = nn.Sequential(
            *[m for _ in range(layers) for m in (nn.Linear(width, width), nn.Tanh())]
        )
        self.dict_io = dict_io

    def forward(self, x: torch.Tensor) -> torch.Tensor | dict:
        y = self.net(x)
        return {"x": y} if self.dict_io else y


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _steps(width: int, rows: int, layers: int, rounds: int, device: torch.device) -> dict:
    from torch.distributed.pipelining import PipelineStage as TorchStage
    from torch.distributed.pipelining import Schedule1F1B

    from zbkit.pipeline import PipelineStage, ScheduleRunner
    from zbkit.schedules import build_schedule

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    ours = Block(width, layers, dict_io=True).to(device)
    theirs = Block(width, layers, dict_io=False).to(device)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(rows * M, width, device=device)
    y = torch.randn(rows * M, width, device=device)

    def loss_ours(out: dict, target: torch.Tensor) -> torch.Tensor:
        return (out["x"] - target).pow(2).mean()

    def loss_theirs(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (out - target).pow(2).mean()

    sched = build_schedule("1f1b", pp=world, microbatches=M)
    runner = ScheduleRunner(sched, [PipelineStage(ours, rank, world)], loss_ours)
    stage = TorchStage(theirs, rank, world, device)
    torch_sched = Schedule1F1B(stage, M, loss_fn=loss_theirs)
    first, last = rank == 0, rank == world - 1

    def run_ours() -> None:
        runner.step(x if first else None, targets=y if last else None)

    def run_theirs() -> None:
        if first:
            torch_sched.step(x)
        elif last:
            torch_sched.step(target=y, losses=[])
        else:
            torch_sched.step()

    times: dict[str, list[float]] = {"zbkit": [], "torch": []}
    runs = {"zbkit": run_ours, "torch": run_theirs}
    for r in range(rounds + 2):  # two warm-up rounds (shapes agreed, allocator warm)
        order = ["zbkit", "torch"] if r % 2 == 0 else ["torch", "zbkit"]
        for name in order:
            dist.barrier()
            _sync(device)
            t0 = time.perf_counter()
            runs[name]()
            _sync(device)
            dist.barrier()  # the step is over when both ranks are done
            if r >= 2:
                times[name].append(time.perf_counter() - t0)
            ours.zero_grad(set_to_none=True)
            theirs.zero_grad(set_to_none=True)
    return {k: statistics.median(v) for k, v in times.items()}


def _hops(width: int, rows: int, rounds: int, trips: int, device: torch.device) -> dict:
    from zbkit.pipeline._comms import P2P
    from zbkit.schedules import Comm, CommOp, Product

    rank = dist.get_rank()
    peer = 1 - rank
    act = torch.randn(rows, width, device=device)
    reply = torch.randn(rows, width, device=device)
    p2p = P2P(None, 2, trips, device, timeout=60.0, who=f"rank {rank}")
    send_act = [Comm(CommOp.SEND, Product.ACT, 1, j, peer, "bench") for j in range(trips)]
    recv_act = [Comm(CommOp.RECV, Product.ACT, 1, j, peer, "bench") for j in range(trips)]
    send_grad = [Comm(CommOp.SEND, Product.GRAD, 0, j, peer, "bench") for j in range(trips)]
    recv_grad = [Comm(CommOp.RECV, Product.GRAD, 0, j, peer, "bench") for j in range(trips)]

    def zbkit_trips() -> None:
        for j in range(trips):
            if rank == 0:
                p2p.send(send_act[j], {"x": act})
                p2p.recv(recv_grad[j])
            else:
                p2p.recv(recv_act[j])
                p2p.send(send_grad[j], {"x": reply})  # a fixed tensor, as the bare echo's
        p2p.finish()

    buf = torch.empty_like(act)

    def bare_trips() -> None:
        for _ in range(trips):
            if rank == 0:
                dist.isend(act, peer).wait()
                dist.irecv(buf, peer).wait()
            else:
                dist.irecv(buf, peer).wait()
                dist.isend(buf, peer).wait()

    times: dict[str, list[float]] = {"zbkit": [], "bare": []}
    runs = {"zbkit": zbkit_trips, "bare": bare_trips}
    for r in range(rounds + 2):
        order = ["zbkit", "bare"] if r % 2 == 0 else ["bare", "zbkit"]
        for name in order:
            dist.barrier()
            t0 = time.perf_counter()
            runs[name]()
            if r >= 2:
                times[name].append((time.perf_counter() - t0) / trips)
    return {k: statistics.median(v) for k, v in times.items()}


def _rank(rounds: int, backend: str) -> dict:
    torch.set_num_threads(1)  # one core per rank: the two runtimes compete for nothing else
    cuda = backend == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    out = {
        name: _steps(w, rows, layers, rounds, device) for name, (w, rows, layers) in MODELS.items()
    }
    width, rows, _ = MODELS["tiny"]
    out["hop"] = _hops(width, rows, 2 * rounds, trips=100, device=device)  # ~0.1 ms each: more
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    args = parser.parse_args()
    res = launch(_rank, args.rounds, args.backend, nprocs=2, backend=args.backend, timeout=1800)[0]
    print(f"2 {args.backend} ranks, m = {M}, medians of {args.rounds} alternating rounds")
    print(f"{'1F1B step':<22}{'zbkit ms':>10}{'torch ms':>10}{'zbkit/torch':>13}  target")
    for name, target in (("compute-bound", 1.00), ("tiny", 1.05)):
        ours, theirs = res[name]["zbkit"], res[name]["torch"]
        ratio = ours / theirs
        ok = "ok" if ratio <= target else "MISSED"
        times = f"{ours * 1e3:>10.3f}{theirs * 1e3:>10.3f}"
        print(f"{name:<22}{times}{ratio:>13.3f}  <= {target:.2f} {ok}")
    hop = res["hop"]
    ratio = hop["zbkit"] / hop["bare"]
    ok = "ok" if ratio <= 1.2 else "MISSED"
    print(
        f"{'hop round trip':<22}{hop['zbkit'] * 1e3:>10.3f}{hop['bare'] * 1e3:>10.3f}"
        f"{ratio:>13.3f}  <= 1.20 {ok}  (second column: bare isend/irecv)"
    )


if __name__ == "__main__":
    main()
