"""A zbkit script runs unchanged under torchrun: zbkit.parallel reads torchrun's variables."""

import subprocess
import sys

import pytest

SCRIPT = """
import torch, torch.distributed as dist
from zbkit.parallel import get_rank, get_world_size, init_distributed
assert init_distributed("gloo")
t = torch.tensor([float(get_rank() + 1)])
dist.all_reduce(t)
print(f"rank {get_rank()} of {get_world_size()}: sum={t.item()}")
dist.destroy_process_group()
"""


@pytest.mark.multiprocess
def test_script_under_torchrun(tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", str(script)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    for rank in range(2):  # 1 + 2, the closed form of the sum over ranks
        assert f"rank {rank} of 2: sum=3.0" in done.stdout
