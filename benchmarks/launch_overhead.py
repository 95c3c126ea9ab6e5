"""Overhead of `zbkit.launch` against the bare torch way to do the same thing.

Both sides time "call -> result" for 4 gloo ranks that each do one all_reduce:
- zbkit:    launch(work, nprocs=4)
- baseline: torch.multiprocessing.spawn + init_process_group + all_reduce, results
            through a queue (the least a script needs to get values back).
Fresh Python processes importing torch dominate both. Runs alternate (zbkit first on
even repeats, baseline first on odd ones) so machine noise hits both alike; we report
the medians and the ratio (target <= 1.3).

    .venv/bin/python benchmarks/launch_overhead.py [--repeats 7] [--nprocs 4]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

if __name__ == "__mp_main__":
    # A baseline rank re-imports this file before anything else. zbkit starts each rank in
    # a new session (so it can stop the rank's whole process tree); with Linux's scheduler
    # autogroups a new session is also a new scheduling group, which on a busy machine gets
    # its own fair share of the CPU. Do the same here, before the costly `import torch`,
    # so both sides are scheduled alike and the ratio measures the launcher, not the load.
    os.setsid()

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from zbkit import launch


def work() -> float:
    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return t.item()


def _spawned(rank: int, world: int, port: int, queue) -> None:  # type: ignore[no-untyped-def]
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    queue.put((rank, work()))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:  # racy, but fine for a baseline on a quiet port range
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def baseline(nprocs: int) -> list[float]:
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_spawned, args=(nprocs, _free_port(), queue), nprocs=nprocs, join=True)
    return [v for _, v in sorted(queue.get() for _ in range(nprocs))]


def zbkit_launch(nprocs: int) -> list[float]:
    return launch(work, nprocs=nprocs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--nprocs", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    expected = [float(sum(range(1, args.nprocs + 1)))] * args.nprocs  # closed form
    times: dict[str, list[float]] = {"zbkit": [], "baseline": []}
    runs = {"zbkit": zbkit_launch, "baseline": baseline}
    for i in range(args.repeats):
        order = ["zbkit", "baseline"] if i % 2 == 0 else ["baseline", "zbkit"]
        for name in order:
            start = time.perf_counter()
            got = runs[name](args.nprocs)
            times[name].append(time.perf_counter() - start)
            assert got == expected, f"{name} returned {got}, expected {expected}"
        print(
            f"repeat {i}: zbkit {times['zbkit'][-1]:.2f} s, baseline {times['baseline'][-1]:.2f} s"
        )
    med = {name: statistics.median(ts) for name, ts in times.items()}
    ratios = [z / b for z, b in zip(times["zbkit"], times["baseline"], strict=True)]
    autogroup = "/proc/sys/kernel/sched_autogroup_enabled"
    if os.path.exists(autogroup):
        print(f"sched_autogroup_enabled={open(autogroup).read().strip()}; load {os.getloadavg()}")
    print(
        f"{args.nprocs} gloo ranks, one all_reduce, {args.repeats} paired repeats: "
        f"zbkit median {med['zbkit']:.2f} s, baseline median {med['baseline']:.2f} s, "
        f"ratio of medians {med['zbkit'] / med['baseline']:.2f}, "
        f"median paired ratio {statistics.median(ratios):.2f} (target <= 1.3)"
    )


if __name__ == "__main__":
    main()
