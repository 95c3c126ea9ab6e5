"""Hugging Face decoder-only models as pipeline layers: `layers(model)` and `TokenMeanLoss`.

`layers(model)` returns the model's own submodules, wrapped so each is fed the previous
one's output: the embedding (token ids and HF's 2-D `attention_mask` in), each decoder
layer, the final norm and the head (logits out). Between layers travel the hidden states and
the padding mask, as a tuple (torch's pipelining sends tensors and tuples of them); each
layer builds its causal mask with HF's own mask functions (a sliding window where the config
has one) and its rotary position embeddings itself, so any contiguous run of them is a stage
(`planner.profile`, `LocalPipeline`, `ScheduleRunner`, torch's `PipelineStage`). No cache is
kept. The parameters are the model's: a tied head projects with the embedding's own weight;
where the embedding and the head are on two ranks, `ScheduleRunner(..., tied=tied(model))`
keeps their copies one weight.

`TokenMeanLoss(targets)` is HF's loss over the whole batch (the mean over every target
token that is not ignored) taken one microbatch at a time: each microbatch's token sum
divided by the whole batch's count. Give the runner `scale_grads=False`: a mean of the
microbatches' means weighs a padded microbatch's tokens more than HF does.

Llama, Mistral, Qwen2, Mixtral and Qwen2-MoE (their `model.model.layers`), and GPT-2.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

__all__ = ["TokenMeanLoss", "layers", "tied"]


class Embedding(nn.Module):
    def __init__(self, embed: nn.Module, positions: nn.Module | None = None) -> None:
        super().__init__()
        self.embed, self.positions = embed, positions

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embed(input_ids)
        if self.positions is not None:  # GPT-2: learned positions
            x = x + self.positions(torch.arange(input_ids.shape[1], device=x.device)[None])
        padding = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        return x, padding


def _mask(config: Any, x: torch.Tensor, padding: torch.Tensor, pos: torch.Tensor) -> Any:
    """HF's own causal mask for these hidden states (None where SDPA needs none)."""
    sliding = getattr(config, "sliding_window", None) and config.model_type == "mistral"
    make = create_sliding_window_causal_mask if sliding else create_causal_mask
    return make(config, x, padding, None, position_ids=pos)


class DecoderLayer(nn.Module):
    """One decoder layer: the Llama family's, with its rotary embeddings made here, or a
    GPT-2 block (`rotary` None: its positions were added to the embedding)."""

    def __init__(self, config: Any, layer: nn.Module, rotary: nn.Module | None = None) -> None:
        super().__init__()
        self.config, self.layer, self.rotary = config, layer, rotary

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(x.shape[1], device=x.device)[None]
        mask = _mask(self.config, x, padding, pos)
        if self.rotary is None:
            out = self.layer(x, attention_mask=mask)
        else:
            rope = self.rotary(x, pos)
            out = self.layer(x, attention_mask=mask, position_ids=pos, position_embeddings=rope)
        return (out[0] if isinstance(out, tuple) else out), padding


class FinalNorm(nn.Module):
    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.norm(x), padding


class LMHead(nn.Module):
    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.head = head

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        return self.head(x)


def layers(model: Any) -> list[nn.Module]:
    """`model`'s embedding, decoder layers, final norm and head as layers (module docstring)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "lm_head"):
        raise TypeError(
            f"zbkit.hf.layers takes a Hugging Face causal LM (with .config and .lm_head), got "
            f"{type(model).__name__}"
        )
    if hasattr(model, "model") and hasattr(model.model, "layers"):  # the Llama family
        body = model.model
        return [
            Embedding(body.embed_tokens),
            *(DecoderLayer(config, layer, body.rotary_emb) for layer in body.layers),
            FinalNorm(body.norm),
            LMHead(model.lm_head),
        ]
    if hasattr(model, "transformer") and hasattr(model.transformer, "h"):  # GPT-2
        body = model.transformer
        return [
            Embedding(body.wte, body.wpe),
            *(DecoderLayer(config, block) for block in body.h),
            FinalNorm(body.ln_f),
            LMHead(model.lm_head),
        ]
    raise TypeError(
        f"zbkit.hf.layers knows decoder-only models with model.layers (Llama, Mistral, Qwen2, "
        f"Mixtral, Qwen2-MoE) or transformer.h (GPT-2); {type(model).__name__} has neither"
    )


def tied(model: Any) -> dict[str, nn.Parameter]:
    """The weights `model` ties (its head's and its embedding's, when the config ties them),
    by name: `ScheduleRunner(..., tied=zbkit.hf.tied(model))` keeps the copies of a tie split
    over two ranks one weight. Empty for an untied model."""
    head = getattr(getattr(model, "lm_head", None), "weight", None)
    embed = model.get_input_embeddings().weight if hasattr(model, "get_input_embeddings") else None
    if head is None or head is not embed:
        return {}
    return {"lm_head.weight": cast(nn.Parameter, head)}


class TokenMeanLoss:
    """HF's token-mean cross entropy over the whole batch, one microbatch at a time."""

    def __init__(self, targets: torch.Tensor, ignore_index: int = -100) -> None:
        counted = int((targets != ignore_index).sum())
        if counted == 0:
            raise ValueError("TokenMeanLoss: every target is ignore_index: nothing to learn from")
        self.count, self.ignore_index = counted, ignore_index

    def __call__(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        total = F.cross_entropy(
            logits.flatten(0, -2).float(),
            target.flatten(),
            ignore_index=self.ignore_index,
            reduction="sum",
        )
        return total / self.count
