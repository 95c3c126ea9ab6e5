"""No finding on a correct setup: a finding here is a doctor bug.

The doctor stays silent on
- the examples' pipelines, built from the examples' own pieces (examples/_gpt.py's model,
  data and loss, each script's schedule, stage split and placement);
- the pipeline tests' models (tests/pipeline/pipeline_models.py under every zbkit schedule,
  real_code_models.py's tuple and None forms);
- tiny Hugging Face models (GPT-2, Llama with tied embeddings, Mistral, Qwen2, BERT) cut into
  plain nn.Module stages: under zbkit's schedules (exact, tied embeddings too), and, untied,
  under torch's own schedules and split.

Every check starts with half the parameters holding a `.grad` and must leave every `.grad`
as it was: the same tensor, the same values (and None where it was None).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed.pipelining.schedules as torch_schedules
from torch import nn
from torch.distributed.pipelining import PipelineStage as TorchStage

import zbkit.doctor
from zbkit.models import split_stages
from zbkit.pipeline import PipelineStage
from zbkit.schedules import SCHEDULES, Schedule, build_schedule

TESTS = Path(__file__).resolve().parents[1]
EXAMPLES = TESTS.parent / "examples"


@pytest.fixture
def load(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path, str], ModuleType]:
    """`load(folder, name)`: a module of examples/ or tests/pipeline/, imported as the
    scripts and tests there import each other (their folder on sys.path)."""

    def imported(folder: Path, name: str) -> ModuleType:
        monkeypatch.syspath_prepend(str(folder))
        return importlib.import_module(name)

    return imported


def _modules(stages: list[Any]) -> list[nn.Module]:
    return [getattr(s, "submod", getattr(s, "module", s)) for s in stages]


def silent(
    stages: list[Any], schedule: Any, traced: bool = True, **given: Any
) -> zbkit.doctor.Report:
    """`check` finds nothing, and leaves every `.grad` as it was. `traced`: every stage's
    graph was checked (False: one rank's share, whose later stages' inputs come from others)."""
    params = list({id(p): p for m in _modules(stages) for p in m.parameters()}.values())
    for i, p in enumerate(params):  # every other one with a gradient already there
        p.grad = torch.full_like(p, float(i)) if i % 2 == 0 else None
    before = [(p.grad, None if p.grad is None else p.grad.clone()) for p in params]
    report = zbkit.doctor.check(stages, schedule, **given)
    assert report.ok, f"a finding on a correct setup (a doctor bug):\n{report}"
    assert not traced or not report.skipped, report
    for p, (grad, value) in zip(params, before, strict=True):
        assert p.grad is grad, "the doctor replaced a .grad"
        assert value is None or torch.equal(p.grad, value), "the doctor changed a .grad"
    return report


# ---------------------------------------------------------------- the examples
@pytest.mark.parametrize("name", SCHEDULES)
def test_pipeline_gpt(name: str, load) -> None:
    """examples/pipeline_gpt.py (pp 2, 8 microbatches, 32 rows): the whole model, and each
    rank's PipelineStages as that rank builds them for ScheduleRunner."""
    gpt, example = load(EXAMPLES, "_gpt"), load(EXAMPLES, "pipeline_gpt")
    schedule = build_schedule(name, pp=2, microbatches=8)
    parts = split_stages(gpt.build_model(), schedule.num_stages)
    x, y = gpt.counting_batch(32, 0)
    batch = dict(inputs=x, target=y, loss_fn=example.loss_fn)
    silent(parts, schedule, **batch)
    n = schedule.num_stages
    for rank in range(schedule.pp):
        mine = [PipelineStage(parts[s], s, n) for s in schedule.stages_on(rank)]
        silent(mine, schedule, traced=False, rank=rank, **batch)


@pytest.mark.parametrize("runtime", ["torch+zbkit", "torch"])
def test_torch_pipelining_gpt(runtime: str, load) -> None:
    """examples/torch_pipelining_gpt.py (2 ranks, 8 microbatches), every schedule class it
    offers: inside exact_split_backward() as the script runs, and on torch's own split."""
    gpt, example = load(EXAMPLES, "_gpt"), load(EXAMPLES, "torch_pipelining_gpt")
    x, y = gpt.counting_batch(32, 0)
    for name in example.TORCH_SCHEDULES:
        cls = getattr(torch_schedules, name)
        n = Schedule.from_torch(cls, pp=2, microbatches=8).num_stages
        parts = [gpt.TensorOut(p) for p in split_stages(gpt.build_model(), n)]
        silent(parts, cls, pp=2, microbatches=8, runtime=runtime, inputs=x, target=y,
               loss_fn=gpt.cross_entropy)  # fmt: skip


def test_torch_pipelining_gpt_on_one_rank(gloo_world, load) -> None:
    """The same script's objects on a world of one rank: torch's PipelineStages and schedule
    objects (the V classes put both stages on rank 0; the others hold the whole model)."""
    gpt, example = load(EXAMPLES, "_gpt"), load(EXAMPLES, "torch_pipelining_gpt")
    x, y = gpt.counting_batch(32, 0)
    for name in example.TORCH_SCHEDULES:
        cls = getattr(torch_schedules, name)
        placed = Schedule.from_torch(cls, pp=1, microbatches=8)
        n, mine = placed.num_stages, placed.stages_on(0)
        parts = split_stages(gpt.build_model(), n)
        stages = [TorchStage(gpt.TensorOut(parts[s]), s, n, torch.device("cpu")) for s in mine]
        schedule = cls(stages if len(stages) > 1 else stages[0], 8, loss_fn=gpt.cross_entropy)
        silent(stages, schedule, inputs=x, target=y, loss_fn=gpt.cross_entropy)


def test_ddp_accumulation(gloo_world, load) -> None:
    """examples/ddp_accumulation.py builds no pipeline: its DDP model accumulates 4
    micro-batches of 8 rows per optimizer step. As a pipeline that is one stage under torch's
    GPipe (the first backwards under no_sync, as backend.accumulate runs them); the model
    is prepared as the script prepares it, and still trains afterwards."""
    from zbkit.parallel import create_backend

    gpt = load(EXAMPLES, "_gpt")
    model = gpt.build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    backend = create_backend("ddp", grad_accum_steps=4)
    model, optimizer, _, _ = backend.prepare(model, optimizer)
    x, y = gpt.counting_batch(4 * 8, 0)
    given = dict(inputs=x, target=y, loss_fn=gpt.cross_entropy)
    silent([model], torch_schedules.ScheduleGPipe, pp=1, microbatches=4, **given)
    stage = TorchStage(model, 0, 1, torch.device("cpu"))
    silent([stage], torch_schedules.ScheduleGPipe(stage, 4, loss_fn=gpt.cross_entropy), **given)
    optimizer.zero_grad(set_to_none=True)
    for xs, ys in zip(x.tensor_split(4), y.tensor_split(4), strict=True):  # the script's loop
        with backend.accumulate(model):
            backend.backward(gpt.cross_entropy(model(xs), ys))
            optimizer.step()
            optimizer.zero_grad()
    assert backend.optimizer_steps == 1


# ---------------------------------------------------------------- the pipeline tests' models
@pytest.mark.parametrize("pp,m", [(4, 4), (4, 8), (3, 6), (2, 2)])
def test_pipeline_models_under_every_schedule(pp: int, m: int, load) -> None:
    models = load(TESTS / "pipeline", "pipeline_models")
    for name in models.ALL_SCHEDULES:
        schedule = models.schedule(name, pp, m)
        mods = models.make_stages(schedule.num_stages)
        x, y = models.batch(3 * schedule.microbatches)
        given = dict(inputs=x, target=y, loss_fn=models.loss_fn)
        silent(mods, schedule, **given)
        first = PipelineStage(mods[0], 0, schedule.num_stages, split_first_stage=True)
        silent([first, *mods[1:]], schedule, **given)


def test_real_code_models(load) -> None:
    rc = load(TESTS / "pipeline", "real_code_models")
    x, y = rc.data()
    bias, mask = torch.randn(4, rc.D), (torch.randn(4, rc.D) > 0).float()
    cases = [  # (stages, one step's inputs)
        (rc.two_stages(), x),
        ([rc.WithPast(), rc.TakesPast()], x),  # a None in a tuple
        ([rc.EndsWithNone(), rc.TakesTwo()], x),
        ([rc.TwoInputs(), nn.Linear(rc.D, 1)], (x, bias, mask)),  # several inputs
    ]
    for mods, inputs in cases:
        for schedule in (build_schedule("zb-h1", pp=2, microbatches=2),
                         build_schedule("zb-v", pp=1, microbatches=2)):  # fmt: skip
            silent(mods, schedule, inputs=inputs, target=y, loss_fn=nn.functional.mse_loss)
    for cls in (torch_schedules.ScheduleZBVZeroBubble, torch_schedules.Schedule1F1B):
        silent(rc.two_stages(), cls, pp=1 if cls is torch_schedules.ScheduleZBVZeroBubble else 2,
               microbatches=2, inputs=x, target=y, loss_fn=nn.functional.mse_loss)  # fmt: skip


# ---------------------------------------------------------------- Hugging Face models
class HFStage(nn.Module):
    """Layers of an HF model as one stage: the embedding first on stage 0, the norm and
    head last on the last stage. Hidden states (b, t, dim) in and out; logits at the end."""

    def __init__(self, embed, layers, head, rotary) -> None:
        super().__init__()
        self.embed, self.layers, self.head, self.rotary = embed, nn.ModuleList(layers), head, rotary

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) if self.embed is not None else x  # ids (b, t) -> (b, t, dim)
        for layer in self.layers:
            if self.rotary is not None:  # Llama, Mistral, Qwen2: rotary position embeddings
                pos = torch.arange(h.shape[1])[None].expand(h.shape[0], -1)  # (b, t)
                h = layer(h, position_embeddings=self.rotary(h, pos), position_ids=pos)
            else:
                h = layer(h)
            h = h[0] if isinstance(h, tuple) else h
        return self.head(h) if self.head is not None else h  # (b, t, vocab) on the last stage


class GPT2Embed(nn.Module):
    """GPT2Model's start: token plus position embedding, then dropout."""

    def __init__(self, transformer) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = transformer.wte, transformer.wpe, transformer.drop

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.drop(self.wte(ids) + self.wpe(torch.arange(ids.shape[1])))


SMALL = dict(vocab_size=64, num_hidden_layers=4, hidden_size=32, intermediate_size=64,
             num_attention_heads=4)  # fmt: skip
DECODER = dict(SMALL, num_key_value_heads=2)
FAMILIES = {  # family -> its config; Llama tied on purpose (its default is untied)
    "gpt2": dict(n_layer=4, n_embd=32, n_head=4, vocab_size=64, n_positions=16, bos_token_id=0,
                 eos_token_id=0),
    "llama": dict(DECODER, tie_word_embeddings=True),
    "mistral": DECODER,
    "qwen2": DECODER,
    "bert": dict(SMALL, max_position_embeddings=16),
}  # fmt: skip
TIED = ("gpt2", "llama", "bert")  # input and output embedding one parameter


def hf_stages(family: str, n: int, untie: bool = False) -> list[HFStage]:
    """The family's tiny model (its default tying; `untie`: none) cut into n stages."""
    transformers = pytest.importorskip("transformers")  # a [dev] dependency
    config = dict(FAMILIES[family], **({"tie_word_embeddings": False} if untie else {}))
    torch.manual_seed(0)
    if family == "gpt2":
        lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config))
        t = lm.transformer
        embed, layers, head, rotary = GPT2Embed(t), t.h, nn.Sequential(t.ln_f, lm.lm_head), None
    elif family == "bert":
        lm = transformers.BertForMaskedLM(transformers.BertConfig(**config))
        embed, layers, head, rotary = lm.bert.embeddings, lm.bert.encoder.layer, lm.cls, None
    else:
        name = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}[family]
        lm = getattr(transformers, f"{name}ForCausalLM")(
            getattr(transformers, f"{name}Config")(**config)
        )
        embed, layers, rotary = lm.model.embed_tokens, lm.model.layers, lm.model.rotary_emb
        head = nn.Sequential(lm.model.norm, lm.lm_head)
    tied = lm.get_output_embeddings().weight is lm.get_input_embeddings().weight
    assert tied == (family in TIED and not untie), family
    per = len(layers) // n
    return [HFStage(embed if s == 0 else None, list(layers)[s * per:(s + 1) * per],
                    head if s == n - 1 else None, rotary) for s in range(n)]  # fmt: skip


def ce(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())  # (b*t, vocab)


def ids() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randint(64, (8, 8), generator=g), torch.randint(64, (8, 8), generator=g)


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_models_under_zbkit_schedules(family: str) -> None:
    """zbkit's runtimes are exact, a tied embedding included where one rank holds both the
    embedding and the head (the V's stages 0 and 2p-1 on rank 0); untied, under a linear
    placement too. Tied under a linear placement the doctor must speak: each rank would hold
    its own copy of the table (tests/doctor/test_doctor_modules.py shows it on real ranks)."""
    x, y = ids()
    for name, pp in (("zb-v", 2), ("zb-v", 1), ("dualpipev", 2)):
        schedule = build_schedule(name, pp=pp, microbatches=4)
        stages = hf_stages(family, schedule.num_stages)
        silent(stages, schedule, inputs=x, target=y, loss_fn=ce)
    linear = build_schedule("zb-h1", pp=2, microbatches=4)
    silent(hf_stages(family, 2, untie=True), linear, inputs=x, target=y, loss_fn=ce)
    report = zbkit.doctor.check(hf_stages(family, 2), linear, inputs=x, target=y, loss_fn=ce)
    want = ["shared-param-across-ranks"] if family in TIED else []
    assert report.traps() == want, report


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_models_under_torch_schedules(family: str, gloo_world) -> None:
    """Untied, torch's own split: its schedule objects on one rank (1F1B holding the whole
    model; the interleaved zero-bubble and ZBV both stages), and classes for 2 ranks."""
    x, y = ids()
    for cls in (torch_schedules.Schedule1F1B, torch_schedules.ScheduleInterleavedZeroBubble,
                torch_schedules.ScheduleZBVZeroBubble):  # fmt: skip
        n = Schedule.from_torch(cls, pp=1, microbatches=4).num_stages
        mods = hf_stages(family, n, untie=True)
        stages = [TorchStage(m, s, n, torch.device("cpu")) for s, m in enumerate(mods)]
        schedule = cls(stages if n > 1 else stages[0], 4, loss_fn=ce)
        silent(stages, schedule, inputs=x, target=y, loss_fn=ce)
    for cls in (torch_schedules.Schedule1F1B, torch_schedules.ScheduleDualPipeV):
        n = Schedule.from_torch(cls, pp=2, microbatches=4).num_stages
        silent(hf_stages(family, n, untie=True), cls, pp=2, microbatches=4, inputs=x, target=y,
               loss_fn=ce)  # fmt: skip
    if family in TIED:
        # not silent where it must speak: tied, torch's ZBV puts both stages on rank 0 and
        # divides the embedding's .grad once per stage
        tied = [
            TorchStage(m, s, 2, torch.device("cpu")) for s, m in enumerate(hf_stages(family, 2))
        ]
        zbv = torch_schedules.ScheduleZBVZeroBubble(tied, 4, loss_fn=ce)
        report = zbkit.doctor.check(tied, zbv, inputs=x, target=y, loss_fn=ce)
        assert report.traps() == ["shared-param-scaled-twice"], report
