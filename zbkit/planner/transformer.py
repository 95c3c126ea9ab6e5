"""`profile_transformer(config, ...)`: a decoder-only transformer's `Profile` from closed forms.

No model is built and nothing is run: each layer's bytes and seconds are counted from the
config, for the layers `zbkit.hf.layers(model)` makes (the embedding, the N decoder layers,
the final norm, the LM head: N + 3), in the Llama family (Llama, Mistral, Qwen2, Mixtral,
Qwen2-MoE: RMSNorm without bias, rotary positions, a gated SiLU MLP of three matrices,
top-k experts) and GPT-2 (LayerNorm with bias, learned positions, biases, a GELU MLP of two
matrices, a tied head). T = microbatch x seq tokens, d the dtype's bytes, H the hidden size.

Parameters: every matrix, bias and norm weight, as HF counts them (the 3-D expert tensors
one tensor each); gradients the same bytes; the optimizer's state as torch keeps it (Adam:
two moments in the parameter's dtype and a 4-byte `step` tensor per parameter tensor;
SGD with momentum: one buffer; plain SGD: nothing). A tied head holds the embedding's
weight again, named in `shared` as `profile` names it.

Activations (held from F until I: what autograd saves, and the output), counted tensor by
tensor as HF's layers save them with SDPA (torch's flash kernel, CPU or CUDA: q, k, v, the
output and a float32 logsumexp per head; k and v at their own kv heads, HF's GQA path), per
token: each RMSNorm its input in float32 (a float32 input is the tensor itself), 4 bytes
of rsqrt, the normed and the scaled output (d H each); a LayerNorm its mean and rstd (8
bytes) and its output; q and k after the rotary embedding, v, the attention's output; the
residual sum; the MLP's gate, SiLU, up and product (GPT-2: the fc output, gelu_new's four
saved tensors and its output; torch's own GELU two); the layer's output. The rotary cos
and sin (2 x seq x head_dim, made in each decoder layer) too. An expert sees top-k of the
tokens: per token and chosen expert, its gathered input, gate-and-up, SiLU, product and
down outputs, its routing weight and index; the router its float32 softmax and top-k
indices. The head: the logits and the loss's float32 log-softmax (`hf.TokenMeanLoss`
upcasts). The embedding: its output. Assumed: no padding (HF then passes no mask and SDPA
runs causal; a padded batch adds a mask and repeats k and v, as Mistral's sliding window
does where it is shorter than the sequence: that case is counted, a b x seq^2 mask in the
dtype and k and v at every head), dropout off.

W state (held from I until W, zbkit's split backward): each weighted op's input (the
activation its weight gradient multiplies) and the gradient of its output; a LayerNorm's
parameter gradients (made in I). With `checkpointing="full"` a decoder layer keeps only its
output from F until I, and I runs F again (its seconds added to I) before its backward:
what W needs is the same.

Seconds: FLOPs at `device_tflops x efficiency`. F: 2 T per matrix element (an expert's
times top-k) and the causal attention's score and value products, 2 x b x seq^2 x heads x
head_dim (half of the full 4 b seq^2 h: the masked half is skipped). I: the matrices' input
gradients (as F) and attention's backward (twice its forward). W: the matrices' weight
gradients (as F); attention has no weights. The embedding and the norms do no matrix work:
their seconds are their bytes at the memory's bandwidth, as is the optimizer's step (it
reads the parameters, gradients and state and writes the parameters and state).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from os import PathLike
from pathlib import Path
from typing import Any

from zbkit.planner.profile import OPTIMIZERS, LayerProfile, Profile, Timing

__all__ = ["profile_transformer"]

DTYPES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
CHECKPOINTING = ("none", "full")
# FLOPs per byte of memory bandwidth where `memory_bandwidth` is not given: about an
# H100's (989 TFLOPS bf16 dense, 3.35 TB/s) and near an A100's and H200's
FLOPS_PER_BYTE = 300.0
F32, INT64 = 4, 8
QWEN = ("qwen2", "qwen2_moe")  # q, k and v biased, o not


@dataclass(frozen=True)
class Shape:
    """The decoder's dimensions, read from its config (`_shape`)."""

    gpt2: bool
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    positions: int  # GPT-2's learned positions (n_positions); 0: rotary
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    gelu_new: bool  # GPT-2's tanh GELU written out (five saved tensors); else torch's own
    experts: int  # 0: dense MLPs
    top_k: int
    expert_intermediate: int
    shared_intermediate: int  # Qwen2-MoE's shared expert; 0: none
    normalize_top_k: bool
    sparse: tuple[bool, ...]  # per decoder layer: experts (True) or a dense MLP
    window: int | None  # Mistral's sliding window (`hf.layers` masks it); None: none


@dataclass(frozen=True)
class Matrix:
    """A weight matrix: `fan_in` x `fan_out`, `copies` of it (experts), each token through
    `rows` of them (top-k)."""

    fan_in: int
    fan_out: int
    bias: bool = False
    copies: int = 1
    rows: int = 1

    @property
    def params(self) -> int:
        return self.copies * (self.fan_in * self.fan_out + self.bias * self.fan_out)

    @property
    def tensors(self) -> int:
        return 1 + self.bias

    def flops(self, tokens: int) -> int:
        """One pass over `tokens` (F, or I's input gradient, or W's weight gradient)."""
        return 2 * tokens * self.rows * self.fan_in * self.fan_out


def profile_transformer(
    config: Any,
    *,
    microbatch: int,
    seq: int,
    dtype: Any = "bfloat16",
    device_tflops: float,
    bandwidth: float | None,
    checkpointing: str = "none",
    optimizer: str = "adam",
    efficiency: float = 1.0,
    memory_bandwidth: float | None = None,
) -> Profile:
    """The `Profile` of a decoder-only transformer on one microbatch of `microbatch` x `seq`
    tokens, from closed forms (module docstring), its layers those of `zbkit.hf.layers`.

    `config`: a dict, an HF `PretrainedConfig` or the path of a `config.json`. `dtype`: the
    parameters' and activations' ("bfloat16", "float16", "float32"). `device_tflops`: the
    device's dense TFLOPS in that dtype, `efficiency` the share of them reached (0 to 1).
    `bandwidth`: bytes/s between data-parallel replicas (the profile's, for `plan`'s
    all-reduce; None: none given). `checkpointing`: "none" or "full" (each decoder layer
    recomputed in I). `optimizer`: a name of `OPTIMIZERS`. `memory_bandwidth`: the device
    memory's bytes/s, for the embedding's, the norms' and the optimizer step's seconds
    (None: `device_tflops` x 1e12 / 300, about an H100's ratio)."""
    fields, where = _read(config)
    shape = _shape(fields, where)
    size = _check(microbatch, seq, dtype, device_tflops, bandwidth, checkpointing, optimizer,
                  efficiency, memory_bandwidth)  # fmt: skip
    flops = device_tflops * 1e12 * efficiency
    memory = (
        memory_bandwidth if memory_bandwidth is not None else device_tflops * 1e12 / FLOPS_PER_BYTE
    )
    costs = _Costs(shape, microbatch, seq, size, flops, memory, optimizer)
    layers = [costs.embedding()]
    layers += [costs.decoder(i, checkpointing == "full") for i in range(shape.layers)]
    layers += [costs.norm(shape.layers + 1), costs.head(shape.layers + 2)]
    ids = {"shape": [microbatch, seq], "dtype": "int64"}
    return Profile(
        tuple(layers), "cuda", _dtype_name(dtype), {"input_ids": ids, "attention_mask": dict(ids)},
        optimizer, 1, bandwidth,
    )  # fmt: skip


# ---- the config ---------------------------------------------------------------------------


def _read(config: Any) -> tuple[dict[str, Any], str]:
    """The config's fields as a dict, and how to name it in an error."""
    if isinstance(config, str | PathLike):
        path = Path(config)
        if not path.is_file():
            raise ValueError(f"profile_transformer: no config.json at {str(path)!r}")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"profile_transformer: {str(path)!r} is not JSON: {err}") from err
        if not isinstance(data, dict):
            raise ValueError(f"profile_transformer: {str(path)!r} holds no JSON object")
        return data, str(path)
    if isinstance(config, Mapping):
        return dict(config), "the config dict"
    if hasattr(config, "to_dict"):  # an HF PretrainedConfig: its fields and their defaults
        return dict(config.to_dict()), f"the {type(config).__name__}"
    raise TypeError(
        "profile_transformer: config is a dict, an HF PretrainedConfig or the path of a "
        f"config.json, got {type(config).__name__}"
    )


def _field(fields: dict, where: str, *names: str, default: Any = None, what: str = "") -> Any:
    """The first of `names` the config holds; none and no default: a ValueError naming them."""
    for name in names:
        if fields.get(name) is not None:
            return fields[name]
    if default is not None:
        return default
    either = f"{names[0]} (or {', '.join(names[1:])})" if len(names) > 1 else names[0]
    raise ValueError(f"profile_transformer: {where} has no {either}: give {what}")


def _count(fields: dict, where: str, *names: str, what: str, default: Any = None) -> int:
    value = _field(fields, where, *names, default=default, what=what)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"profile_transformer: {where}'s {names[0]} is {value!r}: give {what}")
    return value


def _shape(fields: dict, where: str) -> Shape:
    gpt2 = fields.get("model_type") == "gpt2" or "n_embd" in fields

    def count(*names: str, what: str, default: int | None = None) -> int:
        return _count(fields, where, *names, what=what, default=default)

    hidden = count("hidden_size", "n_embd", what="the decoder's width")
    heads = count("num_attention_heads", "n_head", what="the attention's head count")
    if hidden % heads and fields.get("head_dim") is None:
        raise ValueError(f"profile_transformer: {where}'s hidden size {hidden} is not a multiple "
                         f"of its {heads} heads: give head_dim")  # fmt: skip
    experts = fields.get("num_local_experts") or fields.get("num_experts") or 0
    intermediate = count("intermediate_size", "n_inner", what="the MLP's width",
                         default=4 * hidden if gpt2 else None)  # fmt: skip
    layers = count("num_hidden_layers", "n_layer", what="the number of decoder layers")
    kind = fields.get("model_type", "")
    top_k = count("num_experts_per_tok", what="the experts per token", default=2) if experts else 0
    shared = fields.get("shared_expert_intermediate_size") or 0 if kind == "qwen2_moe" else 0
    return Shape(
        gpt2=gpt2,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=count("num_key_value_heads", what="the kv heads", default=heads),
        head_dim=count("head_dim", what="the head width", default=hidden // heads),
        intermediate=intermediate,
        vocab=count("vocab_size", what="the vocabulary's size"),
        tied=bool(fields.get("tie_word_embeddings", gpt2)),  # HF's default: GPT-2 ties
        positions=count("n_positions", what="GPT-2's positions") if gpt2 else 0,
        qkv_bias=gpt2 or _qkv_bias(fields, kind),
        o_bias=gpt2 or (kind not in QWEN and bool(fields.get("attention_bias"))),
        mlp_bias=gpt2 or bool(fields.get("mlp_bias")),
        gelu_new=fields.get("activation_function", "gelu_new") == "gelu_new",
        experts=experts,
        top_k=top_k,
        expert_intermediate=fields.get("moe_intermediate_size") or intermediate,
        shared_intermediate=shared,
        # Mixtral normalizes the top-k weights; Qwen2-MoE where norm_topk_prob says so
        normalize_top_k=bool(fields.get("norm_topk_prob", kind != "qwen2_moe")),
        sparse=_sparse_layers(fields, layers, experts),
        window=fields.get("sliding_window") if kind == "mistral" else None,
    )


def _qkv_bias(fields: dict, kind: str) -> bool:
    """Qwen2's q, k and v have biases always, Qwen2-MoE's where qkv_bias (default) says so,
    the rest where attention_bias says so."""
    if kind == "qwen2":
        return True
    if kind == "qwen2_moe":
        return bool(fields.get("qkv_bias", True))
    return bool(fields.get("attention_bias"))


def _sparse_layers(fields: dict, layers: int, experts: int) -> tuple[bool, ...]:
    """Which decoder layers hold experts: every one in Mixtral; in Qwen2-MoE every
    `decoder_sparse_step`-th but `mlp_only_layers`."""
    if not experts:
        return (False,) * layers
    step = fields.get("decoder_sparse_step") or 1
    dense = set(fields.get("mlp_only_layers") or ())
    return tuple(i not in dense and (i + 1) % step == 0 for i in range(layers))


def _check(microbatch, seq, dtype, tflops, bandwidth, checkpointing, optimizer, efficiency,
           memory) -> int:  # fmt: skip
    """The arguments checked, one clear error each; the dtype's bytes."""
    for what, value in (("microbatch", microbatch), ("seq", seq)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"profile_transformer: {what} must be an int >= 1, got {value!r}")
    if _dtype_name(dtype) not in DTYPES:
        raise ValueError(f"profile_transformer: unknown dtype {dtype!r}: one of "
                         "bfloat16, float16, float32")  # fmt: skip
    for what, value in (("device_tflops", tflops), ("bandwidth", bandwidth),
                        ("memory_bandwidth", memory)):  # fmt: skip
        if value is None and what != "device_tflops":
            continue
        if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
            raise ValueError(f"profile_transformer: {what} must be a number > 0, got {value!r}")
    if not isinstance(efficiency, int | float) or not 0 < efficiency <= 1:
        raise ValueError(
            f"profile_transformer: efficiency is a share in (0, 1], got {efficiency!r}"
        )
    if checkpointing not in CHECKPOINTING:
        raise ValueError(f"profile_transformer: checkpointing is 'none' or 'full', got "
                         f"{checkpointing!r}")  # fmt: skip
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"profile_transformer: unknown optimizer {optimizer!r}: one of "
                         f"{', '.join(OPTIMIZERS)}")  # fmt: skip
    return DTYPES[_dtype_name(dtype)]


def _dtype_name(dtype: Any) -> str:
    """The dtype's name as `profile` writes it: bfloat16 for "torch.bfloat16" or a torch dtype."""
    return str(dtype).removeprefix("torch.")


# ---- the layers ---------------------------------------------------------------------------


class _Costs:
    """Each layer's `LayerProfile` for one shape, microbatch, dtype and device."""

    def __init__(self, shape: Shape, b: int, s: int, d: int, flops: float, memory: float,
                 optimizer: str) -> None:  # fmt: skip
        self.shape, self.b, self.s, self.d = shape, b, s, d
        self.tokens = b * s
        self.rate, self.memory, self.optimizer = flops, memory, optimizer

    # -- per layer

    def embedding(self) -> LayerProfile:
        sh, t, d = self.shape, self.tokens, self.d
        mats = [Matrix(sh.vocab, sh.hidden)] + (
            [Matrix(sh.positions, sh.hidden)] if sh.gpt2 else []
        )
        positions = self.s * INT64 if sh.gpt2 else 0  # GPT-2's arange ids, saved by wpe
        act = t * sh.hidden * d + positions
        weight_state = t * sh.hidden * d + positions  # the output's gradient and the ids
        moved = self._moved(act)
        # F: GPT-2's token and position embeddings before their sum; I: the output's gradient
        made = (t + self.s) * sh.hidden * d if sh.gpt2 else 0
        return self._layer("0: Embedding", mats, 0, act, weight_state, (moved, moved, moved),
                           extra=(made, t * sh.hidden * d, 0))  # fmt: skip

    def decoder(self, i: int, checkpointed: bool) -> LayerProfile:
        sh, t, d = self.shape, self.tokens, self.d
        sparse = sh.sparse[i]
        mats = self._attention() + (self._experts() if sparse else self._mlp())
        act, weight_state = self._decoder_bytes(sparse)
        attention = 2 * self.b * self.s**2 * sh.heads * sh.head_dim  # causal: half the products
        mm = sum(m.flops(t) for m in mats) / self.rate
        f, i_, w = mm + attention / self.rate, mm + 2 * attention / self.rate, mm
        extra = [*self._decoder_extras(), 0]
        if checkpointed:  # F keeps its output alone; I runs F again, holding all it saves
            extra[1] += act
            act, i_ = t * sh.hidden * d, i_ + f
        return self._layer(f"{i + 1}: DecoderLayer", mats, self._norm_tensors(2), act, weight_state,
                           (f, i_, w), extra=tuple(extra), norms=2)  # fmt: skip

    def norm(self, index: int) -> LayerProfile:
        sh, t, d = self.shape, self.tokens, self.d
        if sh.gpt2:  # LayerNorm: mean and rstd, the output; its weight's gradient made in I
            act, weight_state = t * (2 * F32 + sh.hidden * d), 2 * sh.hidden * d
        else:
            act, weight_state = t * self._rms(False), t * 2 * sh.hidden * d
        moved = self._moved(act)
        return self._layer(f"{index}: FinalNorm", [], self._norm_tensors(1), act, weight_state,
                           (moved, moved, moved), extra=self._norm_extras(), norms=1)  # fmt: skip

    def head(self, index: int) -> LayerProfile:
        sh, t, d = self.shape, self.tokens, self.d
        mats = [Matrix(sh.hidden, sh.vocab)]
        logits = t * sh.vocab * d
        act = logits + t * sh.vocab * F32  # and the loss's float32 log-softmax
        f = mats[0].flops(t) / self.rate
        layer = self._layer(f"{index}: LMHead", mats, 0, act, logits, (f, f, f),
                            extra=(t * sh.vocab * F32 * (d != F32), 2 * t * sh.vocab * F32, 0),
                            output=logits)  # fmt: skip
        if not sh.tied:
            return layer
        # the embedding's own weight: counted once where one rank holds both
        shared = ((0, layer.param_bytes, layer.optimizer_bytes),)
        return replace(layer, shared=shared)

    # -- the transient bytes: rough estimates (fitted to `profile`'s on the CPU within a
    # factor of about 1.5), where the held bytes above are counted tensor by tensor

    def _decoder_extras(self) -> tuple[int, int]:
        """F: an RMSNorm's float32 temporaries (or a hidden state, GPT-2's two); I: the
        gradients in flight through the MLP's widest part and the attention, and an
        RMSNorm's float32 backward."""
        sh, t, d = self.shape, self.tokens, self.d
        h = sh.hidden
        widest = max(sh.intermediate, sh.expert_intermediate * sh.top_k, h)
        upcast = d != F32 and not sh.gpt2
        forward = t * h * (2 * F32 if upcast else 2 * d if sh.gpt2 else d)
        backward = t * ((6 * h + 2 * widest) * d + 5 * F32 * h * upcast)
        return forward, backward

    def _norm_extras(self) -> tuple[int, int, int]:
        """F: an RMSNorm's float32 square (its variance in float32); I: its float32 backward
        (a LayerNorm's: two hidden states)."""
        sh, t, d = self.shape, self.tokens, self.d
        h = sh.hidden
        if sh.gpt2:
            return 0, 2 * t * h * d, 0
        if d == F32:
            return t * F32, 6 * t * h * F32, 0
        return t * h * F32, t * h * (5 * F32 + d), 0

    # -- the matrices

    def _attention(self) -> list[Matrix]:
        sh = self.shape
        q, kv = sh.heads * sh.head_dim, sh.kv_heads * sh.head_dim
        if sh.gpt2:  # c_attn makes q, k and v in one
            return [Matrix(sh.hidden, 3 * q, True), Matrix(q, sh.hidden, True)]
        return [Matrix(sh.hidden, q, sh.qkv_bias), Matrix(sh.hidden, kv, sh.qkv_bias),
                Matrix(sh.hidden, kv, sh.qkv_bias), Matrix(q, sh.hidden, sh.o_bias)]  # fmt: skip

    def _mlp(self) -> list[Matrix]:
        sh = self.shape
        h, i = sh.hidden, sh.intermediate
        if sh.gpt2:
            return [Matrix(h, i, True), Matrix(i, h, True)]
        return [Matrix(h, i, sh.mlp_bias), Matrix(h, i, sh.mlp_bias), Matrix(i, h, sh.mlp_bias)]

    def _experts(self) -> list[Matrix]:
        """The router, the experts' gate-and-up and down (one 3-D tensor each, each token
        through top-k of them), and Qwen2-MoE's shared expert and its gate."""
        sh = self.shape
        h, e, k, i = sh.hidden, sh.experts, sh.top_k, sh.expert_intermediate
        mats = [Matrix(h, e), Matrix(h, 2 * i, copies=e, rows=k), Matrix(i, h, copies=e, rows=k)]
        if sh.shared_intermediate:
            s = sh.shared_intermediate
            mats += [Matrix(h, s), Matrix(h, s), Matrix(s, h), Matrix(h, 1)]
        return mats

    def _norm_tensors(self, norms: int) -> int:
        return norms * (2 if self.shape.gpt2 else 1)

    # -- the bytes

    def _rms(self, new_input: bool) -> int:
        """What an RMSNorm saves per token, its output among it: its input in float32 (a
        float32 input is the tensor itself, counted here where the layer made it), the
        rsqrt, the normed and the scaled output."""
        h, d = self.shape.hidden, self.d
        return (F32 * h if new_input or d != F32 else 0) + F32 + 2 * d * h

    def _decoder_bytes(self, sparse: bool) -> tuple[int, int]:
        """A decoder layer's activation and W-state bytes (module docstring)."""
        sh, t, d = self.shape, self.tokens, self.d
        h, q, kv = sh.hidden, sh.heads * sh.head_dim, sh.kv_heads * sh.head_dim
        lse = F32 * sh.heads
        if sh.gpt2:
            gelu = 5 if sh.gelu_new else 2
            act = d * (h + 3 * q + q + h + h + gelu * sh.intermediate + h) + 4 * F32 + lse
            # the matrices' inputs and their outputs' gradients; the LayerNorms' weight
            # and bias gradients (made in I, param-sized)
            weight = d * (3 * h + sh.intermediate + 3 * q + h + sh.intermediate + h)
            return t * act, t * weight + 4 * h * d
        rope = 2 * self.s * sh.head_dim * d  # cos and sin, made in the layer (batch 1)
        # a mask (Mistral's window shorter than the sequence): HF repeats k and v to every
        # head (SDPA's GQA takes no mask) and SDPA keeps the mask, b x seq^2 in the dtype
        windowed = sh.window is not None and sh.window < self.s
        keys = q if windowed else kv
        mask = self.b * self.s**2 * d if windowed else 0
        act = self._rms(False) + d * (2 * q + 2 * keys) + lse + self._rms(True) + d * h
        # q/k/v's input and o's, their outputs' gradients, each norm's normed and gradient
        weight = d * (h + q) + d * (q + 2 * kv + h) + 2 * 2 * d * h
        mlp_act, mlp_weight = self._sparse_bytes() if sparse else self._dense_bytes()
        return t * (act + mlp_act) + rope + mask, t * (weight + mlp_weight)

    def _dense_bytes(self) -> tuple[int, int]:
        """Per token: a gated MLP's gate, SiLU, up and product; for W, its two inputs and
        its three outputs' gradients."""
        h, i, d = self.shape.hidden, self.shape.intermediate, self.d
        return 4 * d * i, d * (h + i) + d * (2 * i + h)

    def _sparse_bytes(self) -> tuple[int, int]:
        """Per token: the router's float32 softmax and top-k indices (and a copy of the top-k
        weights where they are normalized in place), and per chosen expert its gathered
        input, gate-and-up, SiLU, product and down outputs, routing weight and index; and a
        shared expert's dense MLP, its gate and their product's input. For W: the input
        (router, shared expert), the router's gradient, per chosen expert its two inputs
        and two outputs' gradients, the shared expert's as a dense MLP's."""
        sh, d = self.shape, self.d
        h, e, k, i = sh.hidden, sh.experts, sh.top_k, sh.expert_intermediate
        act = F32 * e + INT64 * k + F32 * k * sh.normalize_top_k
        act += k * (d * (2 * h + 4 * i) + F32 + INT64)
        weight = d * h + d * e + k * d * (2 * h + 3 * i)
        if sh.shared_intermediate:
            s = sh.shared_intermediate
            act += 4 * d * s + d * (h + 1)
            weight += d * s + d * (2 * s + h) + d
        return act, weight

    def _moved(self, nbytes: int) -> float:
        """Seconds of work bound by memory: `nbytes` written and read once."""
        return 2 * nbytes / self.memory

    # -- assembling

    def _layer(self, name: str, mats: list[Matrix], norm_tensors: int, act: int, weight: int,
               times: tuple[float, float, float], *, extra: tuple[int, ...], norms: int = 0,
               output: int | None = None) -> LayerProfile:  # fmt: skip
        sh, d = self.shape, self.d
        norm_params = norms * sh.hidden * (2 if sh.gpt2 else 1)
        params = sum(m.params for m in mats) + norm_params
        tensors = sum(m.tensors for m in mats) + norm_tensors
        param_bytes = params * d
        state = _optimizer_bytes(self.optimizer, param_bytes, tensors)
        # the step reads the parameters, gradients and state and writes the parameters and
        # state; torch's foreach step makes a parameter-sized temporary or so
        step = (2 * param_bytes + param_bytes + 2 * state) / self.memory
        hidden_out = self.tokens * (sh.hidden * d + INT64)  # and the padding mask
        f, i, w = (Timing(x, x, x) for x in times)
        return LayerProfile(
            name=name, forward=f, input_grad=i, weight_grad=w, activation_bytes=int(act),
            weight_state_bytes=int(weight), param_bytes=param_bytes, grad_bytes=param_bytes,
            optimizer_bytes=state, output_bytes=hidden_out if output is None else output,
            params=params, forward_extra_bytes=extra[0], input_grad_extra_bytes=extra[1],
            weight_grad_extra_bytes=extra[2], step=Timing(step, step, step),
            step_bytes=param_bytes,
        )  # fmt: skip


def _optimizer_bytes(name: str, param_bytes: int, tensors: int) -> int:
    """The state torch's optimizer keeps: Adam's two moments and a float32 `step` per
    tensor, SGD's momentum buffer, plain SGD nothing."""
    if name in ("adam", "adamw"):
        return 2 * param_bytes + F32 * tensors
    if name == "sgd-momentum":
        return param_bytes
    return 0
