"""The scripts in examples/ run under real torchrun and train: the loss falls step by step,
and every step's loss is what one process training the same model on the same data with
plain `loss.backward()` computes (the oracle; at step 0 within 1e-4).

One torchrun launch per script on 2 ranks, and one of pipeline_gpt.py on 4 (PP x DP).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SCRIPTS = ("pipeline_gpt.py", "torch_pipelining_gpt.py", "ddp_accumulation.py")
TORCHRUN = r"torchrun --standalone --nproc-per-node \d+"
LR = 0.5  # given to every script: the oracle trains with it too
STEP = re.compile(r"^step (\d+) loss (\d+\.\d+)$", re.M)


def _gpt():
    """examples/_gpt.py, the model and data the scripts share, imported here."""
    spec = importlib.util.spec_from_file_location("_gpt", EXAMPLES / "_gpt.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def torchrun(script: str, nprocs: int, *args: str) -> str:
    """The script's stdout after `torchrun --standalone --nproc-per-node nprocs` (gloo)."""
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    cmd = [*run, str(nprocs), str(EXAMPLES / script), "--backend", "gloo", "--lr", str(LR), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # minutes: the launch must succeed, and the machine may be busy with other ranks
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    return done.stdout


def printed_losses(out: str, steps: int) -> list[float]:
    """The `step k loss v` lines, checked to fall step by step."""
    found = [(int(s), float(v)) for s, v in STEP.findall(out)]
    assert [s for s, _ in found] == list(range(steps)), out
    values = [v for _, v in found]
    assert all(b < a for a, b in zip(values, values[1:], strict=False)), f"not falling: {values}"
    return values


def one_process(batches_of_step: Callable[[int], list], steps: int, *, halve_lr=False) -> list:
    """The oracle: the same model trained in this process with plain `loss.backward()`, each
    step on the mean loss over every batch the ranks see in it (all equal-sized). The scripts'
    optimizer is SGD(lr=LR), whose step is proportional to the gradient, so a gradient
    scaled wrongly shows; ddp_accumulation.py's scheduler takes it linearly to LR / 2."""
    gpt = _gpt()
    model = gpt.build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.5, total_iters=steps)
    out = []
    for step in range(steps):
        batches = batches_of_step(step)
        loss = sum(gpt.cross_entropy(model(x), y) for x, y in batches) / len(batches)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if halve_lr:
            scheduler.step()
        out.append(loss.item())
    return out


def assert_trained_as(got: list[float], expected: list[float]) -> None:
    # the same weights and updates, only the order of the sums differs (and the printed six
    # decimals): step 0 within 1e-4, the later steps carry the rounding of the earlier ones
    assert got[0] == pytest.approx(expected[0], abs=1e-4), (got, expected)
    assert got == pytest.approx(expected, abs=1e-3), (got, expected)


def bubbles(out: str, first: str) -> tuple[float, float]:
    found = re.search(rf"^bubble: {first} (\d+\.\d+), simulated (\d+\.\d+)", out, re.M)
    assert found, out
    a, b = float(found.group(1)), float(found.group(2))
    assert 0 <= a < 1 and 0 <= b < 1, out
    return a, b


@pytest.mark.multiprocess
def test_pipeline_gpt_trains_as_one_process_on_two_ranks():
    out = torchrun("pipeline_gpt.py", 2, "--schedule", "zb-v", "--batch", "32", "--steps", "5")
    gpt = _gpt()
    expected = one_process(lambda step: [gpt.counting_batch(32, step)], 5)
    assert_trained_as(printed_losses(out, 5), expected)
    bubbles(out, "measured")


@pytest.mark.multiprocess
def test_pipeline_gpt_pp_x_dp_trains_as_one_process_on_four_ranks():
    # 2 pipelines of 2 ranks, each on its own rows: one process sees both replicas' rows
    out = torchrun("pipeline_gpt.py", 4, "--pp", "2", "--schedule", "zb-h1", "--batch", "32",
                   "--steps", "3")  # fmt: skip
    assert "pp 2 x dp 2" in out
    gpt = _gpt()
    expected = one_process(lambda step: [gpt.counting_batch(32, step, d) for d in range(2)], 3)
    assert_trained_as(printed_losses(out, 3), expected)
    bubbles(out, "measured")


@pytest.mark.multiprocess
def test_torch_pipelining_gpt_trains_as_one_process():
    out = torchrun("torch_pipelining_gpt.py", 2, "--schedule", "ScheduleZBVZeroBubble",
                   "--batch", "32", "--steps", "5")  # fmt: skip
    gpt = _gpt()
    expected = one_process(lambda step: [gpt.counting_batch(32, step)], 5)
    assert_trained_as(printed_losses(out, 5), expected)
    bubbles(out, "traced")


@pytest.mark.multiprocess
def test_ddp_accumulation_trains_as_one_process_and_syncs_once_per_window():
    out = torchrun("ddp_accumulation.py", 2, "--steps", "5", "--accum", "4", "--batch", "8")
    gpt = _gpt()

    def window(step: int) -> list:  # its 4 micro-batches on each of the 2 ranks
        return [gpt.counting_batch(8, 4 * step + i, replica=r) for r in range(2) for i in range(4)]

    assert_trained_as(printed_losses(out, 5), one_process(window, 5, halve_lr=True))
    per_backward = re.search(r"per synchronising backward \[([\d, ]+)\]", out)
    assert per_backward, out
    assert len(per_backward.group(1).split(",")) == 5  # one all-reducing backward a window


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_example_says_how_to_run_it(script):
    doc = (EXAMPLES / script).read_text()
    for backend in ("gloo", "nccl"):
        command = rf"{TORCHRUN} examples/{script} --backend {backend}"
        assert re.search(command, doc), f"{script}'s docstring has no {backend} command"
    readme = (ROOT / "README.md").read_text()
    assert re.search(rf"{TORCHRUN} examples/{script}", readme), f"README does not run {script}"
