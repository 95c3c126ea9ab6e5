"""`planner.transformer.profile_transformer`: closed forms against HF's own parameter counts
and against `planner.profile`'s measured bytes of small HF models (float32 on the CPU, SDPA),
the checkpointing and MoE rules, the errors, and `predict` on the result."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from zbkit import hf, planner  # noqa: E402
from zbkit.planner.predict import predict  # noqa: E402
from zbkit.planner.transformer import profile_transformer  # noqa: E402

B, S, V = 2, 128, 512  # activations far above the allocator's rounding
SMALL = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=V, max_position_embeddings=S)  # fmt: skip
LLAMA_7B = dict(model_type="llama", num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                num_key_value_heads=32, intermediate_size=11008, vocab_size=32000,
                tie_word_embeddings=False)  # fmt: skip
DEVICE = dict(device_tflops=100.0, bandwidth=1e10)


def _config(name: str):
    if name == "gpt2":
        return transformers.GPT2Config(vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=S,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    extra: dict = {
        "llama": {},
        "llama-tied": {"tie_word_embeddings": True},
        "qwen2": {},
        "mistral": {"sliding_window": S // 2},  # shorter than the sequence: a mask
        "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=0.0),
        "qwen2-moe": dict(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=96,
            shared_expert_intermediate_size=128,
        ),  # fmt: skip
    }[name]
    family = {"llama": "Llama", "llama-tied": "Llama", "qwen2": "Qwen2", "mistral": "Mistral",
              "mixtral": "Mixtral", "qwen2-moe": "Qwen2Moe"}[name]  # fmt: skip
    config = getattr(transformers, f"{family}Config")(**SMALL, **extra)
    config._attn_implementation = "sdpa"  # HF's default; what the closed forms count
    return config


def _model(config):
    torch.manual_seed(0)
    if config.model_type == "gpt2":
        return transformers.GPT2LMHeadModel(config)
    return transformers.AutoModelForCausalLM.from_config(config)


_MEASURED: dict[tuple[str, str], planner.Profile] = {}


def _measured(name: str, dtype: str = "float32") -> planner.Profile:
    """`planner.profile` of the HF model on one microbatch (cached: a few seconds each)."""
    if (name, dtype) not in _MEASURED:
        model = _model(_config(name)).to(getattr(torch, dtype))
        ids = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(1))
        sample = ({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, ids)
        loss = hf.TokenMeanLoss(ids)
        _MEASURED[name, dtype] = planner.profile(hf.layers(model), sample, loss_fn=loss, repeats=1)
    return _MEASURED[name, dtype]


def _closed(name: str, **kwargs) -> planner.Profile:
    args = dict(microbatch=B, seq=S, dtype="float32", **DEVICE) | kwargs
    return profile_transformer(_config(name), **args)


# ---- parameters ---------------------------------------------------------------------------


def test_llama_2_7b_has_hfs_parameter_count_from_a_dict_and_a_config_json(tmp_path):
    prof = profile_transformer(LLAMA_7B, microbatch=1, seq=4096, **DEVICE)
    assert sum(x.params for x in prof.layers) == 6_738_415_616
    assert len(prof) == 32 + 3 and prof.dtype == "bfloat16"
    assert sum(x.param_bytes for x in prof.layers) == 2 * 6_738_415_616
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_7B))
    again = profile_transformer(path, microbatch=1, seq=4096, **DEVICE)
    assert again == prof
    assert profile_transformer(str(path), microbatch=1, seq=4096, **DEVICE) == prof


@pytest.mark.parametrize(
    "name", ["llama", "llama-tied", "qwen2", "mistral", "gpt2", "mixtral", "qwen2-moe"]
)
def test_parameters_counted_as_hf_counts_them(name):
    model = _model(_config(name))
    prof = _closed(name)
    counted = sum(x.params for x in prof.layers) - sum(
        x.params for x in prof.layers if x.shared
    )  # a tied head's weight is the embedding's
    assert counted == sum(p.numel() for p in model.parameters())
    for closed, layer in zip(prof.layers, hf.layers(model), strict=True):
        assert closed.params == sum(p.numel() for p in layer.parameters())


# ---- bytes against a measured profile -----------------------------------------------------

EXACT = ("params", "param_bytes", "grad_bytes", "optimizer_bytes", "output_bytes", "shared")


@pytest.mark.parametrize(
    ("name", "dtype"),
    [("llama", "float32"), ("llama-tied", "float32"), ("gpt2", "float32"),
     ("mistral", "float32"), ("mixtral", "float32"), ("qwen2-moe", "float32"),
     # bfloat16: the RMSNorms' float32 copies, the loss's float32 log-softmax (on the CPU
     # a LayerNorm keeps its mean and rstd in bfloat16, where CUDA's, counted, are float32:
     # GPT-2's final norm measures 3% under)
     ("llama", "bfloat16"), ("gpt2", "bfloat16"), ("mistral", "bfloat16"),
     ("mixtral", "bfloat16")],
)  # fmt: skip
def test_bytes_match_a_measured_profile(name, dtype):
    measured, closed = _measured(name, dtype), _closed(name, dtype=dtype)
    assert len(closed) == len(measured) == SMALL["num_hidden_layers"] + 3
    assert closed.sample == measured.sample and closed.dtype == measured.dtype
    for got, want in zip(closed.layers, measured.layers, strict=True):
        assert got.name == want.name
        for field in EXACT:
            assert getattr(got, field) == getattr(want, field), (want.name, field)
        for field in ("activation_bytes", "weight_state_bytes"):
            ratio = getattr(got, field) / getattr(want, field)
            assert abs(ratio - 1) < 0.05, (want.name, field, ratio)


def test_a_tied_heads_shared_entry_is_the_measured_one():
    for name in ("llama-tied", "gpt2"):
        head = _closed(name).layers[-1]
        assert head.shared == _measured(name).layers[-1].shared
        weight = V * 64 * 4
        assert head.shared == ((0, weight, 2 * weight + 4),)  # Adam's moments and its step
    assert _closed("llama").layers[-1].shared == ()


# ---- checkpointing, experts, times --------------------------------------------------------


def test_full_checkpointing_keeps_a_decoders_output_and_recomputes_its_forward():
    plain, full = _closed("llama"), _closed("llama", checkpointing="full")
    hidden = B * S * 64 * 4
    for a, b in zip(plain.layers[1:-2], full.layers[1:-2], strict=True):
        assert b.activation_bytes == hidden < a.activation_bytes / 10
        assert b.weight_state_bytes == a.weight_state_bytes  # W needs what it did
        assert b.input_grad.median == pytest.approx(a.input_grad.median + a.forward.median)
        assert b.forward == a.forward and b.weight_grad == a.weight_grad
    for i in (0, -2, -1):  # the embedding, the norm and the head are not checkpointed
        assert full.layers[i] == plain.layers[i]


def test_experts_count_their_parameters_and_top_k_scales_their_activations():
    def decoder(**changes):
        config = _config("mixtral").to_dict() | changes
        return profile_transformer(config, microbatch=B, seq=S, dtype="float32", **DEVICE).layers[1]

    h, i = 64, 160
    four, eight = decoder(), decoder(num_local_experts=8)
    assert eight.params - four.params == 4 * 3 * h * i + 4 * h  # experts and the router's rows
    one, two, three = (decoder(num_experts_per_tok=k) for k in (1, 2, 3))
    per_expert = two.activation_bytes - one.activation_bytes
    assert three.activation_bytes - two.activation_bytes == per_expert
    assert per_expert > B * S * 4 * (2 * h + 4 * i)  # its input, gate-and-up, SiLU, product...
    assert two.forward.median - one.forward.median == pytest.approx(
        2 * B * S * 3 * h * i / (DEVICE["device_tflops"] * 1e12)
    )
    assert one.params == two.params  # top-k changes the work, not the weights


def test_times_are_the_flops_at_the_devices_rate():
    prof = _closed("llama", efficiency=0.5)
    rate = DEVICE["device_tflops"] * 1e12 * 0.5
    h, kv, i, t = 64, 32, 160, B * S
    matmul = 2 * t * (h * h + 2 * h * kv + h * h + 3 * h * i)
    attention = 2 * B * S * S * h  # causal: half of 4 b s^2 h
    decoder = prof.layers[1]
    assert decoder.forward.median == pytest.approx((matmul + attention) / rate)
    assert decoder.input_grad.median == pytest.approx((matmul + 2 * attention) / rate)
    assert decoder.weight_grad.median == pytest.approx(matmul / rate)
    assert prof.layers[-1].forward.median == pytest.approx(2 * t * h * V / rate)
    assert all(x.step.median > 0 for x in prof.layers)


def test_dtype_and_optimizer_set_the_bytes():
    f32, bf16 = _closed("llama"), _closed("llama", dtype="bfloat16")
    assert bf16.dtype == "bfloat16" and f32.dtype == "float32"
    assert bf16 == _closed("llama", dtype=torch.bfloat16)  # a torch dtype names it too
    for a, b in zip(f32.layers, bf16.layers, strict=True):
        assert b.param_bytes * 2 == a.param_bytes and b.grad_bytes == b.param_bytes
    sgd, momentum = _closed("llama", optimizer="sgd"), _closed("llama", optimizer="sgd-momentum")
    assert all(x.optimizer_bytes == 0 for x in sgd.layers)
    assert all(x.optimizer_bytes == x.param_bytes for x in momentum.layers)
    assert sgd.optimizer == "sgd" and sgd.bandwidth == DEVICE["bandwidth"]


# ---- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(config={k: v for k, v in LLAMA_7B.items() if k != "hidden_size"}),
         "no hidden_size \\(or n_embd\\)"),
        (dict(config={k: v for k, v in LLAMA_7B.items() if k != "vocab_size"}), "no vocab_size"),
        (dict(config="/nonexistent/config.json"), "no config.json at '/nonexistent/config.json'"),
        (dict(checkpointing="selective"), "checkpointing is 'none' or 'full'"),
        (dict(dtype="int8"), "unknown dtype 'int8'"),
        (dict(device_tflops=0), "device_tflops must be a number > 0"),
        (dict(device_tflops=-1.0), "device_tflops must be a number > 0"),
        (dict(bandwidth=-5), "bandwidth must be a number > 0"),
        (dict(microbatch=0), "microbatch must be an int >= 1"),
        (dict(seq=2.5), "seq must be an int >= 1"),
        (dict(optimizer="lamb"), "unknown optimizer 'lamb'"),
        (dict(efficiency=1.5), "efficiency is a share in \\(0, 1\\]"),
    ],
)  # fmt: skip
def test_each_bad_argument_has_one_clear_error(change, message):
    args = dict(config=LLAMA_7B, microbatch=1, seq=128, **DEVICE) | change
    with pytest.raises(ValueError, match=message) as info:
        profile_transformer(args.pop("config"), **args)
    assert "\n" not in str(info.value) and str(info.value).startswith("profile_transformer: ")


def test_a_config_of_another_kind_is_a_type_error():
    with pytest.raises(TypeError, match="a dict, an HF PretrainedConfig or the path"):
        profile_transformer(42, microbatch=1, seq=8, **DEVICE)


# ---- the profile in use -------------------------------------------------------------------


def test_predict_and_json_take_the_closed_form_profile():
    prof = profile_transformer(LLAMA_7B, microbatch=1, seq=4096, **DEVICE)
    pred = predict(prof, "1f1b", pp=2, microbatches=4)
    assert pred.step_seconds > 0 and len(pred.ranks) == 2
    assert all(r.peak_bytes > r.parameters > 0 for r in pred.ranks)
    assert planner.Profile.from_json(prof.to_json()) == prof
    # the V holds the tied embedding and head on rank 0: their weight counted once
    tied = _closed("llama-tied")
    v = predict(tied, "zb-v", pp=2, microbatches=4)
    weight = V * 64 * 4
    ends = [i for s, part in enumerate(v.stages) if s in (0, 3) for i in part]
    assert v.ranks[0].parameters == sum(tied.layers[i].param_bytes for i in ends) - weight
