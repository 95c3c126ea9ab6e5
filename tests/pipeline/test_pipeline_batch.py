"""A step's batch is checked before it is cut into microbatches (issue 15).

Inputs of 8 rows with targets of 4 used to be cut separately (microbatch j: rows 2j..2j+1
of x against row j of y) and broadcast inside the loss without a word. Both executors now
run the same check; a good batch is cut into equal microbatches (what stage 0 and the loss
are given, in order, is the batch) and still gives the full-batch autograd gradients.
"""

from __future__ import annotations

import pytest
import torch
from pipeline_models import (
    First,
    assert_grads_match,
    batch,
    loss_fn,
    make_stages,
    one_rank_group,
    oracle,
    schedule,
)
from torch import nn

from zbkit.pipeline import LocalPipeline, PipelineStage, ScheduleRunner

M = 4  # microbatches
MISMATCH = (
    r"targets has 4 rows but inputs has 8: every tensor of a batch must have the same "
    r"first dimension"
)


def bad_batches() -> list[tuple[str, object, object, type, str]]:
    """(case, inputs, targets, exception, message) for every batch that must be refused."""
    x, y = batch(8)
    return [
        ("rows differ", x, y[:4], ValueError, MISMATCH),
        ("rows differ in a dict", {"x": x, "mask": x[:6]}, y, ValueError,
         r"inputs\['mask'\] has 6 rows but inputs\['x'\] has 8"),
        ("rows differ, neither divisible", x[:6], y[:5], ValueError,
         "targets has 5 rows but inputs has 6"),
        ("not divisible", x[:6], y[:6], ValueError,
         r"inputs has 6 rows, which do not split into 4 equal microbatches"),
        ("fewer rows than microbatches", x[:2], y[:2], ValueError,
         r"inputs has 2 rows, which do not split into 4"),
        ("empty batch", x[:0], y[:0], ValueError, r"inputs has 0 rows, which do not split"),
        ("0-d tensor", {"x": x, "t": torch.tensor(0.5)}, y, ValueError,
         r"inputs\['t'\] is a 0-d tensor: it has no rows"),
        ("empty dict", {}, y, ValueError, "inputs is an empty dict"),
        ("a list", x, [y], TypeError, "targets must be a tensor, a tuple or a dict.*got list"),
        ("only Nones", (None, None), y, ValueError, "inputs is a tuple without a tensor"),
        ("a string in a tuple", (x, "mask"), y, TypeError, r"inputs\[1\] must be a tensor"),
    ]  # fmt: skip


@pytest.mark.parametrize("case", [c[0] for c in bad_batches()])
def test_local_pipeline_refuses_a_batch_that_does_not_split_alike(case: str) -> None:
    _, inputs, targets, exc, message = next(c for c in bad_batches() if c[0] == case)
    pipe = LocalPipeline(make_stages(4), schedule("1f1b", 4, M), loss_fn)
    with pytest.raises(exc, match=message):
        pipe.step(inputs, targets)
    assert all(st.held_activations == 0 for st in pipe.stages)  # refused before any forward


class Noted(nn.Module):
    """Stage 0 that notes the microbatch it is given (`x` and a nested dict), then runs
    `First` on its `x`."""

    def __init__(self) -> None:
        super().__init__()
        self.first = First()
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, x: torch.Tensor, extra: dict) -> dict:
        self.seen.append((x.detach(), extra["ids"]))
        return self.first(x)


def test_a_good_batch_splits_into_equal_parts_and_matches_autograd() -> None:
    x, y = batch(8)
    noted, targets = Noted(), []

    def noting_loss(out: dict, target: torch.Tensor) -> torch.Tensor:
        targets.append(target)
        return loss_fn(out, target)

    pipe = LocalPipeline([noted, *make_stages(4)[1:]], schedule("1f1b", 4, M), noting_loss)
    pipe.step({"x": x, "extra": {"ids": x[:, 0]}}, y)
    # 1F1B: stage 0 and the loss see microbatches 0..3 in order; microbatch j is rows 2j, 2j+1
    assert [len(part) for part, _ in noted.seen] == [len(t) for t in targets] == [2] * M
    assert torch.equal(torch.cat([part for part, _ in noted.seen]), x)
    assert all(torch.equal(ids, part[:, 0]) for part, ids in noted.seen)  # the nested dict too
    assert torch.equal(torch.cat(targets), y)
    mods = make_stages(4)
    _, expected = oracle(mods, x, y)
    LocalPipeline(mods, schedule("1f1b", 4, M), loss_fn).step(x, y)
    assert_grads_match(mods, expected, "1f1b after the batch check")


def test_schedule_runner_runs_the_same_check_on_a_one_rank_group() -> None:
    # zb-v with pp=1: stages 0 and 1 on the one rank, so it holds inputs and targets
    with one_rank_group():
        sch = schedule("zb-v", 1, M)
        mods = make_stages(sch.num_stages)
        stages = [PipelineStage(m, s, sch.num_stages) for s, m in enumerate(mods)]
        runner = ScheduleRunner(sch, stages, loss_fn, timeout=120)
        x, y = batch(8)
        for case, inputs, targets, exc, message in bad_batches():
            with pytest.raises(exc, match=message):
                runner.step(inputs, targets=targets)
            assert all(st.held_activations == 0 for st in stages), case
        _, expected = oracle(mods, x, y)
        runner.step(x, targets=y)
        assert_grads_match(mods, expected, "zb-v pp=1 runner")
