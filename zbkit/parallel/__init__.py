"""Data-parallel training: process-group setup, backends with gradient accumulation,
and gradient averaging by hand::

    from zbkit.parallel import create_backend, init_distributed
    init_distributed()                       # no-op inside zbkit.launch or a plain process
    backend = create_backend("ddp", grad_accum_steps=4)  # BACKENDS: "single", "ddp", "fsdp"
    model, optimizer, loader, scheduler = backend.prepare(model, optimizer, loader, scheduler)

Pipeline x data parallelism (what zbkit.pipeline's runner uses)::

    pp_group, dp_group, pp_rank, dp_rank = pp_dp_groups(pp=2, dp=2)
    pending = average_gradients(stage.parameters(), dp_group, timeout=60, label="stage 1")
    pending.wait()                           # .grad is now the mean over the replicas
"""

from typing import Any

from zbkit._public import public_dir
from zbkit.parallel._comm_stats import CommStats
from zbkit.parallel.accumulate import AccumOptimizer, AccumScheduler, AccumulatingLoader
from zbkit.parallel.average import PendingAverage, average_gradients
from zbkit.parallel.backends import DDPBackend, SingleBackend, TrainingBackend
from zbkit.parallel.factory import BACKENDS, create_backend
from zbkit.parallel.process_group import (
    get_local_rank,
    get_rank,
    get_world_size,
    init_distributed,
    init_process_group,
    pp_dp_groups,
)

__all__ = [
    "BACKENDS",
    "AccumOptimizer",
    "AccumScheduler",
    "AccumulatingLoader",
    "CommStats",
    "DDPBackend",
    "FSDPBackend",
    "PendingAverage",
    "SingleBackend",
    "TrainingBackend",
    "average_gradients",
    "create_backend",
    "get_local_rank",
    "get_rank",
    "get_world_size",
    "init_distributed",
    "init_process_group",
    "pp_dp_groups",
]


def __getattr__(name: str) -> Any:
    if name == "FSDPBackend":
        # lazily, on first use: torch's FSDP takes about a second to import
        from zbkit.parallel.fsdp import FSDPBackend

        return FSDPBackend
    raise AttributeError(f"module 'zbkit.parallel' has no attribute {name!r}")


def __dir__() -> list[str]:  # dir() and tab completion: __all__ and the loaded submodules
    return public_dir(globals(), __all__)
