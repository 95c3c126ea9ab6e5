"""ScheduleRunner on real ranks (4 gloo processes; NCCL when 4 GPUs are there).

Process start-up dominates (~10 s per launch on a busy 2-core machine), so each launch
checks many cases inside and returns a report that the assertions here read.
"""

from __future__ import annotations

import sys

import cloudpickle
import pipeline_models
import pipeline_ranks
import pytest
import torch
from pipeline_models import ALL_SCHEDULES

from zbkit.launch import LaunchError, launch

# The rank functions live in test helper modules the ranks cannot import: ship them by value.
cloudpickle.register_pickle_by_value(pipeline_models)
cloudpickle.register_pickle_by_value(pipeline_ranks)
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.multiprocess

BACKENDS = [
    "gloo",
    pytest.param(
        "nccl",
        marks=pytest.mark.skipif(torch.cuda.device_count() < 4, reason="NCCL needs 4 GPUs"),
    ),
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_runner_matches_full_batch_autograd(backend: str) -> None:
    cases = [(name, m) for name in ALL_SCHEDULES for m in (4, 8) if name != "dualpipev"]
    cases += [("zb-v", 2), ("1f1b", 1), ("dualpipev", 8)]  # dualpipev needs m >= 2 pp
    out = launch(
        pipeline_ranks.check_everything,
        cases,
        ["1f1b", "zb-h1", "zb-v"],
        backend,
        nprocs=4,
        backend=backend,
        timeout=240,
    )
    rows = [r for rank in out for r in rank["schedules"]]
    assert len(rows) == 4 * len(cases)
    for r in rows:
        assert r["grad_err"] < 1e-5, r
        assert r["loss_err"] < 1e-5, r
        # the trace: one event per action; memory held == simulator's peak; nothing left
        assert r["events"] == r["actions"], r
        assert r["peak"] == r["sim_peak"], r
        assert r["all_events"] == r["all_actions"] and r["all_peaks_match"], r
        # one clock for all ranks: nothing starts before the tensors it needs were made
        assert r["causality"] == [] and r["starts_at_zero"], r
        assert r["pending"] == 0 and r["held"] == 0, r
        assert r["outputs"] > 0 and r["alive"] == 0, r  # every activation's graph was freed
    # losses come back on the last stage's rank only (rank 0 for the V placements, else 3)
    for r in rows:
        name, m = r["case"].split(" m=")[0], int(r["case"].split(" m=")[1].split()[0])
        last_rank = pipeline_models.schedule(name, 4, m).stage_to_rank[-1]
        assert r["losses_here"] == r["case"].endswith(f"rank {last_rank}"), r
    dp = [r for rank in out for r in rank["pp_dp"]]
    assert len(dp) == 4 * 3
    for r in dp:
        assert r["grad_err"] < 1e-5, r


def test_faults_raise_clear_errors_and_never_hang() -> None:
    # the cases that must step cleanly first: a failed case can leave stray messages behind
    cases = ["batch changes, shapes forgotten", "batch changes", "wrong world size",
             "missing target", "shape mismatch", "shape changes", "stage raises",
             "non-dict output"]  # fmt: skip
    # a failed rank tells the peers waiting for it, so no wait here has to time out: the
    # waits a case expects to fail get 60 s all the same, and a message saying "gave up"
    # instead of "told" fails the test; every wait that must succeed gets 120 s
    out = launch(pipeline_ranks.check_faults, cases, 60.0, 120.0, nprocs=4, timeout=600)
    got = {(r["case"], r["rank"]): r["outcome"] for rank in out for r in rank}

    for rank in range(4):
        assert got["wrong world size", rank].startswith("ValueError: the schedule was built for 2")
    assert "pass step(..., targets=...)" in got["missing target", 3]
    # a new batch shape after the first step travels as a new layout, with or without
    # forget_shapes(); the ranks check the gradients against autograd themselves
    for rank in range(4):
        assert got["batch changes", rank] == "ok", got["batch changes", rank]
        assert got["batch changes, shapes forgotten", rank] == "ok"
    assert "stage 1 microbatch 0: the module's forward raised" in got["shape mismatch", 1]
    assert "stage 2 microbatch 0: the module's forward raised" in got["stage raises", 2]
    # the second microbatch one column wider travels too: the next stage's forward says so
    grown = got["shape changes", 2]
    assert "stage 2 microbatch 1: the module's forward raised" in grown, grown
    assert "x: float32[2, 12]" in grown, grown
    says = "stage 3 microbatch 0: a stage module must return a Tensor, a tuple of Tensors"
    assert says in got["non-dict output", 3]
    # every waiting rank fails at once: the failed rank told its peers, and they theirs, in
    # the first failure's words; each names the action it waited for, on its rank's program
    origin = {"missing target": "ValueError on rank 3", "shape mismatch": "StageError on rank 1",
              "shape changes": "StageError on rank 2", "stage raises": "StageError on rank 2",
              "non-dict output": "StageError on rank 3"}  # fmt: skip
    waiting = {"missing target": {0: "0B0", 1: "1B0", 2: "2B0"},
               "shape mismatch": {0: "0B0", 2: "2F0", 3: "3F0"},
               "shape changes": {0: "0B0", 1: "1B0", 3: "3F1"},
               "stage raises": {0: "0B0", 1: "1B0", 3: "3F0"},
               "non-dict output": {0: "0B0", 1: "1B0", 2: "2B0"}}  # fmt: skip
    for case, ranks in waiting.items():
        for rank, action in ranks.items():
            msg = got[case, rank]
            assert msg.startswith(f"CommTimeout: rank {rank}: rank "), msg
            assert "failed and told this rank" in msg and f"which {action} needs" in msg, msg
            assert f"Its error: {origin[case]}" in msg, msg
            assert f"[{action}]" in msg and "<-- ERROR HERE" in msg, msg
    assert "pass step(..., targets=...)" in got["missing target", 0]


def test_a_failing_stage_reaches_the_caller_with_its_traceback() -> None:
    with pytest.raises(LaunchError) as info:
        launch(pipeline_ranks.fail_in_stage, nprocs=4, timeout=120)
    text = str(info.value)
    assert "rank 2" in text
    assert "stage 2 microbatch 1" in text and "deliberate failure" in text
