"""`planner.partition`: the slowest rank's time against brute force over every set of cut
points (linear and V), under a memory limit too; the naive split beside it; bad input."""

from __future__ import annotations

import random
from itertools import combinations

import pytest

from zbkit import planner
from zbkit.planner import LayerProfile, Profile, Timing


def _profile(works: list[float], static: list[int], act: list[int]) -> Profile:
    layers = tuple(
        LayerProfile(
            f"{i}",
            Timing(w, w, w),
            Timing(w, w, w),
            Timing(w, w, w),
            activation_bytes=a,
            weight_state_bytes=0,
            param_bytes=s,
            grad_bytes=0,
            optimizer_bytes=0,
            output_bytes=1,
            params=1,
            forward_extra_bytes=0,
            input_grad_extra_bytes=0,
            weight_grad_extra_bytes=0,
            step=Timing(0, 0, 0),
            step_bytes=0,
        )  # fmt: skip
        for i, (w, s, a) in enumerate(zip(works, static, act, strict=True))
    )
    return Profile(layers, device="cpu", dtype="float32")


def _all_splits(n: int, stages: int):
    for cuts in combinations(range(1, n), stages - 1):
        edges = [0, *cuts, n]
        yield [range(a, b) for a, b in zip(edges, edges[1:], strict=False)]


def _brute(prof: Profile, stages: int, where: list[int], held: list[int], memory: float):
    """The least slowest rank (3 x the layers' work, F + I + W) over every split that fits."""
    best = float("inf")
    for parts in _all_splits(len(prof), stages):
        secs = [0.0] * (max(where) + 1)
        nbytes = [0] * (max(where) + 1)
        for s, part in enumerate(parts):
            for i in part:
                layer = prof.layers[i]
                secs[where[s]] += 3 * layer.forward.median
                nbytes[where[s]] += layer.param_bytes + held[s] * layer.activation_bytes
        if max(nbytes) <= memory:
            best = min(best, max(secs))
    return best


@pytest.mark.parametrize("placement", ["linear", "v"])
@pytest.mark.parametrize("seed", range(12))
def test_the_partition_is_the_brute_force_optimum(placement, seed):
    rng = random.Random(seed)
    n = rng.randint(5, 9)
    stages = rng.choice([2, 4]) if placement == "v" else rng.randint(2, 4)
    works = [rng.choice([0.5, 1.0, 2.0, 5.0]) * rng.random() + 0.01 for _ in range(n)]
    static = [rng.randint(1, 100) for _ in range(n)]
    act = [rng.randint(1, 20) for _ in range(n)]
    prof = _profile(works, static, act)
    where = planner.partition(prof, stages, placement=placement).stage_to_rank
    held = [stages - s for s in range(stages)]
    free = _brute(prof, stages, where, held, float("inf"))
    got = planner.partition(prof, stages, placement=placement)
    assert got.slowest == pytest.approx(free)
    assert [i for p in got.stages for i in p] == list(range(n))
    # under a limit between the least any split needs and what the unlimited one needs
    tight = (min(got.bytes) + max(got.bytes)) // 2 if len(set(got.bytes)) > 1 else None
    if tight is not None:
        limited = _brute(prof, stages, where, held, tight)
        if limited == float("inf"):
            with pytest.raises(ValueError, match="no split of the"):
                planner.partition(prof, stages, placement=placement, memory=tight)
        else:
            fit = planner.partition(prof, stages, placement=placement, memory=tight)
            assert fit.slowest == pytest.approx(limited)
            assert max(fit.bytes) <= tight


def test_the_v_balances_per_rank_with_the_head_and_embedding_on_rank_0():
    # a heavy embedding and head (5) and six light blocks (1): linear puts the head alone
    # on the last rank; the V pairs it with the embedding on rank 0
    works = [5.0, 1, 1, 1, 1, 1, 1, 5.0]
    prof = _profile(works, [1] * 8, [1] * 8)
    v = planner.partition(prof, 4, placement="v")
    assert v.stage_to_rank == [0, 1, 1, 0]
    assert v.stages[0].start == 0 and v.stages[-1].stop == 8
    assert v.slowest == pytest.approx(3 * 10.0)  # 5 + 5 on rank 0, the 6 blocks on rank 1
    # the naive split (2 layers per stage): rank 0 holds 5+1 and 1+5
    assert v.naive_seconds == pytest.approx([3 * 12.0, 3 * 4.0])
    assert v.speedup == pytest.approx(12.0 / 10.0)


def test_balanced_is_never_slower_than_equal_layers_and_the_table_says_both():
    prof = _profile([1.0, 1, 1, 1, 1, 8.0], [1] * 6, [1] * 6)
    got = planner.partition(prof, 3)
    assert got.slowest <= max(got.naive_seconds)
    assert got.stages[-1] == range(5, 6) and got.slowest == pytest.approx(3 * 8.0)  # the head alone
    text = str(got)
    assert "5 " in text and "equal layers" in text and f"({got.speedup:.2f}x)" in text
    assert "<table>" in got._repr_html_()


def test_looped_puts_stage_s_on_rank_s_mod_pp():
    prof = _profile([1.0] * 8, [1] * 8, [1] * 8)
    got = planner.partition(prof, 4, placement="looped", pp=2)
    assert got.stage_to_rank == [0, 1, 0, 1]
    assert got.seconds == pytest.approx([12.0, 12.0])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"stages": 9}, "9 stages but 4 layers"),
        ({"stages": 3, "placement": "v"}, "even number of stages"),
        ({"stages": 2, "placement": "zigzag"}, "placement is one of linear, v, looped"),
        ({"stages": 4, "placement": "looped"}, "looped needs pp"),
        ({"stages": 2, "memory": -1}, "memory is bytes per rank"),
        ({"stages": 2, "memory": 3}, r"no split of the 4 layers into 2 linear stages fits"),
        ({"stages": 2, "held": [1]}, "held has 1 counts"),
        ({"stages": 0}, "stages must be an int >= 1"),
    ],
)
def test_bad_input_gets_one_clear_line(kwargs, match):
    prof = _profile([1.0] * 4, [10] * 4, [1] * 4)
    with pytest.raises(ValueError, match=match):
        planner.partition(prof, **kwargs)
