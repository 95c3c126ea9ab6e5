"""Process-group setup: one place that knows torchrun's environment variables.

torchrun (and `zbkit.launch`) start one process per rank. torchrun describes each
process with environment variables:

    RANK        global rank, 0 .. WORLD_SIZE-1, unique across all machines
    WORLD_SIZE  number of processes in the job
    LOCAL_RANK  rank on *this* machine: the GPU index this process should use
    LOCAL_WORLD_SIZE  processes on this machine
    MASTER_ADDR / MASTER_PORT  where rank 0 listens for the rendezvous

The helpers below answer from the live process group when there is one, from the
environment before `init_distributed()` has run, and with the single-process answer
(rank 0 of 1) when there is neither, so the same script runs under `python`,
`torchrun` and inside `zbkit.launch`.

`init_process_group` is the one place in zbkit that creates the default process group:
`init_distributed` calls it with torchrun's rendezvous (`env://`), `zbkit.launch`'s ranks
with a TCPStore on a loopback socket. `pp_dp_groups` then splits the world into pipeline
and data-parallel groups.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = [
    "get_local_rank",
    "get_rank",
    "get_world_size",
    "init_distributed",
    "init_process_group",
    "pp_dp_groups",
]


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"environment variable {name}={value!r} is not an integer; torchrun sets it to "
            f"one, so unset it or fix it before starting"
        ) from None


def _is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def group_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where `group`'s collectives take their tensors: this rank's GPU on NCCL (launch and
    torchrun give rank k GPU k), else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def require_process_group(who: str, alone: str = "") -> None:
    """Raise RuntimeError unless a process group is up, naming ``who`` needs one, how to get
    one, and (``alone``) what to use in one process instead. The one such check in zbkit."""
    if _is_initialized():
        return
    instead = f"; for one process use {alone}" if alone else ""
    raise RuntimeError(
        f"{who} needs a process group: run inside zbkit.launch(...) or a Cluster, or call "
        f"zbkit.parallel.init_distributed() in a script started by torchrun{instead}"
    )


def new_group(ranks: list[int], *, members_only: bool = False) -> dist.ProcessGroup:
    """A process group of ``ranks``; zbkit's one place that makes one.

    By default every rank of the world must call this, in the same order (torch's rule for
    ``new_group``). ``members_only=True``: only ``ranks`` call it (torch's
    ``use_local_synchronization``), for groups one pipeline makes for itself while the
    other replicas make theirs.
    """
    return dist.new_group(ranks, use_local_synchronization=members_only)


def get_rank() -> int:
    """Global rank of this process (0 with no process group and no torchrun environment)."""
    if _is_initialized():
        return dist.get_rank()
    rank = _env_int("RANK")
    return 0 if rank is None else rank


def get_world_size() -> int:
    """Number of processes in the job (1 with no process group and no torchrun environment)."""
    if _is_initialized():
        return dist.get_world_size()
    world = _env_int("WORLD_SIZE")
    return 1 if world is None else world


def get_local_rank() -> int:
    """Rank of this process on its machine: the index of the GPU it should drive.

    torchrun sets LOCAL_RANK. Without it we derive it: RANK % LOCAL_WORLD_SIZE when the
    per-machine count is known, else the global rank (one machine, as in `zbkit.launch`).
    On a second machine the global rank is 8..15 while its GPUs are 0..7, which is why
    device placement must use this and never `get_rank()`.
    """
    local = _env_int("LOCAL_RANK")
    if local is not None:
        return local
    rank = get_rank()
    per_machine = _env_int("LOCAL_WORLD_SIZE")
    return rank % per_machine if per_machine else rank


def init_distributed(
    backend: str | None = None, *, timeout: timedelta | float = timedelta(minutes=5)
) -> bool:
    """Join the job's process group; returns True when a process group is active afterwards.

    - A process group already exists (inside `zbkit.launch`, or a second call): it is kept
      as it is, never initialised twice, and `backend` is ignored.
    - torchrun's RANK and WORLD_SIZE are set: initialise from the environment (`env://`),
      with `backend` defaulting to "nccl" when CUDA is available and "gloo" otherwise. With
      NCCL the current CUDA device becomes cuda:LOCAL_RANK.
    - Neither: a plain single process; nothing is initialised and False is returned.

    `timeout` (a timedelta or seconds) bounds the rendezvous and every collective, so a
    missing rank fails with an error instead of hanging.
    """
    if not dist.is_available():
        raise RuntimeError("this torch build has no torch.distributed; install a build with it")
    if _is_initialized():
        return True

    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    if rank is None and world is None:
        return False  # plain `python script.py`: single process, no group to join
    if rank is None or world is None:
        missing = "RANK" if rank is None else "WORLD_SIZE"
        raise RuntimeError(
            f"{missing} is not set but {'WORLD_SIZE' if rank is None else 'RANK'} is: start "
            f"the script with torchrun (which sets both) or set both by hand"
        )
    if not 0 <= rank < world:
        raise ValueError(f"RANK={rank} is outside 0..WORLD_SIZE-1 (WORLD_SIZE={world})")
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(name):
            raise RuntimeError(
                f"{name} is not set: torchrun sets it; when starting ranks by hand, set "
                f"MASTER_ADDR and MASTER_PORT to rank 0's address and a free port"
            )

    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    init_process_group(backend, rank=rank, world_size=world, init_method="env://", timeout=timeout)
    return True


def init_process_group(
    backend: str,
    *,
    rank: int,
    world_size: int,
    store: dist.Store | None = None,
    init_method: str | None = None,
    timeout: timedelta | float | None = None,
) -> None:
    """Create the default process group: the one call to `dist.init_process_group` in zbkit.

    Give the rendezvous either as a `store` (what `zbkit.launch` does: rank 0 serves a
    TCPStore on a socket bound to 127.0.0.1) or as an `init_method` ("env://" reads
    MASTER_ADDR and MASTER_PORT, as under torchrun). With "nccl" this process first makes
    cuda:LOCAL_RANK its current device, so each rank drives its own GPU. `timeout` (a
    timedelta or seconds; None: torch's default) bounds the rendezvous and every collective.
    """
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise RuntimeError("backend='nccl' needs CUDA GPUs; use backend='gloo' on CPU")
        # Each process drives the GPU with its LOCAL rank's index (not the global rank).
        torch.cuda.set_device(get_local_rank())
    if timeout is not None and not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    dist.init_process_group(
        backend,
        init_method=init_method,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=timeout,
    )


def pp_dp_groups(pp: int, dp: int) -> tuple[dist.ProcessGroup, dist.ProcessGroup, int, int]:
    """Lays ``pp * dp`` ranks out as ``dp`` pipelines of ``pp`` consecutive ranks.

    Returns ``(pp_group, dp_group, pp_rank, dp_rank)`` for the calling rank: global rank
    ``g`` is stage-rank ``g % pp`` of pipeline ``g // pp``. Every rank must call this (group
    creation is collective), with the same ``pp`` and ``dp``::

        pp=2, dp=3:   pipeline 0: ranks 0 1     dp groups: {0, 2, 4} (first stages)
                      pipeline 1: ranks 2 3                {1, 3, 5} (second stages)
                      pipeline 2: ranks 4 5
    """
    require_process_group("pp_dp_groups")
    world, rank = dist.get_world_size(), dist.get_rank()
    if pp * dp != world:
        raise ValueError(f"pp={pp} x dp={dp} = {pp * dp} ranks, but the world has {world}")
    # Every rank creates every group, in the same order (new_group is collective), and
    # keeps the two it belongs to.
    pp_groups = [new_group(list(range(d * pp, (d + 1) * pp))) for d in range(dp)]
    dp_groups = [new_group(list(range(p, world, pp))) for p in range(pp)]
    return pp_groups[rank // pp], dp_groups[rank % pp], rank % pp, rank // pp
