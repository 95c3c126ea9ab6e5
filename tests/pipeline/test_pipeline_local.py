"""LocalPipeline (every stage in one process) against plain full-batch autograd."""

from __future__ import annotations

import gc
import json
import weakref

import pytest
import torch
from pipeline_models import (
    ALL_SCHEDULES,
    WIDTH,
    assert_grads_match,
    batch,
    loss_fn,
    make_stages,
    oracle,
    schedule,
)
from torch import nn

from zbkit.pipeline import LocalPipeline, PipelineStage, StageError
from zbkit.schedules import Costs, Schedule, ScheduleError, simulate


@pytest.mark.parametrize("name", ALL_SCHEDULES)
@pytest.mark.parametrize("pp,m", [(4, 4), (4, 8), (3, 6), (2, 2)])
def test_local_pipeline_matches_full_batch_autograd(name: str, pp: int, m: int) -> None:
    sch = schedule(name, pp, m)
    m = sch.microbatches  # dualpipev needs at least 2 pp
    mods = make_stages(sch.num_stages)
    x, y = batch(3 * m)
    loss, expected = oracle(mods, x, y)
    pipe = LocalPipeline(mods, sch, loss_fn)
    losses = pipe.step(x, y)
    assert len(losses) == m
    # equal microbatches: the mean of the microbatch losses is the full-batch loss
    assert torch.allclose(torch.stack(losses).mean(), loss, atol=1e-6)
    assert_grads_match(mods, expected, f"{name} pp={pp} m={m}")
    if sch.num_stages > 2:
        assert mods[1].unused.grad is None  # never used: no gradient, as in plain autograd


@pytest.mark.parametrize("name", ALL_SCHEDULES)
def test_split_first_stage_is_exact_too(name: str) -> None:
    sch = schedule(name, 4, 4)
    mods = make_stages(sch.num_stages)
    x, y = batch(8)
    _, expected = oracle(mods, x, y)
    first = PipelineStage(mods[0], 0, sch.num_stages, split_first_stage=True)
    LocalPipeline([first, *mods[1:]], sch, loss_fn).step(x, y)
    assert_grads_match(mods, expected, f"{name} split first stage")
    assert x.grad is None  # the data's throw-away gradient went to a detached copy


@pytest.mark.parametrize("name", ALL_SCHEDULES)
def test_memory_record_equals_simulator_peak(name: str) -> None:
    sch = schedule(name, 4, 8)
    pipe = LocalPipeline(make_stages(sch.num_stages), sch, loss_fn)
    pipe.step(*batch(16))
    for costs in (Costs(), Costs(mem_activation=1.0, mem_weight=0.5)):
        measured = pipe.trace.peak_for(costs)
        assert measured == simulate(sch, costs).peak_memory, (name, costs)
    with pytest.raises(TypeError, match=r"peak_for\(Costs\(mem_activation=1.0"):
        pipe.trace.peak_for(1.0)  # type: ignore[arg-type]
    # the trace has one event per action, in each rank's program order
    for rank in sch.program:  # an overlapped pair: its two halves, marked as paired
        got = [(e.stage, e.kind, e.microbatch) for e in pipe.trace.events if e.rank == rank]
        assert got == [(a.stage, a.kind, a.microbatch) for a in sch.actions(rank)]
    paired = sum(e.paired for e in pipe.trace.events)
    assert paired == 2 * sum(len(item.halves) == 2 for row in sch.program.values() for item in row)


def test_two_steps_accumulate_like_autograd_and_leave_nothing_behind() -> None:
    sch = schedule("zb-v", 2, 4)
    mods = make_stages(sch.num_stages)
    x, y = batch(8)
    _, g1 = oracle(mods, x, y)
    pipe = LocalPipeline(mods, sch, loss_fn)
    seen: list[weakref.ref] = []
    hook = mods[1].lin.register_forward_hook(lambda mod, i, o: seen.append(weakref.ref(o)))
    pipe.step(x, y)
    pipe.step(x, y)  # a second step adds the same gradients again
    hook.remove()
    assert_grads_match(
        mods,
        [
            {n: 2 * g for n, g in d.items() if g is not None}
            | {n: None for n, g in d.items() if g is None}
            for d in g1
        ],
        "two steps",
        atol=2e-6,
    )
    gc.collect()
    assert seen and all(r() is None for r in seen), "a stage's activations outlived the step"
    for st in pipe.stages:
        assert st.held_activations == 0 and st.held_weight_state == 0
        st.assert_clean()


def test_stage_errors_name_the_stage_and_leave_no_state() -> None:
    sch = schedule("1f1b", 2, 2)

    class NotADict(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(WIDTH, 2)

        def forward(self, x, skip, ids):
            return self.lin(x)

    mods = make_stages(2)
    pipe = LocalPipeline([mods[0], NotADict()], sch, loss_fn)
    with pytest.raises(StageError, match=r"stage 1 microbatch 0.*dict\[str, Tensor\]"):
        pipe.step(*batch(4))
    assert all(st.held_activations == 0 for st in pipe.stages)

    class Raises(nn.Module):
        def forward(self, x, skip, ids):
            raise RuntimeError("boom")

    pipe = LocalPipeline([mods[0], Raises()], sch, loss_fn)
    with pytest.raises(StageError, match="stage 1 microbatch 0: the module's forward raised"):
        pipe.step(*batch(4))
    with pytest.raises(ValueError, match="do not split into 2 equal microbatches"):
        LocalPipeline(make_stages(2), sch, loss_fn).step(*batch(5))
    with pytest.raises(ValueError, match="2 stages but 3 modules"):
        LocalPipeline(make_stages(3), sch, loss_fn)


def test_misordered_program_is_reported() -> None:
    # rank 1 runs its backward before the forward it needs: nobody can ever move
    sch = Schedule.from_program(
        {0: ["0F0", "0B0"], 1: ["1B0", "1F0"]}, stage_to_rank=[0, 1], microbatches=1
    )
    with pytest.raises((ScheduleError, StageError), match="1B0|before F"):
        LocalPipeline(make_stages(2), sch, loss_fn).step(*batch(2))


def test_stage_split_backward_by_hand() -> None:
    """I then W on the awkward stage equals one full backward on a copy."""
    torch.manual_seed(0)
    mods = make_stages(3)
    mid = mods[1]
    x = torch.randn(4, WIDTH, requires_grad=True)
    skip = torch.randn(4, WIDTH, requires_grad=True)
    ids = torch.tensor([0, 1, 2, 3])
    grads = {"x": torch.randn(4, WIDTH), "skip": torch.randn(4, WIDTH)}
    stage = PipelineStage(mid, 1, 3)
    stage.forward(0, {"x": x, "skip": skip, "ids": ids})
    input_grads = stage.backward_input(0, grads)
    assert all(p.grad is None for p in mid.parameters()), "I must not touch .grad"
    stage.backward_weight(0)
    ref = make_stages(3)[1]
    xr, sr = x.detach().requires_grad_(), skip.detach().requires_grad_()
    out = ref(x=xr, skip=sr, ids=ids)
    torch.autograd.backward([out["x"], out["skip"]], [grads["x"], grads["skip"]])
    assert torch.allclose(input_grads["x"], xr.grad) and torch.allclose(
        input_grads["skip"], sr.grad
    )
    for (n, p), pr in zip(mid.named_parameters(), ref.parameters(), strict=True):
        assert (p.grad is None) == (pr.grad is None), n
        if p.grad is not None:
            assert torch.allclose(p.grad, pr.grad, atol=1e-6), n


def test_chrome_trace_export(tmp_path) -> None:
    sch = schedule("zb-h1", 2, 4)
    pipe = LocalPipeline(make_stages(2), sch, loss_fn)
    pipe.step(*batch(8))
    doc = pipe.trace.to_chrome(tmp_path / "t.json")
    loaded = json.loads((tmp_path / "t.json").read_text())
    assert loaded == json.loads(json.dumps(doc))
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert sorted(e["name"] for e in spans) == sorted(
        str(a) for actions in sch.program.values() for a in actions
    )
    assert all(e["dur"] >= 0 for e in spans)


def test_scale_grads_false_sums_the_microbatch_losses() -> None:
    sch = schedule("zb-h2", 2, 4)
    mods = make_stages(2)
    x, y = batch(8)
    _, expected = oracle(mods, x, y)  # gradients of the mean over microbatches
    LocalPipeline(mods, sch, loss_fn, scale_grads=False).step(x, y)
    summed = [{n: None if g is None else 4 * g for n, g in d.items()} for d in expected]
    assert_grads_match(mods, summed, "scale_grads=False", atol=4e-6)


class _LinearTanh(nn.Module):
    """Autograd saves the Linear's input (for the weight grad) and tanh's output: 2 B*d floats."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x: torch.Tensor | None = None, h: torch.Tensor | None = None) -> dict:
        return {"h": torch.tanh(self.lin(x if x is not None else h))}


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "zb-v"])
def test_activation_bytes_are_what_autograd_saves(name: str) -> None:
    rows, d, m = 4, 8, 4
    sch = schedule(name, 2, m)
    mods = [_LinearTanh(d) for _ in range(sch.num_stages)]
    per_microbatch = 2 * (rows // m) * d * 4  # input + tanh output, float32, per microbatch
    pipe = LocalPipeline(mods, sch, lambda out, y: out["h"].pow(2).mean())
    pipe.step({"x": torch.randn(rows, d)}, torch.zeros(rows))
    # in rank shares: one is a microbatch through all v of the rank's stages (here each
    # stage saves per_microbatch bytes, so a share is v times that)
    v = sch.num_stages // sch.pp
    counts = pipe.trace.peak_memory
    assert pipe.trace.peak_bytes == [c * v * per_microbatch for c in counts]
    # a second step reuses the count made on the first forward with these shapes
    pipe.step({"x": torch.randn(rows, d)}, torch.zeros(rows))
    assert pipe.trace.peak_bytes == [c * v * per_microbatch for c in counts]
    # the stage drops them with the microbatch
    stage = pipe.stages[0]
    assert stage.held_activation_bytes == 0
    stage.forward(0, {"x": torch.randn(1, d)})
    assert stage.held_activation_bytes == 2 * d * 4
    stage.reset()
    assert stage.held_activation_bytes == 0


def test_a_torch_profiler_trace_shows_every_action_by_name() -> None:
    sch = schedule("zb-h1", 2, 4)
    pipe = LocalPipeline(make_stages(sch.num_stages), sch, loss_fn)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        pipe.step(*batch(8))
    names = [e.name for e in prof.events()]
    actions = [str(a) for prog in sch.program.values() for a in prog]
    assert sorted(n for n in names if n in set(actions)) == sorted(actions)  # each once
