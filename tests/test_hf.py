"""`zbkit.hf`: HF decoder-only models as layers, in a pipeline, against HF's own loss and
gradients in one process (tiny configs, nothing downloaded)."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

transformers = pytest.importorskip("transformers")

from zbkit import hf, planner  # noqa: E402
from zbkit.launch import launch  # noqa: E402
from zbkit.pipeline import LocalPipeline  # noqa: E402
from zbkit.planner import Chain  # noqa: E402
from zbkit.schedules import build_schedule  # noqa: E402

VOCAB, ROWS, SEQ, PAD, M = 64, 8, 8, 0, 4
SMALL = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, vocab_size=VOCAB,
             num_hidden_layers=4, num_key_value_heads=2, pad_token_id=PAD)  # fmt: skip


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=4, n_head=4, n_positions=SEQ, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=PAD,
        )  # fmt: skip
        return transformers.GPT2LMHeadModel(config)
    extra: dict = {"tie_word_embeddings": name == "llama-tied"}
    if name == "mistral":
        extra["sliding_window"] = 4  # shorter than SEQ: the window matters
    if name == "mixtral":
        extra |= dict(num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=0.0)
    family = {"llama": "Llama", "llama-tied": "Llama", "mistral": "Mistral", "qwen2": "Qwen2",
              "mixtral": "Mixtral"}[name]  # fmt: skip
    config = getattr(transformers, f"{family}Config")(**SMALL, **extra)
    config._attn_implementation = "sdpa"
    return getattr(transformers, f"{family}ForCausalLM")(config)


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids, HF's attention mask (two rows padded at the end) and HF's labels."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (ROWS, SEQ), generator=g)
    ids[[1, 6], -3:] = PAD  # microbatches 0 and 3 hold padding, 1 and 2 none
    mask = (ids != PAD).long()
    labels = ids.masked_fill(ids == PAD, -100)
    return ids, mask, labels


def _shifted(labels: torch.Tensor) -> torch.Tensor:
    """HF's causal LM predicts the next token: its labels, shifted left, as targets."""
    return torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)


@pytest.mark.parametrize("name", ["llama", "llama-tied", "mistral", "qwen2", "mixtral", "gpt2"])
def test_layers_in_a_pipeline_give_hfs_loss_and_gradients(name):
    ids, mask, labels = _batch()
    model = _model(name)
    ref = model(input_ids=ids, attention_mask=mask, labels=labels)
    ref.loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    parts = hf.layers(model)
    assert len(parts) == 4 + 3  # embedding, 4 decoder layers, norm, head
    with torch.no_grad():
        logits = Chain(parts)(input_ids=ids, attention_mask=mask)
    assert torch.allclose(logits, ref.logits, atol=1e-5)

    stages = [Chain(parts[:3]), Chain(parts[3:])]
    targets = _shifted(labels)
    pipe = LocalPipeline(stages, build_schedule("zb-h1", pp=2, microbatches=M),
                         hf.TokenMeanLoss(targets), scale_grads=False)  # fmt: skip
    losses = pipe.step({"input_ids": ids, "attention_mask": mask}, targets)
    assert torch.stack(losses).sum().item() == pytest.approx(ref.loss.item(), abs=1e-5)
    for n, p in model.named_parameters():
        assert torch.allclose(p.grad, want[n], atol=1e-5), (name, n)


def test_a_mean_of_microbatch_means_is_not_hfs_loss_and_the_token_mean_is():
    ids, mask, labels = _batch()
    model = _model("llama")
    ref = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    targets = _shifted(labels)
    with torch.no_grad():
        logits = Chain(hf.layers(model))(input_ids=ids, attention_mask=mask)
    loss = hf.TokenMeanLoss(targets)
    parts = [loss(logits[i : i + 2], targets[i : i + 2]) for i in range(0, ROWS, 2)]
    assert sum(parts).item() == pytest.approx(ref.item(), abs=1e-6)
    means = [
        torch.nn.functional.cross_entropy(
            logits[i : i + 2].flatten(0, 1), targets[i : i + 2].flatten()
        )
        for i in range(0, ROWS, 2)
    ]
    assert abs(sum(means).item() / len(means) - ref.item()) > 1e-4  # padding weighs otherwise


def test_the_layers_profile():
    ids, mask, labels = _batch()
    model = _model("llama-tied")
    sample = ({"input_ids": ids[:2], "attention_mask": mask[:2]}, _shifted(labels)[:2])
    prof = planner.profile(hf.layers(model), sample, loss_fn=hf.TokenMeanLoss(sample[1]))
    assert len(prof) == 7 and prof.layers[-1].output_bytes == 2 * SEQ * VOCAB * 4
    # the tied head's weight is the embedding's: measured with each, counted once where one
    # rank holds both (the V puts the first and the last stage on rank 0)
    weight = VOCAB * 32 * 4
    assert prof.layers[-1].param_bytes == prof.layers[0].param_bytes == weight
    assert prof.layers[-1].shared == ((0, weight, 2 * weight + 4),)
    v = planner.predict(prof, "zb-v", pp=2, microbatches=2)
    assert v.schedule.stage_to_rank == [0, 1, 1, 0]
    mine = [i for s, part in enumerate(v.stages) if s in (0, 3) for i in part]
    assert v.ranks[0].parameters == sum(prof.layers[i].param_bytes for i in mine) - weight
    distinct = {id(p) for i in mine for p in hf.layers(model)[i].parameters()}
    params = dict((id(p), p) for p in model.parameters())
    assert v.ranks[0].parameters == sum(params[k].numel() * 4 for k in distinct)
    one = planner.predict(prof, "1f1b", pp=2, microbatches=2)  # embedding and head apart
    assert one.ranks[1].parameters == sum(prof.layers[i].param_bytes for i in one.stages[1])


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="takes a Hugging Face causal LM"):
        hf.layers(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="every target is ignore_index"):
        hf.TokenMeanLoss(torch.full((2, 3), -100))


def test_tied_names_the_weights_a_model_ties():
    model = _model("llama-tied")
    assert hf.tied(model) == {"lm_head.weight": model.lm_head.weight}
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert hf.tied(_model("llama")) == {}
    gpt = _model("gpt2")
    assert hf.tied(gpt)["lm_head.weight"] is gpt.transformer.wte.weight


def _torch_pipelines() -> dict[str, tuple[float | None, dict[str, torch.Tensor]]]:
    """On this rank: llama (untied) and GPT-2 (its head tied to the embedding) under torch's
    own PipelineStage, Schedule1F1B on two stages and ScheduleZBVZeroBubble on four (the V:
    rank 0 holds the first and the last); per case the loss summed over microbatches (on
    the rank holding the last stage) and this rank's gradients by HF's names."""
    # torch's pipelining is imported in the rank, where a process group exists
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleZBVZeroBubble

    rank, cpu, out = dist.get_rank(), torch.device("cpu"), {}
    ids, mask, labels = _batch()
    targets = _shifted(labels)
    for name in ("llama", "gpt2"):
        for which in ("1f1b", "zbv"):
            model = _model(name)
            parts = hf.layers(model)
            if which == "1f1b":
                cuts, here = [parts[:3], parts[3:]], [rank]
            else:
                cuts, here = [parts[:2], parts[2:3], parts[3:5], parts[5:]], [rank, 3 - rank]
            stages = [PipelineStage(Chain(cuts[s]), s, len(cuts), cpu) for s in here]
            kind = Schedule1F1B if which == "1f1b" else ScheduleZBVZeroBubble
            loss = hf.TokenMeanLoss(targets)
            schedule = kind(stages if which == "zbv" else stages[0], M, loss_fn=loss,
                            scale_grads=False)  # fmt: skip
            losses: list[torch.Tensor] = []
            last = len(cuts) - 1 in here
            schedule.step(*((ids, mask) if 0 in here else ()),
                          **({"target": targets, "losses": losses} if last else {}))  # fmt: skip
            grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
            out[f"{name} {which}"] = (sum(x.item() for x in losses) if last else None, grads)
    return out


def _tie(model) -> torch.Tensor | None:
    """The weight `model`'s head shares with its embedding (GPT-2's), or None."""
    return next(iter(hf.tied(model).values()), None)


@pytest.mark.multiprocess
def test_the_layers_run_under_torchs_own_pipelining_with_hfs_loss_and_gradients():
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ranks = launch(_torch_pipelines, nprocs=2, timeout=600)
    ids, mask, labels = _batch()
    for name in ("llama", "gpt2"):
        model = _model(name)
        ref = model(input_ids=ids, attention_mask=mask, labels=labels)
        ref.loss.backward()
        for which in ("1f1b", "zbv"):
            found = [rank[f"{name} {which}"] for rank in ranks]
            assert sum(x for x, _ in found if x is not None) == pytest.approx(ref.loss.item())
            for n, p in model.named_parameters():
                parts = [g[n] for _, g in found if n in g]
                if which == "1f1b" and p is _tie(model):
                    # the tie split over two ranks: each copy has its own stage's part
                    # (the doctor's shared-param-across-ranks); together they are HF's
                    assert len(parts) == 2 and not torch.allclose(parts[0], p.grad, atol=1e-3)
                    assert torch.allclose(parts[0] + parts[1], p.grad, atol=1e-5)
                else:
                    assert len(parts) == 1 and torch.allclose(parts[0], p.grad, atol=1e-5), n
