"""Where a schedule's stages live: the one placement function (a leaf module, so the builders
and the catalog that lists them can both use it)."""

from __future__ import annotations

__all__ = ["stage_to_rank"]


def stage_to_rank(placement: str, pp: int, v: int = 1) -> list[int]:
    """The rank of each stage: "linear" (stage s on rank s), "looped" (v rounds down the
    ranks: stage s on rank s % pp, Megatron's and torch's interleaving) or "v" (two stages
    a rank, down the ranks and back up: stages s and 2p-1-s on rank s, ZB-V's V)."""
    if placement == "linear" or (placement == "looped" and v == 1):
        return list(range(pp))
    if placement == "looped":
        return [s % pp for s in range(v * pp)]
    if placement == "v":
        return [s if s < pp else 2 * pp - 1 - s for s in range(2 * pp)]
    raise ValueError(f"placement must be 'linear', 'looped' or 'v', got {placement!r}")
