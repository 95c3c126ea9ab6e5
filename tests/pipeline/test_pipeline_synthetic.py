"""SyntheticStage: real arithmetic, set times, and the directions each pass pays for."""

from __future__ import annotations

import pytest
import torch

from zbkit.pipeline import LocalPipeline, PipelineStage, SyntheticStage
from zbkit.schedules import Costs, build_schedule


def _loss(out: dict, y: torch.Tensor) -> torch.Tensor:
    return (out["x"] - y).pow(2).mean()


def _plain_grads(stages: list[SyntheticStage], x: torch.Tensor, y: torch.Tensor) -> list:
    ws = []
    h = x
    for st in stages:
        w = st.weight.detach().clone().requires_grad_()
        ws.append(w)
        h = h * w
    _loss({"x": h}, y).backward()
    return [w.grad for w in ws]


@pytest.mark.parametrize("split_first", [False, True])
def test_synthetic_pipeline_gradients_and_set_times(split_first: bool) -> None:
    f, i, w = 0.002, 0.003, 0.004  # seconds; only lower bounds are checked (sleep >= asked)
    sch = build_schedule("zb-h1", pp=2, microbatches=4)
    mods = [SyntheticStage(f, i, w, width=4) for _ in range(2)]
    x, y = torch.randn(8, 4), torch.randn(8, 4)
    expected = _plain_grads(mods, x, y)
    stages = [PipelineStage(mods[0], 0, 2, split_first_stage=split_first), mods[1]]
    pipe = LocalPipeline(stages, sch, _loss)
    pipe.step(x, y)
    for mod, exp in zip(mods, expected, strict=True):
        assert torch.allclose(mod.weight.grad, exp, atol=1e-6)
    # each pass pays only for its direction (needs_direction): I the I time, W the W time
    assert sorted(mods[1].paid) == ["I"] * 4 + ["W"] * 4
    if split_first:  # stage 0 splits like every other stage
        assert sorted(mods[0].paid) == ["I"] * 4 + ["W"] * 4
    else:  # stage 0's I is a no-op and its W runs the whole backward
        assert mods[0].paid == ["IW"] * 4
    # and the actions took at least the set times (sleep never returns early)
    took = {(e.stage, e.kind): e.end - e.start for e in pipe.trace.events}
    assert took[1, "F"] >= f and took[1, "I"] >= i and took[1, "W"] >= w
    assert took[0, "W"] >= (w if split_first else i + w)


def test_synthetic_stage_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="mode must be"):
        SyntheticStage(mode="busy")
    with pytest.raises(ValueError, match="times must be >= 0"):
        SyntheticStage(F=-1.0)


def test_synthetic_stage_from_costs_takes_hidden_state_shaped_inputs() -> None:
    # the demo's timed runs: costs measured from a real stage, activations shaped (b, t, dim)
    mods = [SyntheticStage.from_costs(Costs(F=0.001, I=0.002, W=0.0), width=6) for _ in range(2)]
    assert (mods[0].times.F, mods[0].times.I, mods[0].times.W) == (0.001, 0.002, 0.0)
    x, y = torch.randn(4, 3, 6), torch.randn(4, 3, 6)  # (b, t, dim)
    expected = _plain_grads(mods, x, y)
    sch = build_schedule("zb-v", pp=1, microbatches=2)  # both chunks on one rank
    stages = [PipelineStage(m, s, 2, split_first_stage=True) for s, m in enumerate(mods)]
    LocalPipeline(stages, sch, _loss).step(x, y)
    for mod, exp in zip(mods, expected, strict=True):
        assert torch.allclose(mod.weight.grad, exp, atol=1e-6)
