"""Small models reused by the demo, tests, benchmarks and notebooks.

Each is tiny on purpose: big enough to have the graph shapes that make split
backward interesting (residuals, shared weights, multi-output nodes), small
enough to run on a laptop CPU in milliseconds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    """Multi-head self-attention with one fused qkv projection."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim={dim} must be divisible by heads={heads}")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape  # (batch, tokens, dim)
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 x (b, t, d)
        # (b, t, d) -> (b, heads, t, d / heads)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, heads, t, d / heads)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class TransformerBlock(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then + mlp(ln(.))."""

    def __init__(self, dim: int = 32, heads: int = 4, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ResidualMLPBlock(nn.Module):
    """x + Linear(4d -> d)(GELU(Linear(d -> 4d)(LayerNorm(x)))): the benchmark's block."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.ln(x))))


class MLP(nn.Module):
    """Linear layers of ``sizes`` with Tanh between them: the smallest stage to split."""

    def __init__(self, sizes: tuple[int, ...] = (8, 16, 16, 4)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(a, b), nn.Tanh()]
        self.net = nn.Sequential(*layers[:-1])  # no activation after the last layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallConvNet(nn.Module):
    """Two convolutions (one with BatchNorm), a mean over the image and a linear head:
    images (b, channels, h, w) -> logits (b, classes)."""

    def __init__(self, channels: int = 3, classes: int = 5) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2)
        self.head = nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (b, channels, h, w)
        x = F.relu(self.bn(self.conv1(x)))
        x = F.relu(self.conv2(x))  # (b, 8, h', w')
        return self.head(x.mean(dim=(2, 3)))  # (b, classes)


class TiedLM(nn.Module):
    """Embedding whose weight is reused as the output projection (tied weights)."""

    def __init__(self, vocab: int = 11, dim: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.block = ResidualMLPBlock(dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # ids: (b, t) -> logits (b, t, vocab)
        return self.block(self.embed(ids)) @ self.embed.weight.T


class TokenEmbedding(nn.Module):
    """Token ids (b, t) -> vectors (b, t, dim): a token embedding plus a learned position one."""

    def __init__(self, vocab: int, dim: int, tokens: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(tokens, dim)  # one vector per token slot

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        if t > self.pos.num_embeddings:
            raise ValueError(f"{t} tokens, but the model has {self.pos.num_embeddings} positions")
        return self.tok(ids) + self.pos(torch.arange(t, device=ids.device))


class TinyTransformer(nn.Module):
    """A small language model: embedding, `layers` TransformerBlocks, norm, vocabulary head.

    `split_stages(model, n)` cuts it into `n` pipeline stages that share its parameters.
    """

    def __init__(
        self, vocab: int = 64, dim: int = 32, heads: int = 4, layers: int = 8, tokens: int = 16
    ) -> None:
        super().__init__()
        self.embed = TokenEmbedding(vocab, dim, tokens)
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (b, t) -> logits (b, t, vocab)
        h = self.embed(ids)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


class TransformerStage(nn.Module):
    """Blocks `first..last-1` of a TinyTransformer as one pipeline stage (`module(**inputs)`).

    Stage 0 also embeds the token ids; the last stage also applies the norm and the head.
    Returns `{"x": hidden}` (b, t, dim), or `{"logits": ...}` (b, t, vocab) on the last stage.
    The submodules are the model's own (not copies): gradients land in `model`'s parameters,
    and the stage's parameter names are the model's (`blocks.3.mlp.0.weight`).
    """

    def __init__(self, model: TinyTransformer, first: int, last: int, *, is_last: bool) -> None:
        super().__init__()
        self.embed = model.embed if first == 0 else None
        # keyed by the model's block index, so names match the model's (blocks.5.attn.qkv...)
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in range(first, last)})
        self.norm = model.norm if is_last else None
        self.head = model.head if is_last else None
        self.span = (first, last)  # which of the model's blocks this stage runs

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.embed is not None:  # x: token ids (b, t)
            x = self.embed(x)
        for block in self.blocks.values():
            x = block(x)  # (b, t, dim)
        if self.norm is not None and self.head is not None:  # the last stage has both
            return {"logits": self.head(self.norm(x))}
        return {"x": x}


def stage_spans(layers: int, num_stages: int) -> list[tuple[int, int]]:
    """Blocks `(first, last)` of each of `num_stages` consecutive stages of `layers` blocks,
    spread as evenly as possible (earlier stages take the extra blocks)."""
    if not 1 <= num_stages <= layers:
        raise ValueError(
            f"cannot split {layers} blocks into {num_stages} stages: every stage needs at least "
            f"one block; build the model with layers >= {num_stages}"
        )
    bounds = [s * layers // num_stages for s in range(num_stages + 1)]
    bounds = [layers - b for b in reversed(bounds)]  # extra blocks go to the early stages
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def split_stages(model: TinyTransformer, num_stages: int) -> list[TransformerStage]:
    """Cut `model` into `num_stages` consecutive stages (`stage_spans`). Composing the stages
    is `model` itself."""
    spans = stage_spans(len(model.blocks), num_stages)
    return [
        TransformerStage(model, first, last, is_last=s == num_stages - 1)
        for s, (first, last) in enumerate(spans)
    ]
