"""The exercises of notebook 09, each checker against an answer worked out here: the 7B's
parameters counted by HF itself on the meta device (09.1); the fastest candidate that fits
40 GB, picked from the plan's rows (09.2); the V's rank 0 read from the stage-to-rank rule,
stages 0 and 2p - 1 (09.3)."""

from __future__ import annotations

import pytest
import torch

from zbkit import planner
from zbkit.exercises import check
from zbkit.exercises._nb09 import LLAMA_7B, llama_7b


def test_09_1_the_parameter_count_is_hfs_own():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(**{k: v for k, v in LLAMA_7B.items() if k != "model_type"})
    with torch.device("meta"):  # the shapes only: no 27 GB allocated
        model = transformers.LlamaForCausalLM(config)
    want = sum(p.numel() for p in model.parameters())
    assert want == 6_738_415_616
    assert check("09.1", want).right
    assert not check("09.1", 7_000_000_000).right
    assert "rounded" in check("09.1", 7_000_000_000).why
    assert not check("09.1", want + 4096).right
    assert not check("09.1", "seven billion").right


def test_09_2_the_choice_is_the_fastest_row_that_fits():
    found = planner.plan(llama_7b(), world=8, global_batch=64, memory="40GB")
    fitting = [
        c for c in found.candidates
        if c.prediction is not None and max(r.peak_bytes for r in c.prediction.ranks) <= 40e9
    ]  # fmt: skip
    want = min(fitting, key=lambda c: c.step_seconds).schedule
    assert check("09.2", want).right
    chosen = min(fitting, key=lambda c: c.step_seconds)
    faster = [c for c in found.candidates
              if c.prediction is not None and c.step_seconds < chosen.step_seconds]  # fmt: skip
    assert f"{len(faster)} faster ones hold more than 40 GB" in check("09.2", want).why
    other = next(c.schedule for c in fitting if c.schedule != want)
    wrong = check("09.2", other)
    assert not wrong.right and "another schedule that fits is faster" in wrong.why
    built = {c.schedule for c in found.candidates if c.prediction is not None}
    too_big = sorted(built - {c.schedule for c in fitting})
    assert too_big, "some schedule must not fit 40 GB, or the budget teaches nothing"
    wrong = check("09.2", too_big[0])
    assert not wrong.right and "ranks only what fits" in wrong.why
    assert "is not one of the schedules" in check("09.2", "zb-h3").why


def test_09_3_rank_0_holds_the_first_and_last_stage():
    prof = llama_7b()
    part = planner.partition(prof, 16, placement="v", pp=8)
    held = [*part.stages[0], *part.stages[15]]  # a V: rank r holds stages r and 2p - 1 - r
    decoders = [i for i in held if prof.layers[i].name.endswith("DecoderLayer")]
    assert check("09.3", len(decoders)).right
    # the why: one decoder more on another rank would be slower than rank 0 with both ends
    one = prof.layers[1]
    per_decoder = one.forward.median + one.input_grad.median + one.weight_grad.median
    assert (len(decoders) + 1) * per_decoder > part.seconds[0] == part.slowest
    why = check("09.3", len(decoders)).why
    assert f"{(len(decoders) + 1) * per_decoder * 1e3:.1f} ms, slower still" in why
    assert "taking a decoder off it" in check("09.3", len(decoders) - 1).why
    assert not check("09.3", len(held)).right  # the embedding and the head are not decoders
    assert not check("09.3", 2.0).right
