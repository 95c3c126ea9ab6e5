"""Hugging Face models from tiny configs (nothing downloaded), cut into pipeline stages.

Each stage is a small module around the model's own submodules, so the stages' parameters
are the model's: a tied embedding is one ``nn.Parameter`` that the first stage embeds with
and the last stage's head projects with, and ALBERT's one layer group is run by every stage.
A stage returns a dict (hidden states, the attention mask, what later stages need); the last
returns the logits (a Tensor, torch's form).

The token batches are padded the way a tokenizer pads: only some rows, so the HF-style
attention mask is ``None`` in some microbatches and a tensor in others (see ``tokens``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import transformers as tf
from torch import nn
from torch.nn import functional as F
from transformers.masking_utils import (
    create_bidirectional_mask,
    create_causal_mask,
    create_sliding_window_causal_mask,
)

VOCAB, ROWS, SEQ, PAD = 64, 8, 8, 0
MICROBATCHES = 4
LAYERS = 4  # every model: 4 layers (T5: 2 encoder + 2 decoder blocks), cut evenly
# rows 2-3 and 6-7 end in padding: microbatches 1 and 3 of 4 get a mask, 0 and 2 get None
PADDED_ROWS = [2, 3, 6, 7]
MODELS = (
    "gpt2", "llama-tied", "llama", "mistral", "qwen2", "mixtral", "qwen2-moe",
    "bert", "albert", "t5", "vit",
)  # fmt: skip
DECODERS = {  # decoder-only models of the Llama family: (model class, config class)
    "llama-tied": (tf.LlamaForCausalLM, tf.LlamaConfig),
    "llama": (tf.LlamaForCausalLM, tf.LlamaConfig),
    "mistral": (tf.MistralForCausalLM, tf.MistralConfig),
    "qwen2": (tf.Qwen2ForCausalLM, tf.Qwen2Config),
    "mixtral": (tf.MixtralForCausalLM, tf.MixtralConfig),
    "qwen2-moe": (tf.Qwen2MoeForCausalLM, tf.Qwen2MoeConfig),
}
SMALL = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, vocab_size=VOCAB)


@dataclass
class Case:
    """One model cut into stages, with a batch and the loss of one microbatch."""

    model: nn.Module  # the HF model the stages share their parameters with
    stages: list[nn.Module]
    inputs: torch.Tensor | tuple[torch.Tensor, ...]  # stage 0's inputs, ROWS rows
    target: torch.Tensor
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    hf_logits: Callable[[], torch.Tensor]  # the HF model's own forward on the whole batch


def tokens(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, target), each (ROWS, SEQ): random tokens, the last 3 of PADDED_ROWS padding,
    and the target -100 (ignored) where the input is padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (ROWS, SEQ), generator=g)
    target = torch.randint(0, VOCAB, (ROWS, SEQ), generator=g)
    ids[PADDED_ROWS, -3:] = PAD
    target[ids == PAD] = -100
    return ids, target


def padding_mask(ids: torch.Tensor) -> torch.Tensor | None:
    """HF's 2-D attention_mask (1 = a real token), or None where no row is padded."""
    keep = ids != PAD
    return None if bool(keep.all()) else keep.long()


def token_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(), ignore_index=-100)


def _cut(n: int, stages: int) -> list[range]:
    """Layer indices per stage: 4 layers over 2 stages are [0, 1] and [2, 3]."""
    per = n // stages
    assert per * stages == n, f"{n} layers do not cut into {stages} equal stages"
    return [range(s * per, (s + 1) * per) for s in range(stages)]


# ---------------------------------------------------------------- decoder-only
class CausalStage(nn.Module):
    """Llama, Mistral, Qwen2, Mixtral, Qwen2-MoE: stage 0 embeds the ids and builds the
    causal mask (None under SDPA when nothing is padded); every stage runs its decoder
    layers with rotary position embeddings; the last applies the final norm and the head."""

    def __init__(self, model: nn.Module, layers: range, first: bool, last: bool) -> None:
        super().__init__()
        base = model.model
        self.config = model.config
        self.embed = base.embed_tokens if first else None
        self.layers = nn.ModuleList(base.layers[i] for i in layers)
        self.rotary = base.rotary_emb  # buffers only: each stage computes (cos, sin) itself
        self.norm = base.norm if last else None
        self.head = model.lm_head if last else None  # tied: its weight is embed's

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> Any:
        if self.embed is not None:  # x: token ids (b, t)
            ids, x = x, self.embed(x)  # (b, t, d)
            sliding = self.config.model_type == "mistral" and self.config.sliding_window
            make = create_sliding_window_causal_mask if sliding else create_causal_mask
            mask = make(self.config, x, padding_mask(ids), None)
        pos = torch.arange(x.shape[1])[None]  # (1, t)
        rope = self.rotary(x, pos)  # (cos, sin), each (1, t, head_dim)
        for layer in self.layers:
            x = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=rope)
        if self.head is None:
            return {"x": x, "mask": mask}
        return self.head(self.norm(x))  # (b, t, vocab)


def decoder(name: str, stages: int, attn: str = "sdpa") -> Case:
    model_cls, config_cls = DECODERS[name]
    extra: dict[str, Any] = {"tie_word_embeddings": name == "llama-tied"}
    if name == "mistral":
        extra["sliding_window"] = 4  # shorter than SEQ: a real sliding-window mask
    if name == "mixtral":
        extra |= dict(num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=0.0)
    if name == "qwen2-moe":
        extra |= dict(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
        )
    config = config_cls(
        **SMALL,
        num_hidden_layers=LAYERS,
        num_key_value_heads=2,
        attention_dropout=0.0,
        pad_token_id=PAD,
        **extra,
    )
    config._attn_implementation = attn
    torch.manual_seed(0)
    model = model_cls(config)
    if name == "llama-tied":
        assert model.lm_head.weight is model.model.embed_tokens.weight
    cuts = _cut(LAYERS, stages)
    mods = [CausalStage(model, r, s == 0, s == stages - 1) for s, r in enumerate(cuts)]
    ids, target = tokens()
    hf = lambda: model(input_ids=ids, attention_mask=padding_mask(ids)).logits
    return Case(model, list(mods), ids, target, token_loss, hf)


class GPT2Stage(nn.Module):
    """GPT-2: stage 0 adds token and position embeddings and builds the causal mask; the
    last applies ln_f and the head, whose weight is the token embedding's."""

    def __init__(self, model: nn.Module, layers: range, first: bool, last: bool) -> None:
        super().__init__()
        body = model.transformer
        self.config = model.config
        self.wte = body.wte if first else None
        self.wpe = body.wpe if first else None
        self.blocks = nn.ModuleList(body.h[i] for i in layers)
        self.ln_f = body.ln_f if last else None
        self.head = model.lm_head if last else None

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> Any:
        if self.wte is not None:  # x: token ids (b, t)
            pos = torch.arange(x.shape[1])[None]  # (1, t)
            ids, x = x, self.wte(x) + self.wpe(pos)  # (b, t, d)
            mask = create_causal_mask(self.config, x, padding_mask(ids), None, position_ids=pos)
        for block in self.blocks:
            x = block(x, attention_mask=mask)
        if self.head is None:
            return {"x": x, "mask": mask}
        return self.head(self.ln_f(x))


def gpt2(stages: int, attn: str = "sdpa") -> Case:
    config = tf.GPT2Config(
        vocab_size=VOCAB,
        n_embd=32,
        n_layer=LAYERS,
        n_head=4,
        n_positions=SEQ,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=1,
        eos_token_id=1,
        pad_token_id=PAD,
    )
    config._attn_implementation = attn
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(config)
    assert model.lm_head.weight is model.transformer.wte.weight  # tied by default
    cuts = _cut(LAYERS, stages)
    mods = [GPT2Stage(model, r, s == 0, s == stages - 1) for s, r in enumerate(cuts)]
    ids, target = tokens()
    hf = lambda: model(input_ids=ids, attention_mask=padding_mask(ids)).logits
    return Case(model, list(mods), ids, target, token_loss, hf)


# ---------------------------------------------------------------- encoders
class EncoderStage(nn.Module):
    """BERT, ALBERT, ViT: stage 0 embeds and builds the bidirectional padding mask (None
    when nothing is padded, and for images); every stage runs its layers (ALBERT: the one
    shared layer group); the last applies the head."""

    def __init__(
        self, config: Any, embed: nn.Module | None, layers: list[nn.Module], head: nn.Module | None
    ) -> None:
        super().__init__()
        self.config = config
        self.embed = embed
        self.layers = nn.ModuleList(layers)  # ALBERT: the same module in every entry
        self.head = head

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> Any:
        if self.embed is not None:  # x: token ids (b, t) or pixels (b, c, h, w)
            data, x = x, self.embed(x)  # (b, t, d)
            pad = None if data.is_floating_point() else padding_mask(data)
            mask = create_bidirectional_mask(self.config, x, pad)
        for layer in self.layers:
            x = layer(x, mask)
        return {"x": x, "mask": mask} if self.head is None else self.head(x)


class FirstToken(nn.Module):
    """ViT's classification head: the final norm, then the classifier on the CLS token."""

    def __init__(self, norm: nn.Module, classifier: nn.Module) -> None:
        super().__init__()
        self.norm, self.classifier = norm, classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.norm(x)[:, 0])  # (b, labels)


def _encoder_stages(
    config: Any, stages: int, embed: nn.Module, layers: list[nn.Module], head: nn.Module
) -> list[nn.Module]:
    cuts = _cut(len(layers), stages)
    return [
        EncoderStage(
            config,
            embed if s == 0 else None,
            [layers[i] for i in r],
            head if s == stages - 1 else None,
        )
        for s, r in enumerate(cuts)
    ]


def bert(stages: int, attn: str = "sdpa") -> Case:
    config = tf.BertConfig(
        **SMALL,
        num_hidden_layers=LAYERS,
        max_position_embeddings=SEQ,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=PAD,
    )
    config._attn_implementation = attn
    torch.manual_seed(0)
    model = tf.BertForMaskedLM(config)
    emb = model.bert.embeddings
    assert model.cls.predictions.decoder.weight is emb.word_embeddings.weight
    mods = _encoder_stages(config, stages, emb, list(model.bert.encoder.layer), model.cls)
    ids, target = tokens()
    hf = lambda: model(input_ids=ids, attention_mask=padding_mask(ids)).logits
    return Case(model, mods, ids, target, token_loss, hf)


def albert(stages: int, attn: str = "sdpa") -> Case:
    config = tf.AlbertConfig(
        **SMALL,
        embedding_size=16,
        num_hidden_layers=LAYERS,
        num_hidden_groups=1,  # one layer group, its weights shared by all 4 layers
        max_position_embeddings=SEQ,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=PAD,
    )
    config._attn_implementation = attn
    torch.manual_seed(0)
    model = tf.AlbertForMaskedLM(config)
    body = model.albert
    assert model.predictions.decoder.weight is body.embeddings.word_embeddings.weight
    embed = nn.Sequential(body.embeddings, body.encoder.embedding_hidden_mapping_in)
    group = body.encoder.albert_layer_groups[0]
    mods = _encoder_stages(config, stages, embed, [group] * LAYERS, model.predictions)
    ids, target = tokens()
    hf = lambda: model(input_ids=ids, attention_mask=padding_mask(ids)).logits
    return Case(model, mods, ids, target, token_loss, hf)


def vit(stages: int, attn: str = "sdpa") -> Case:
    config = tf.ViTConfig(
        image_size=16,
        patch_size=4,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=5,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    config._attn_implementation = attn
    torch.manual_seed(0)
    model = tf.ViTForImageClassification(config)
    head = FirstToken(model.vit.layernorm, model.classifier)
    mods = _encoder_stages(config, stages, model.vit.embeddings, list(model.vit.layers), head)
    g = torch.Generator().manual_seed(1)
    pixels = torch.randn(ROWS, 3, 16, 16, generator=g)  # 16 patches of 4x4, and CLS
    labels = torch.randint(0, 5, (ROWS,), generator=g)
    hf = lambda: model(pixel_values=pixels).logits
    return Case(model, mods, pixels, labels, F.cross_entropy, hf)


# ---------------------------------------------------------------- T5: encoder-decoder
class T5EncoderStage(nn.Module):
    """Encoder blocks. Stage 0 embeds (the shared embedding: the decoder and the head use
    the same weight) and block 0 makes the relative position bias, a tensor that requires
    grad and travels to the next encoder stage. The decoder's ids ride along as data."""

    def __init__(self, model: nn.Module, blocks: range, first: bool, last: bool) -> None:
        super().__init__()
        enc = model.encoder
        self.config = enc.config
        self.embed = model.shared if first else None
        self.blocks = nn.ModuleList(enc.block[i] for i in blocks)
        self.norm = enc.final_layer_norm if last else None

    def forward(
        self,
        x: torch.Tensor,
        dec_ids: torch.Tensor,
        pad: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor | None]:
        if self.embed is not None:  # x: token ids (b, t)
            ids, x = x, self.embed(x)  # (b, t, d)
            pad = padding_mask(ids)
        mask = create_bidirectional_mask(self.config, x, pad)
        for block in self.blocks:
            x, bias, _ = block(x, mask, bias)  # bias: (1, heads, t, t)
        if self.norm is None:
            return {"x": x, "dec_ids": dec_ids, "pad": pad, "bias": bias}
        return {"enc": self.norm(x), "dec_ids": dec_ids, "pad": pad}


class T5DecoderStage(nn.Module):
    """Decoder blocks: self-attention (causal) and cross-attention to the encoder's output,
    which a middle decoder stage passes on unchanged; the last applies the final norm, the
    output scaling of a tied head, and the head."""

    def __init__(self, model: nn.Module, blocks: range, first: bool, last: bool) -> None:
        super().__init__()
        dec = model.decoder
        self.config = dec.config
        self.scale = model.model_dim**-0.5 if model.config.scale_decoder_outputs else 1.0
        self.embed = model.shared if first else None
        self.blocks = nn.ModuleList(dec.block[i] for i in blocks)
        self.norm = dec.final_layer_norm if last else None
        self.head = model.lm_head if last else None

    def forward(
        self,
        enc: torch.Tensor,
        dec_ids: torch.Tensor,
        pad: torch.Tensor | None = None,
        x: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        cross_bias: torch.Tensor | None = None,
    ) -> Any:
        if self.embed is not None:
            x = self.embed(dec_ids)  # (b, t, d)
        assert x is not None
        mask = create_causal_mask(self.config, x, None, None)
        cross_mask = create_bidirectional_mask(self.config, x, pad, encoder_hidden_states=enc)
        for block in self.blocks:
            x, bias, cross_bias = block(x, mask, bias, enc, cross_mask, cross_bias)
        if self.head is None:  # enc goes on as it came: the next stage attends to it too
            return {
                "enc": enc,
                "dec_ids": dec_ids,
                "pad": pad,
                "x": x,
                "bias": bias,
                "cross_bias": cross_bias,
            }
        return self.head(self.norm(x) * self.scale)


def t5(stages: int, attn: str = "sdpa") -> Case:
    config = tf.T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=LAYERS // 2,
        num_decoder_layers=LAYERS // 2,
        num_heads=4,
        dropout_rate=0.0,
        pad_token_id=PAD,
        decoder_start_token_id=PAD,
    )
    config._attn_implementation = attn
    torch.manual_seed(0)
    model = tf.T5ForConditionalGeneration(config)
    model.decoder.config._attn_implementation = attn
    assert model.lm_head.weight is model.shared.weight
    half = stages // 2  # encoder stages, then as many decoder stages
    cuts = _cut(LAYERS // 2, half)
    mods: list[nn.Module] = [
        T5EncoderStage(model, r, s == 0, s == half - 1) for s, r in enumerate(cuts)
    ]
    mods += [T5DecoderStage(model, r, s == 0, s == half - 1) for s, r in enumerate(cuts)]
    ids, _ = tokens()  # the encoder's input is padded, the decoder's is not
    g = torch.Generator().manual_seed(2)
    dec_ids = torch.randint(1, VOCAB, (ROWS, SEQ), generator=g)
    dec_ids[:, 0] = PAD  # T5's decoder start token
    target = torch.randint(0, VOCAB, (ROWS, SEQ), generator=g)
    hf = lambda: (
        model(input_ids=ids, attention_mask=padding_mask(ids), decoder_input_ids=dec_ids).logits
    )
    return Case(model, mods, (ids, dec_ids), target, token_loss, hf)


def build(name: str, stages: int, attn: str = "sdpa") -> Case:
    """``name`` (one of MODELS) cut into ``stages`` stages, with ``attn`` attention."""
    if name in DECODERS:
        return decoder(name, stages, attn)
    return {"gpt2": gpt2, "bert": bert, "albert": albert, "vit": vit, "t5": t5}[name](stages, attn)
