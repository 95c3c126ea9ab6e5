"""Hugging Face models cut into stages, under every schedule, against plain autograd.

Issue 32: no wrong gradient without an error, on any model and any schedule. Each model
is built from a tiny config (hf_models.py), run by ``LocalPipeline`` with ``check_split``
(each stage's split backward checked against its whole backward), and every parameter's
``.grad`` is compared with the oracle: a deepcopy of the same stages, run microbatch by
microbatch in one process, ``(sum of the microbatch losses / m).backward()``. The copy keeps
tied weights tied (one deepcopy of the list), so a tied embedding's gradient is the sum of
what the first and the last stage give it, in both runs.
"""

from __future__ import annotations

import copy
import itertools
from contextlib import nullcontext
from typing import Any

import pytest
import torch
from hf_models import DECODERS, MICROBATCHES, MODELS, Case, build
from pipeline_models import schedule
from torch import nn

from zbkit.pipeline import LocalPipeline

SCHEDULES = ("1f1b", "zb-h1", "zb-h2", "zb-v", "interleaved-zb", "dualpipev", "zb-auto")
# |pipeline - oracle| <= TOL * the largest |oracle gradient| of that parameter: both runs
# do the same operations per microbatch, only the sums over microbatches are ordered
# differently (measured: at most 2.5e-7); a wrong gradient (a term missed or counted
# twice) is off by far more. bf16 autocast is as tight: see `oracle`
TOL = 1e-6


def chunks(batch: Any, m: int) -> list[Any]:
    if isinstance(batch, tuple):
        return list(zip(*(b.chunk(m) for b in batch), strict=True))
    return list(batch.chunk(m))


def chain(stages: list[nn.Module], inputs: Any) -> Any:
    """One microbatch through every stage, each called as the pipeline calls it."""
    out = inputs
    for stage in stages:
        if isinstance(out, dict):
            out = stage(**out)
        else:
            out = stage(*out) if isinstance(out, tuple) else stage(out)
    return out


def oracle(case: Case, dtype: torch.dtype | None = None) -> tuple[list, list[dict]]:
    """Plain autograd on a copy: (the microbatch losses, each stage's gradients by name).

    Under autocast each microbatch gets its own autocast region: within one, every use of
    a weight shares one cached bf16 copy, and the backward would sum the microbatches'
    gradients in bf16 (6e-3 off); the pipeline's per-microbatch backwards sum in float32.
    """
    stages = copy.deepcopy(case.stages)
    m = MICROBATCHES
    losses = []
    for x, y in zip(chunks(case.inputs, m), case.target.chunk(m), strict=True):
        with autocast(dtype):  # a region per microbatch: see above
            losses.append(case.loss_fn(chain(stages, x), y))
    (sum(losses) / m).backward()
    return [loss.detach() for loss in losses], [
        {n: p.grad for n, p in s.named_parameters()} for s in stages
    ]


def autocast(dtype: torch.dtype | None) -> Any:
    return nullcontext() if dtype is None else torch.autocast("cpu", dtype=dtype)


def compare(case: Case, expected: list[dict], tol: float, where: str) -> float:
    """Every parameter's .grad against the oracle's; returns the largest relative error."""
    worst = 0.0
    for s, (stage, exp) in enumerate(zip(case.stages, expected, strict=True)):
        for n, p in stage.named_parameters():
            if exp[n] is None:
                assert p.grad is None, f"{where}: stage {s} {n} got a gradient, oracle has none"
                continue
            assert p.grad is not None, f"{where}: stage {s} {n} has no gradient"
            scale = exp[n].abs().max().item()
            err = (p.grad - exp[n]).abs().max().item()
            assert err <= tol * scale + 1e-12, (
                f"{where}: stage {s} {n} differs by {err:.3g} (largest gradient {scale:.3g})"
            )
            worst = max(worst, err / scale if scale else 0.0)
    return worst


def run(name: str, sched: str, attn: str = "sdpa", dtype: torch.dtype | None = None) -> Case:
    """``name`` under ``sched`` (pp=2) with check_split, checked against the oracle."""
    sch = schedule(name=sched, pp=2, m=MICROBATCHES)
    case = build(name, sch.num_stages, attn)
    return check(case, sch, f"{name} {sched} {attn}", dtype)


def check(case: Case, sch: Any, where: str, dtype: torch.dtype | None = None) -> Case:
    want_losses, expected = oracle(case, dtype)
    pipe = LocalPipeline(case.stages, sch, case.loss_fn, check_split=True)
    with autocast(dtype):
        losses = pipe.step(case.inputs, target=case.target)
    assert torch.allclose(torch.stack(losses), torch.stack(want_losses), rtol=TOL, atol=0)
    compare(case, expected, TOL, where)
    return case


# every model on every schedule: the tiny models make it cheap (each step is milliseconds)
@pytest.mark.parametrize("sched", SCHEDULES)
@pytest.mark.parametrize("name", MODELS)
def test_hf_model_in_a_pipeline_equals_plain_autograd(name: str, sched: str) -> None:
    run(name, sched)


@pytest.mark.parametrize("name", ["gpt2", "llama-tied", "mistral", "bert", "t5", "vit"])
def test_eager_attention(name: str) -> None:
    run(name, "zb-v", attn="eager")


@pytest.mark.parametrize("name", ["llama-tied", "mixtral", "gpt2", "bert", "t5", "vit"])
def test_non_reentrant_checkpointing_inside_a_stage(name: str) -> None:
    sch = schedule("zb-v", 2, MICROBATCHES)
    case = build(name, sch.num_stages)
    case.model.activation_checkpointing_enable({"use_reentrant": False})
    layer = next(m for m in case.stages[1].modules() if getattr(m, "gradient_checkpointing", 0))
    calls = [0]
    layer.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    check(case, sch, f"{name} checkpointed")
    assert calls[0] > MICROBATCHES, "the checkpoint never recomputed its forward"


@pytest.mark.parametrize("name", ["llama-tied", "mixtral"])
def test_bf16_autocast(name: str) -> None:
    run(name, "zb-v", dtype=torch.bfloat16)


@pytest.mark.parametrize("experts", ["eager", "batched_mm"])
@pytest.mark.parametrize("name", ["mixtral", "qwen2-moe"])
def test_moe_experts_implementations(name: str, experts: str) -> None:
    sch = schedule("zb-v", 2, MICROBATCHES)
    case = build(name, sch.num_stages)
    case.model.config._experts_implementation = experts
    check(case, sch, f"{name} experts={experts}")


@pytest.mark.parametrize("name", MODELS)
def test_the_stages_compute_what_the_hf_model_computes(name: str) -> None:
    case = build(name, 4)
    with torch.no_grad():
        got, want = chain(case.stages, case.inputs), case.hf_logits()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", [*DECODERS, "gpt2", "bert", "albert", "t5"])
def test_the_padding_mask_is_none_in_some_microbatches_only(name: str) -> None:
    case = build(name, 2)
    key = "pad" if name == "t5" else "mask"
    masks = [chain(case.stages[:1], x)[key] for x in chunks(case.inputs, MICROBATCHES)]
    # sliding-window attention always needs a mask tensor
    expect = [True] * 4 if name == "mistral" else [False, True, False, True]
    assert [m is not None for m in masks] == expect


def test_shared_weights_are_one_parameter_in_several_stages() -> None:
    """What the oracle's tied gradients rely on: one Parameter, several stages."""
    for name, stages in itertools.product(["llama-tied", "gpt2", "bert", "t5"], [2, 4]):
        case = build(name, stages)
        first, last = (set(map(id, s.parameters())) for s in (case.stages[0], case.stages[-1]))
        assert first & last, name
    case = build("albert", 4)
    shared = set.intersection(*(set(map(id, s.parameters())) for s in case.stages))
    assert len(shared) > 10  # the layer group's weights are in all four stages
