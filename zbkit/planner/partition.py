"""`partition(profile, stages)`: which layers each stage holds, the slowest rank as fast as can be.

A rank's time is what its stages' layers cost per microbatch (F + I + W, the profile's
medians); its bytes are its layers' parameters, gradients and optimizer state, plus each
stage's activations times the microbatches it holds at once (`held`). The placement says
which rank holds which stage:

- "linear": stage s on rank s (1F1B, ZB-H1, ZB-H2);
- "v": rank r holds stages r and 2p-1-r (ZB-V, V-Half, V-Min, DualPipeV), so the first and
  the last stage, the embedding and the LM head, share rank 0, and the balance is per rank;
- "looped": stage s on rank s mod p (interleaved 1F1B).

Linear and V are exact (a dynamic program over the cut points: per stage for linear, from
both ends inwards for the V, a rank's two stages taken together); looped balances per stage
(its ranks then within a factor of the stages per rank of the optimum). Each `Partition`
keeps the naive split beside it, equal layer counts per stage, to show what balancing bought.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from html import escape
from itertools import accumulate

from zbkit.planner.predict import _span
from zbkit.planner.profile import Profile

__all__ = ["PLACEMENTS", "Partition", "partition"]

PLACEMENTS = ("linear", "v", "looped")
_INF = float("inf")


@dataclass(frozen=True)
class Partition:
    """The stages' layers, and per rank its seconds per microbatch and its bytes; the same
    for the naive equal-layers split."""

    stages: list[range]
    placement: str
    stage_to_rank: list[int]
    seconds: list[float]  # per rank: its layers' F + I + W for one microbatch
    bytes: list[int]  # per rank: static bytes plus the activations its stages hold
    naive: list[range]
    naive_seconds: list[float]
    naive_bytes: list[int]

    @property
    def slowest(self) -> float:
        return max(self.seconds)

    @property
    def speedup(self) -> float:
        """The naive split's slowest rank over this one's (1.25: 25% faster)."""
        return max(self.naive_seconds) / self.slowest

    @property
    def _unit(self) -> tuple[str, float]:
        """GiB where a rank holds 10 GiB or more, else MiB."""
        return (
            ("GiB", 2**30) if max(self.bytes + self.naive_bytes) >= 10 * 2**30 else ("MiB", 2**20)
        )

    def __str__(self) -> str:
        unit, scale = self._unit
        lines = [
            f"{self.placement} partition into {len(self.stages)} stages on "
            f"{len(self.seconds)} ranks: slowest rank {self.slowest * 1e3:.4g} ms per "
            f"microbatch, the equal-layers split's {max(self.naive_seconds) * 1e3:.4g} "
            f"({self.speedup:.2f}x)",
            f"{'rank':>4}  {'layers':<16} {'ms':>8} {unit:>10}   {'equal layers':<16} "
            f"{'ms':>8} {unit:>10}",
        ]
        for r in range(len(self.seconds)):
            mine = _spans(self.stages, self.stage_to_rank, r)
            theirs = _spans(self.naive, self.stage_to_rank, r)
            lines.append(
                f"{r:>4}  {mine:<16} {self.seconds[r] * 1e3:>8.3f} {self.bytes[r] / scale:>10.1f}"
                f"   {theirs:<16} {self.naive_seconds[r] * 1e3:>8.3f} "
                f"{self.naive_bytes[r] / scale:>10.1f}"
            )
        return "\n".join(lines)

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        unit, scale = self._unit
        head = "".join(f"<th>{h}</th>" for h in ("rank", "layers", "ms", unit,
                                                 "equal layers", "ms", unit))  # fmt: skip
        rows = []
        for r in range(len(self.seconds)):
            cells = (
                r,
                _spans(self.stages, self.stage_to_rank, r),
                f"{self.seconds[r] * 1e3:.3f}",
                f"{self.bytes[r] / scale:.1f}",
                _spans(self.naive, self.stage_to_rank, r),
                f"{self.naive_seconds[r] * 1e3:.3f}",
                f"{self.naive_bytes[r] / scale:.1f}",
            )
            rows.append("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in cells) + "</tr>")
        title = escape(str(self).splitlines()[0])
        return f"<p>{title}</p><table><tr>{head}</tr>{''.join(rows)}</table>"

    def plot(self):
        """Per rank, this partition's and the equal-layers split's milliseconds per
        microbatch (F + I + W) and bytes, side by side: a matplotlib Figure."""
        # lazily: matplotlib is the notebook extra; the numbers above need none of it
        import matplotlib.pyplot as plt

        ranks = range(len(self.seconds))
        unit, per = self._unit
        fig, (left, right) = plt.subplots(1, 2, figsize=(9, 2.8))
        for ax, ours, theirs, label, scale in (
            (left, self.seconds, self.naive_seconds, "ms per microbatch", 1e3),
            (right, self.bytes, self.naive_bytes, f"{unit} held", 1 / per),
        ):
            ax.bar([r - 0.2 for r in ranks], [v * scale for v in theirs], 0.4,
                   color="#bbbbbb", label="equal layers")  # fmt: skip
            ax.bar([r + 0.2 for r in ranks], [v * scale for v in ours], 0.4,
                   color="#3b6ea8", label="balanced")  # fmt: skip
            ax.set_xticks(list(ranks), [f"rank {r}" for r in ranks])
            ax.set_ylabel(label)
        left.axhline(self.slowest * 1e3, color="#3b6ea8", lw=0.8, ls="--")
        left.legend(loc="lower right", fontsize=8)
        left.set_title(f"slowest rank {self.speedup:.2f}x faster balanced", fontsize=10)
        right.set_title("bytes per rank", fontsize=10)
        fig.tight_layout()
        plt.close(fig)
        return fig


def _spans(stages: list[range], where: list[int], rank: int) -> str:
    return " + ".join(_span(p) for s, p in enumerate(stages) if where[s] == rank)


def stage_to_rank(placement: str, stages: int, pp: int | None = None) -> list[int]:
    """Which rank holds each stage, for `placement` (module docstring)."""
    if placement not in PLACEMENTS:
        raise ValueError(
            f"partition: placement is one of {', '.join(PLACEMENTS)}, got {placement!r}"
        )
    if not isinstance(stages, int) or isinstance(stages, bool) or stages < 1:
        raise ValueError(f"partition: stages must be an int >= 1, got {stages!r}")
    if placement == "linear":
        return list(range(stages))
    if placement == "v":
        if stages % 2:
            raise ValueError(
                f"partition: a V has an even number of stages (2 per rank), not {stages}"
            )
        p = stages // 2
        return [*range(p), *range(p - 1, -1, -1)]
    if pp is None or not isinstance(pp, int) or pp < 1 or stages % pp:
        raise ValueError(
            f"partition: looped needs pp, a number of ranks that divides the {stages} stages, "
            f"got pp={pp!r}"
        )
    return [s % pp for s in range(stages)]


def partition(
    profile: Profile,
    stages: int,
    *,
    placement: str = "linear",
    memory: int | None = None,
    pp: int | None = None,
    held: Sequence[float] | None = None,
) -> Partition:
    """Contiguous layers for each of `stages` stages (module docstring), the slowest rank's
    seconds per microbatch least, every rank's bytes within `memory` (None: no limit).

    `pp`: the ranks, for "looped" (linear: one per stage; V: half the stages). `held`: per
    stage, the microbatches whose activations it holds at once (default: as many as the
    stages from it to the last, 1F1B's warm-up; `plan` gives each schedule's own)."""
    if not isinstance(profile, Profile):
        raise TypeError(f"partition takes a planner.Profile, got {type(profile).__name__}")
    where = stage_to_rank(placement, stages, pp)
    n = len(profile)
    if stages > n:
        raise ValueError(
            f"partition: {stages} stages but {n} layers: each stage needs a layer at least; "
            "use fewer stages, or cut the model into more layers"
        )
    if held is None:
        held = [stages - s for s in range(stages)]
    if len(held) != stages:
        raise ValueError(f"partition: held has {len(held)} counts, one per stage ({stages}) needed")
    if memory is not None and (not isinstance(memory, int | float) or memory <= 0):
        raise ValueError(f"partition: memory is bytes per rank, > 0, got {memory!r}")
    sums = _Sums(profile)
    limit = _INF if memory is None else float(memory)
    if placement == "v":
        parts = _v(sums, stages // 2, list(held), limit)
    else:
        parts = _linear(sums, stages, list(held), limit)
    if parts is None:
        naive = _equal(n, stages)
        least = max(_rank_bytes(sums, naive, where, held))
        raise ValueError(
            f"partition: no split of the {n} layers into {stages} {placement} stages fits "
            f"{_gb(limit)} per rank (the equal-layers split needs {_gb(least)} on its fullest "
            "rank): give more memory or more stages"
        )
    naive = _equal(n, stages)
    return Partition(
        parts, placement, where,
        _rank_seconds(sums, parts, where), _rank_bytes(sums, parts, where, held),
        naive, _rank_seconds(sums, naive, where), _rank_bytes(sums, naive, where, held),
    )  # fmt: skip


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.3g} GB"


class _Sums:
    """Prefix sums over the layers: a run's seconds, static bytes and activation bytes."""

    def __init__(self, profile: Profile) -> None:
        layers = profile.layers
        self.n = len(layers)
        work = (x.forward.median + x.input_grad.median + x.weight_grad.median for x in layers)
        self.work = [0.0, *accumulate(work)]
        static = (x.param_bytes + x.grad_bytes + x.optimizer_bytes for x in layers)
        self.static = [0, *accumulate(static)]
        self.act = [0, *accumulate(x.activation_bytes for x in layers)]

    def seconds(self, i: int, j: int) -> float:
        return self.work[j] - self.work[i]

    def bytes(self, i: int, j: int, held: float) -> float:
        return self.static[j] - self.static[i] + held * (self.act[j] - self.act[i])


def _rank_seconds(sums: _Sums, parts: list[range], where: list[int]) -> list[float]:
    out = [0.0] * (max(where) + 1)
    for s, p in enumerate(parts):
        out[where[s]] += sums.seconds(p.start, p.stop)
    return out


def _rank_bytes(sums: _Sums, parts: list[range], where: list[int], held) -> list[int]:
    out = [0.0] * (max(where) + 1)
    for s, p in enumerate(parts):
        out[where[s]] += sums.bytes(p.start, p.stop, held[s])
    return [int(b) for b in out]


def _equal(n: int, stages: int) -> list[range]:
    size, extra = divmod(n, stages)
    edges = [0, *accumulate(size + (s < extra) for s in range(stages))]
    return [range(a, b) for a, b in zip(edges, edges[1:], strict=False)]


def _linear(sums: _Sums, stages: int, held: list[float], limit: float) -> list[range] | None:
    """Per stage: the least slowest stage whose bytes fit, by cut points (ties: earlier
    cuts). For "looped" the stages are balanced one by one, not per rank."""
    n = sums.n
    best = [[_INF] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for j in range(k, n - (stages - k) + 1):
            for i in range(k - 1, j):
                if best[k - 1][i] == _INF or sums.bytes(i, j, held[k - 1]) > limit:
                    continue
                slowest = max(best[k - 1][i], sums.seconds(i, j))
                if slowest < best[k][j]:
                    best[k][j], cut[k][j] = slowest, i
    if best[stages][n] == _INF:
        return None
    parts, j = [], n
    for k in range(stages, 0, -1):
        parts.append(range(cut[k][j], j))
        j = cut[k][j]
    return parts[::-1]


def _v(sums: _Sums, p: int, held: list[float], limit: float) -> list[range] | None:
    """The V: rank r holds stage r (from the front) and stage 2p-1-r (from the back).
    Ranks are placed from the outside in: `best(r, i, j)` is the least slowest rank among
    ranks r..p-1 when layers i..j-1 are left for them; the last rank's two stages are
    adjacent, layers i..j-1 cut once (where its bytes are least)."""

    def middle(i: int, j: int) -> tuple[float, int]:
        """The last rank's layers i..j-1: its bytes at its best cut, and the cut."""
        return min(
            (sums.bytes(i, c, held[p - 1]) + sums.bytes(c, j, held[p]), c) for c in range(i + 1, j)
        )

    @cache
    def best(r: int, i: int, j: int) -> tuple[float, int, int]:
        if r == p - 1:
            if j - i < 2 or middle(i, j)[0] > limit:
                return _INF, 0, 0
            return sums.seconds(i, j), 0, 0
        need = 2 * (p - r - 1)  # layers the inner ranks need, one per stage
        found = (_INF, 0, 0)
        for a in range(i + 1, j - need):  # the front stage: layers i..a-1
            front = sums.seconds(i, a)
            if front >= found[0]:
                break  # longer fronts only cost more
            for b in range(j - 1, a + need - 1, -1):  # the back stage: layers b..j-1
                mine = front + sums.seconds(b, j)
                if mine >= found[0]:
                    break
                if sums.bytes(i, a, held[r]) + sums.bytes(b, j, held[2 * p - 1 - r]) > limit:
                    continue
                inner = best(r + 1, a, b)[0]
                slowest = max(mine, inner)
                if slowest < found[0]:
                    found = (slowest, a, b)
        return found

    if best(0, 0, sums.n)[0] == _INF:
        return None
    front, back, i, j = [], [], 0, sums.n
    for r in range(p - 1):
        _, a, b = best(r, i, j)
        front.append(range(i, a))
        back.append(range(b, j))
        i, j = a, b
    c = middle(i, j)[1]
    return [*front, range(i, c), range(c, j), *back[::-1]]
