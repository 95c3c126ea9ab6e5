"""Which device a data-parallel replica goes on (shared by the ddp and fsdp backends)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from zbkit.parallel.process_group import get_local_rank


def place_replica(model: torch.nn.Module, group: dist.ProcessGroup | None) -> torch.device | None:
    """Move `model` to this rank's GPU when it needs one; returns that device, or None (CPU)."""
    device = replica_device(
        {p.device for p in model.parameters()},
        str(dist.get_backend(group)),
        get_local_rank(),
        torch.cuda.device_count() if torch.cuda.is_available() else 0,
    )
    if device is not None:
        torch.cuda.set_device(device)
        model.to(device)
    return device


def replica_device(
    param_devices: set[torch.device], group_backend: str, local_rank: int, cuda_count: int
) -> torch.device | None:
    """Where a data-parallel replica lives: None for CPU (gloo, no device_ids) or a CUDA device.

    The GPU index is the LOCAL rank (rank on this machine), never the global rank: on
    a second 8-GPU machine global ranks are 8..15 but the GPUs are cuda:0..7. When each
    process sees a single GPU (CUDA_VISIBLE_DEVICES set per process) it is cuda:0.
    """
    on_cuda = any(d.type == "cuda" for d in param_devices)
    if not on_cuda and "nccl" not in group_backend:
        return None
    if cuda_count == 0:
        raise RuntimeError(
            f"data parallelism over a {group_backend!r} process group needs a CUDA GPU and "
            f"none is visible; use backend='gloo' for CPU training"
        )
    if cuda_count == 1:
        return torch.device("cuda", 0)
    if local_rank >= cuda_count:
        raise RuntimeError(
            f"LOCAL_RANK={local_rank} but only {cuda_count} GPUs are visible: start at most "
            f"{cuda_count} processes per machine"
        )
    return torch.device("cuda", local_rank)
