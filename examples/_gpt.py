"""What the three examples share: a small GPT, the data it learns, the loss, the rank set-up.

The model is `zbkit.models.TinyTransformer` (token + position embedding, causal pre-norm
transformer blocks, a vocabulary head), cut into pipeline stages by
`zbkit.models.split_stages`. The data needs no download: rows of consecutive tokens
``s, s+1, s+2, ...`` (mod the vocabulary) from a random start ``s``, so the next token is
always ``(token + 1) % VOCAB``, a pattern a few optimizer steps already learn.

Every batch is a pure function of ``(step, replica)``, and the model of ``SEED``: a test can
rebuild both in one process and compute what the ranks should print at step 0.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

from zbkit.models import TinyTransformer
from zbkit.parallel import get_local_rank, init_distributed

VOCAB, DIM, HEADS, LAYERS, TOKENS = 64, 128, 4, 8, 32
SEED = 0


def build_model() -> TinyTransformer:
    """The same weights on every rank (and in a test's single process)."""
    torch.manual_seed(SEED)
    return TinyTransformer(vocab=VOCAB, dim=DIM, heads=HEADS, layers=LAYERS, tokens=TOKENS)


def counting_batch(rows: int, step: int, replica: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, targets)``, each (rows, TOKENS) token ids; targets[i, k] = inputs[i, k] + 1.

    ``replica``: a data-parallel replica's own rows (each replica trains on different data).
    """
    gen = torch.Generator().manual_seed(1000 * step + replica)  # its own stream per batch
    start = torch.randint(VOCAB, (rows, 1), generator=gen)  # (rows, 1)
    seq = (start + torch.arange(TOKENS + 1)) % VOCAB  # (rows, TOKENS + 1)
    return seq[:, :-1], seq[:, 1:]


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss: logits (b, t, VOCAB), targets (b, t)."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class TensorOut(nn.Module):
    """torch.distributed.pipelining's form of a stage: returns its one tensor.

    `zbkit.models.TransformerStage` returns ``{"x": hidden}`` or ``{"logits": ...}`` (zbkit's
    outputs by name); torch's `PipelineStage` wants a Tensor (or a tuple of them).
    """

    def __init__(self, stage: nn.Module) -> None:
        super().__init__()
        self.stage = stage

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (out,) = self.stage(x).values()
        return out


def add_backend_argument(parser: argparse.ArgumentParser) -> None:
    default = "nccl" if torch.cuda.is_available() else "gloo"
    parser.add_argument(
        "--backend",
        choices=["gloo", "nccl"],
        default=default,
        help=f"gloo: CPU ranks; nccl: one GPU per rank, cuda:LOCAL_RANK (default here: {default})",
    )


def start_rank(backend: str) -> torch.device:
    """Join torchrun's process group; returns the device this rank computes on."""
    if not init_distributed(backend):
        raise SystemExit("start this script with torchrun: see the command in its docstring")
    if backend == "nccl":  # init_distributed made cuda:LOCAL_RANK this process's device
        return torch.device("cuda", get_local_rank())
    return torch.device("cpu")
