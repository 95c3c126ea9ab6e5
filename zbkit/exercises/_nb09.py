"""Notebook 09's exercises: a 7B's parameters, its plan under a budget, the V's rank 0.

Each checker asks the planner itself, on the closed-form profile of the notebook's
Llama-2-7B (`planner.profile_transformer`, microbatch 1, seq 4096, bfloat16, 400 TFLOP/s,
50 GB/s between replicas): the parameter count, `planner.plan`'s choice on 8 devices of
40 GB, and `planner.partition`'s V split on 8 ranks.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from zbkit.exercises._core import exercise, is_count, schedule_name
from zbkit.planner import Profile, partition, plan, profile_transformer
from zbkit.schedules import SCHEDULES

LLAMA_7B = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
            "num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 11008,
            "vocab_size": 32000, "tie_word_embeddings": False}  # fmt: skip


@cache
def llama_7b() -> Profile:
    return profile_transformer(LLAMA_7B, microbatch=1, seq=4096, dtype="bfloat16",
                               device_tflops=400, bandwidth=50e9)  # fmt: skip


@exercise("09.1", "Llama-2-7B's parameter count (an int), from the profile's layers")
def llama_parameters(answer: Any) -> tuple[bool, str]:
    layers = llama_7b().layers
    want = sum(x.params for x in layers)
    if not is_count(answer):
        return False, f"give a whole number of parameters, such as 7000000000; got {answer!r}"
    embed, block = layers[0].params, layers[1].params
    why = (
        f"the embedding and the untied head hold {embed:,} each (32000 x 4096), each of the "
        f"32 decoder layers {block:,} (4 x 4096^2 for attention, 3 x 4096 x 11008 for the "
        "gated MLP, two norms), the final norm 4,096"
    )
    if answer == want:
        return True, f"{want:,}: {why}."
    if answer == 7 * 10**9:
        return False, "7B is the model's name, rounded: add up the layers' own counts"
    return False, f"{answer:,} is {answer / want - 1:+.1%} off the layers' sum; count {why}"


@exercise("09.2", "the schedule `plan` chooses for the 7B on 8 devices of 40 GB (a name)")
def plan_at_40gb(answer: Any) -> tuple[bool, str]:
    found = plan(llama_7b(), world=8, global_batch=64, memory="40GB")
    chosen = found.chosen
    assert chosen is not None  # 40 GB fits this model
    name, why_not = schedule_name(answer, SCHEDULES, "the schedules")
    if name is None:
        return False, why_not
    runner = next((c for c in found.candidates[1:] if c.schedule != chosen.schedule), None)
    said = (
        f"{chosen.schedule} at pp={chosen.pp}, dp={chosen.dp}, m={chosen.microbatches}: "
        f"{chosen.step_seconds:.2f} s a step, its fullest rank at {chosen.peak_bytes / 1e9:.1f} GB"
    )
    if name == chosen.schedule:
        rest = f"; the next other schedule, {runner.schedule}, {runner.verdict}" if runner else ""
        faster = [c for c in found.candidates
                  if c.prediction is not None and c.step_seconds < chosen.step_seconds]  # fmt: skip
        top = min(faster, key=lambda c: c.step_seconds) if faster else None
        why = (
            f". The plan takes the fastest candidate that fits: {len(faster)} faster ones hold "
            f"more than 40 GB on their fullest rank (the fastest, {top.schedule} at "
            f"pp={top.pp}, needs {top.peak_bytes / 1e9:.1f} GB)"
            if top
            else ". It is the fastest candidate of all, and it fits"
        )
        return True, said + rest + why
    mine = [c for c in found.candidates if c.schedule == name and c.prediction is not None]
    if not mine:
        return False, f"{name} was not built for these sizes: read its rows in the table"
    best = mine[0]
    if best.peak_bytes > 40e9:
        idea = (
            "it holds more than 40 GB on its fullest rank, and the plan ranks only what fits: "
            "a budget rules a schedule out by the activations and W state it keeps"
        )
    else:
        idea = "it fits, but another schedule that fits is faster, and the plan takes the fastest"
    return (
        False,
        f"{name}'s best row (pp={best.pp}, m={best.microbatches}) says {best.verdict!r}: {idea}",
    )


@exercise("09.3", "how many decoder layers the balanced V puts on rank 0 of 8 (an int)")
def v_rank_zero(answer: Any) -> tuple[bool, str]:
    prof = llama_7b()
    part = partition(prof, 16, placement="v", pp=8)
    last = len(prof) - 1
    held = [i for s, r in enumerate(part.stage_to_rank) if r == 0 for i in part.stages[s]]
    decoders = [i for i in held if 1 <= i <= last - 2]  # not the embedding, norm or head
    want = len(decoders)
    if not is_count(answer):
        return False, f"give a whole number of decoder layers, such as 4; got {answer!r}"
    decoders_of = [
        sum(1 for s, r in enumerate(part.stage_to_rank) if r == k for i in part.stages[s]
            if 1 <= i <= last - 2)
        for k in range(8)
    ]  # fmt: skip
    one = prof.layers[1]  # a decoder layer's F + I + W, what a rank's time adds up
    per_decoder = sum(t.median for t in (one.forward, one.input_grad, one.weight_grad))
    head = prof.layers[last].forward.median / one.forward.median
    why = (
        f"{want}: {_how_many(decoders_of.count(want))} hold {want} decoder layers of the "
        f"{last - 2}. Rank 0 also holds the embedding and the head (the head's F alone "
        f"is {head:.1f} decoder layers' worth), so it is the slowest at "
        f"{part.seconds[0] * 1e3:.1f} ms; but moving a decoder off it would give another rank "
        f"{want + 1}, {(want + 1) * per_decoder * 1e3:.1f} ms, slower still. The slowest rank "
        "sets the pace"
    )
    if answer == want:
        return True, why
    if answer < want:
        return False, (
            f"not {answer}: rank 0 holds both ends of the V, but taking a decoder off it puts "
            "one more on another rank, which then becomes the slowest; count the layers in its "
            "two stages (partition's stages and stage_to_rank), less the embedding, norm and head"
        )
    return False, (
        f"not {answer}: the V balances time per rank, and rank 0's two stages already carry "
        "the embedding and the head; count the layers in its two stages (partition's stages "
        "and stage_to_rank), less the embedding, the final norm and the head"
    )


def _how_many(ranks: int) -> str:
    return "all 8 ranks" if ranks == 8 else f"{ranks} of the 8 ranks"
