"""Data-parallel training: process-group setup and backends with gradient accumulation.

from zbkit.parallel import create_backend, init_distributed
init_distributed()                       # no-op inside zbkit.launch or a plain process
backend = create_backend("ddp", grad_accum_steps=4)   # or "single", "fsdp"
model, optimizer, loader, scheduler = backend.prepare(model, optimizer, loader, scheduler)
"""

from typing import Any

from zbkit.parallel._comm_stats import CommStats
from zbkit.parallel.accumulate import AccumOptimizer, AccumScheduler, AccumulatingLoader
from zbkit.parallel.backends import DDPBackend, SingleBackend, TrainingBackend
from zbkit.parallel.factory import BackendFactory, create_backend
from zbkit.parallel.process_group import get_local_rank, get_rank, get_world_size, init_distributed

__all__ = [
    "AccumOptimizer",
    "AccumScheduler",
    "AccumulatingLoader",
    "BackendFactory",
    "CommStats",
    "DDPBackend",
    "FSDPBackend",
    "SingleBackend",
    "TrainingBackend",
    "create_backend",
    "get_local_rank",
    "get_rank",
    "get_world_size",
    "init_distributed",
]


def __getattr__(name: str) -> Any:
    # FSDPBackend is imported on first use: torch's FSDP takes about a second to import.
    if name == "FSDPBackend":
        from zbkit.parallel.fsdp import FSDPBackend

        return FSDPBackend
    raise AttributeError(f"module 'zbkit.parallel' has no attribute {name!r}")
