"""What every test shares: threads kept to the cores, and a gloo world of one rank."""

import logging
import os
from collections.abc import Iterator

import pytest
import torch.distributed as dist

# Tests share 2 cores: keep torch from oversubscribing them in every process.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def gloo_world() -> Iterator[None]:
    """A gloo world of one rank in this process: torch's V schedules put stages 0 and 1 on
    it, so torch's own runtime runs both stages here."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    # torch logs the whole schedule grid on a failure; the failures tests cause are expected
    logging.getLogger("torch.distributed.pipelining.schedules").setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        dist.destroy_process_group()
