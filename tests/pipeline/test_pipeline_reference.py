"""The one-page reference executor (`zbkit.pipeline.reference.run_schedule`) against
`LocalPipeline` and against plain autograd, on every schedule: the same losses, the same
gradients (each stage's actions in its rank's program order in both, so the same sums)."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from pipeline_models import ALL_SCHEDULES, assert_grads_match, batch, loss_fn, make_stages, oracle
from pipeline_models import schedule as built

from zbkit.pipeline import LocalPipeline
from zbkit.pipeline.reference import run_schedule


@pytest.mark.parametrize("name", ALL_SCHEDULES)
def test_reference_equals_local_pipeline_and_autograd(name: str) -> None:
    sch = built(name, 4, 8)
    mods = make_stages(sch.num_stages)
    twin = copy.deepcopy(mods)
    x, y = batch(16)
    _, expected = oracle(mods, x, y)

    losses = run_schedule(sch, mods, {"x": x}, y, loss_fn)
    local = LocalPipeline(twin, sch, loss_fn).step(x, y)
    assert torch.equal(torch.stack(losses), torch.stack(local))
    assert_grads_match(mods, expected, f"reference {name}")
    for a, b in zip(mods, twin, strict=True):  # the same sums, in the same order
        for (n, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
            both_none = p.grad is None and q.grad is None  # a parameter the loss never uses
            assert both_none or torch.equal(p.grad, q.grad), (name, n)


def test_reference_fits_on_one_page() -> None:
    lines = inspect.getsource(run_schedule).splitlines()
    assert 40 <= len(lines) <= 80, len(lines)
