"""`planner.measure`: the plan run on real gloo ranks, its bytes held to the tensors' own."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zbkit import planner
from zbkit.schedules import build_schedule

V, H, S, B, M = 128, 32, 8, 4, 2


def _model() -> list[nn.Module]:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(H, 4 * H), nn.GELU(), nn.Linear(4 * H, H))
    return [nn.Embedding(V, H), mlp, nn.Linear(H, V)]


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out.reshape(-1, V), target.reshape(-1))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, V, (B, S), generator=g), torch.randint(0, V, (B, S), generator=g)


def _bytes(modules: list[nn.Module]) -> tuple[int, int]:
    params = [p for m in modules for p in m.parameters()]
    return sum(p.numel() * p.element_size() for p in params), len(params)


@pytest.mark.multiprocess
def test_each_rank_starts_with_its_parameters_and_state_and_peaks_above_them_with_grads():
    layers = _model()
    got = planner.measure(layers, _batch(), "zb-h1", pp=2, microbatches=M,
                          stages=[[0, 1], [2]], loss_fn=_loss, steps=2)  # fmt: skip
    assert got.stages == [range(0, 2), range(2, 3)]
    hop = (B // M) * S * H * 4  # one microbatch's activations (or their gradients), float32
    for rank, mine in zip(got.ranks, ([layers[0], layers[1]], [layers[2]]), strict=True):
        params, tensors = _bytes(mine)
        # Adam: two moments in the parameters' dtype, one float32 step per tensor
        state = params + 2 * params + 4 * tensors
        # and the runtime's receive buffers, one per microbatch (rank 0 receives gradients,
        # rank 1 activations), kept across steps; a message this small also keeps a copy
        # behind its 16-byte header on each side, and the headers' own codes
        assert M * hop <= rank.start_bytes - state <= 2 * M * (hop + 16) + 2048
        # a step makes every gradient (and activations besides) before the optimizer steps
        assert rank.peak_bytes >= rank.start_bytes + params
        assert len(rank.samples) == 2 and rank.seconds > 0
    assert got.step_seconds == max(r.seconds for r in got.ranks)
    steps = [max(a, b) for a, b in zip(got.ranks[0].samples, got.ranks[1].samples, strict=True)]
    # (not held to step_seconds, a median per rank: with the ranks' slow steps apart, the
    # fastest step, each as long as its slowest rank, can exceed every rank's median)
    assert got.fastest_step_seconds == min(steps)
    # the last timed step's trace, every rank's: the program it ran, action for action
    ran = {r: [f"{e.stage}{e.kind}{e.microbatch}" for e in got.trace.events if e.rank == r]
           for r in (0, 1)}  # fmt: skip
    assert ran == {r: [str(a) for a in got.program.program[r]] for r in (0, 1)}
    # that step, not the median: each rank's actions lie inside its own last sample, and the
    # two ranks' steps overlap (each waits on the other), so the merged span is at most both
    assert 0 < got.trace.makespan <= sum(r.samples[-1] for r in got.ranks)


def test_what_cannot_be_measured_is_named_before_a_rank_starts():
    layers, batch = _model(), _batch()
    with pytest.raises(ValueError, match="needs a loss_fn"):
        planner.measure(layers, batch, "1f1b", pp=2, microbatches=M)
    with pytest.raises(ValueError, match=r"batch is \(inputs, targets\)"):
        planner.measure(layers, batch[0], "1f1b", pp=2, microbatches=M, loss_fn=_loss)
    with pytest.raises(ValueError, match="do not cover the 3 layers 0-2 once each"):
        planner.measure(layers, batch, "1f1b", pp=2, microbatches=M, loss_fn=_loss,
                        stages=[[0], [1]])  # fmt: skip
    with pytest.raises(ValueError, match="4 stages but 3 layers"):
        planner.measure(layers, batch, "zb-v", pp=2, microbatches=M, loss_fn=_loss)
    with pytest.raises(ValueError, match="unknown optimizer 'lamb'"):
        planner.measure(layers, batch, "1f1b", pp=2, microbatches=M, loss_fn=_loss,
                        optimizer="lamb")  # fmt: skip


@pytest.mark.multiprocess
def test_compare_puts_the_prediction_beside_the_run_and_says_where_they_differ():
    layers, batch = _model(), _batch()
    sample = (batch[0][: B // M], batch[1][: B // M])
    prof = planner.profile(layers, sample, loss_fn=_loss, repeats=2)
    pred = planner.predict(prof, "1f1b", pp=2, microbatches=M, stages=[[0, 1], [2]])
    got = planner.measure(layers, batch, "1f1b", pp=2, microbatches=M, stages=pred.stages,
                          loss_fn=_loss, steps=1)  # fmt: skip
    both = planner.compare(pred, got)
    ratios = [p.peak_bytes / m.peak_bytes for p, m in zip(pred.ranks, got.ranks, strict=True)]
    assert both.peak_ratios == ratios
    # the allocator is the oracle: within 10% on this tiny model, whose messages ride behind
    # 16-byte headers in copies the prediction leaves out (benchmarks/plan_accuracy.py holds
    # a model of real size to 5%)
    assert all(0.9 <= x <= 1.1 for x in ratios), ratios
    text = str(both)
    for r, rank in enumerate(got.ranks):
        assert f"{rank.peak_bytes / 2**20:.2f}" in text.splitlines()[2 + r]
    tight = planner.compare(pred, got, bytes_tolerance=0.0, seconds_tolerance=0.0)
    assert len(tight.notes()) == 3 and "rank 0: predicted" in tight.notes()[0]
    # no bound on time: a profile taken while the host is crowded can be 20x the run's
    loose = planner.compare(pred, got, bytes_tolerance=10.0, seconds_tolerance=1e9)
    assert loose.notes() == [] and "within the tolerances" in str(loose)
    assert "<table>" in both._repr_html_() and both._repr_html_().count("<tr>") == 3
    other = planner.predict(prof, "1f1b", pp=2, microbatches=M, stages=[[0], [1, 2]])
    with pytest.raises(ValueError, match="measure with stages=prediction.stages"):
        planner.compare(other, got)
    with pytest.raises(ValueError, match="predicted 'zb-h1' but measured '1f1b'"):
        planner.compare(planner.predict(prof, "zb-h1", pp=2, microbatches=M,
                                        stages=pred.stages), got)  # fmt: skip
    h1 = planner.predict(prof, "zb-h1", pp=2, microbatches=M, stages=pred.stages)
    moved = planner.measure(layers, batch, "zb-h1", pp=2, microbatches=M, stages=pred.stages,
                            loss_fn=_loss, steps=1)  # fmt: skip
    assert planner.compare(h1, moved).measured is moved  # zb-h1 by name: the same program
    other = build_schedule("1f1b", pp=2, microbatches=M)  # another program, the same name
    other.name = "zb-h1"
    wrong = planner.predict(prof, other, pp=2, microbatches=M, stages=pred.stages)
    with pytest.raises(ValueError, match="the program measured is not the one predicted"):
        planner.compare(wrong, moved)
    pytest.importorskip("matplotlib")
    fig = both.plot()
    assert len(fig.axes) == 2
    dashed = [line for line in fig.axes[1].get_lines() if line.get_linestyle() == "--"]
    assert dashed[0].get_ydata()[0] == pytest.approx(got.ranks[1].peak_bytes / 2**20)
    # one time axis; the legend above the first rank's plot, off its curves
    assert fig.axes[0].get_shared_x_axes().joined(fig.axes[0], fig.axes[1])
    fig.canvas.draw()
    legend, first = fig.axes[0].get_legend().get_window_extent(), fig.axes[0].get_window_extent()
    assert legend.y0 >= first.y1 and legend.y1 <= fig.bbox.y1, (legend, first, fig.bbox)


@pytest.mark.multiprocess
def test_the_wire_is_measured_on_real_ranks():
    wire = planner.wire(pp=2, sizes=(1 << 12, 1 << 20), microbatches=4)
    assert wire.latency >= 0 and wire.per_byte >= 0 and 0 < wire.overhead < 1
    assert wire.hop(1 << 20) == pytest.approx(wire.latency + (1 << 20) * wire.per_byte)
    with pytest.raises(ValueError, match="pp must be an int >= 2"):
        planner.wire(pp=1)
    with pytest.raises(ValueError, match="two byte counts, smaller first"):
        planner.wire(sizes=(1 << 20, 1 << 10))
