"""Functions the multi-process pipeline tests run on every rank (shipped by value)."""

from __future__ import annotations

import gc
import weakref

import torch
import torch.distributed as dist
from pipeline_models import batch, loss_fn, make_stages, oracle, schedule

from zbkit.pipeline import PipelineStage, ScheduleRunner
from zbkit.schedules import Costs, simulate
from zbkit.schedules.measure import by_key, input_producer


def _device(backend: str) -> torch.device:
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _max_err(mods, expected) -> float:
    worst = 0.0
    for m, exp in zip(mods, expected, strict=True):
        for n, p in m.named_parameters():
            if (p.grad is None) != (exp[n] is None):
                return float("inf")
            if p.grad is not None:
                worst = max(worst, (p.grad.cpu() - exp[n]).abs().max().item())
    return worst


def _remember(seen: list) -> object:
    def hook(module, args, out: dict) -> None:
        seen.extend(weakref.ref(t) for t in out.values())

    return hook


def _causality_violations(trace, last: int) -> list[str]:
    """Consumers that start before their producer ended: impossible on a shared clock."""
    keyed = by_key(trace.events)
    return [
        f"{e.stage}{e.kind}{e.microbatch} starts before its input is made"
        for e in trace.events
        if (src := input_producer(e, keyed, last)) is not None and e.start < src.end
    ]


def check_schedules(cases: list[tuple[str, int]], backend: str = "gloo") -> list[dict]:
    """Every (schedule, microbatches) case: this rank's gradients vs full-batch autograd."""
    rank, dev = dist.get_rank(), _device(backend)
    report = []
    for name, m in cases:
        sch = schedule(name, dist.get_world_size(), m)
        m = sch.microbatches  # dualpipev needs at least 2 pp
        mods = make_stages(sch.num_stages)
        x, y = batch(3 * m)
        loss, expected = oracle(mods, x, y)
        mine = sch.stages_on(rank)
        stages = [PipelineStage(mods[s].to(dev), s, sch.num_stages) for s in mine]
        runner = ScheduleRunner(sch, stages, loss_fn, timeout=60)
        holds_first, holds_last = 0 in mine, sch.num_stages - 1 in mine
        seen: list[weakref.ref] = []  # every stage output: must be freed after the step
        hooks = [st.module.register_forward_hook(_remember(seen)) for st in stages]
        losses = runner.step(x.to(dev) if holds_first else None,
                             targets=y.to(dev) if holds_last else None)  # fmt: skip
        for h in hooks:
            h.remove()
        gc.collect()
        whole = runner.gather_trace()
        sim = simulate(sch, Costs()).peak_memory[rank]
        report.append(
            {
                "case": f"{name} m={m} rank {rank}",
                "loss_err": abs(torch.stack(losses).mean().cpu() - loss).item()
                if holds_last
                else 0.0,
                "losses_here": losses is not None,
                "grad_err": _max_err([mods[s] for s in mine], [expected[s] for s in mine]),
                "peak": runner.trace.peak_memory[rank] if runner.trace.memory_samples else None,
                "sim_peak": sim,
                "pending": runner.p2p.pending,
                "held": sum(st.held_activations + st.held_weight_state for st in stages),
                "alive": sum(r() is not None for r in seen),
                "outputs": len(seen),
                "events": len(runner.trace.events),
                "actions": len(sch.actions(rank)),  # a pair's halves are two events
                "all_events": len(whole.events),
                "all_actions": sum(len(sch.actions(r)) for r in sch.program),
                "all_peaks_match": whole.peak_memory == simulate(sch, Costs()).peak_memory,
                "causality": _causality_violations(whole, sch.num_stages - 1),
                "starts_at_zero": min(e.start for e in whole.events) == 0.0,
            }
        )
    return report


def check_pp_dp(names: list[str], m: int, backend: str = "gloo") -> list[dict]:
    """PP x DP = 2 x 2: each replica trains on its half of the batch; the averaged gradients
    equal one full-batch step on the whole batch."""
    from zbkit.parallel import pp_dp_groups

    dev = _device(backend)
    pp_group, dp_group, pp_rank, dp_rank = pp_dp_groups(pp=2, dp=2)
    report = []
    for name in names:
        sch = schedule(name, 2, m)
        mods = make_stages(sch.num_stages)
        x, y = batch(2 * 3 * m)  # the global batch; replica d takes rows [d*3m, (d+1)*3m)
        loss, expected = oracle(mods, x, y)
        rows = slice(dp_rank * 3 * m, (dp_rank + 1) * 3 * m)
        mine = sch.stages_on(pp_rank)
        stages = [PipelineStage(mods[s].to(dev), s, sch.num_stages) for s in mine]
        runner = ScheduleRunner(sch, stages, loss_fn, group=pp_group, dp_group=dp_group)
        runner.step(x[rows].to(dev) if 0 in mine else None,
                    targets=y[rows].to(dev) if sch.num_stages - 1 in mine else None)  # fmt: skip
        report.append(
            {
                "case": f"pp x dp {name} pp_rank {pp_rank} dp_rank {dp_rank}",
                "grad_err": _max_err([mods[s] for s in mine], [expected[s] for s in mine]),
            }
        )
    return report


# Per case, the ranks whose wait is the outcome the test expects: they wait for a message the
# failed rank never sends, so they get the short timeout. Every other rank's waits must succeed
# (the rank that fails by itself, on its way to the failure; every rank of a case that runs):
# they get minutes, as a busy machine may take seconds to deliver a message. (A step has one
# timeout: a waiting rank's receives before the failure, e.g. rank 1's for 1F0 when rank 2
# raises, share its short one; the first step's schedule handshake waits at least 120 s.)
WAIT_IN_VAIN = {
    "missing target": {0, 1, 2},  # rank 3 refuses the step: nothing reaches the loss
    "shape mismatch": {0, 2, 3},  # rank 1's forward raises
    "shape changes": {0, 1, 3},  # rank 2's forward raises on the wider microbatch rank 1 sends
    "stage raises": {0, 1, 3},  # rank 2's forward raises
    "non-dict output": {0, 1, 2},  # rank 3's forward returns a list
}


def _fault_case(case: str, group, fail_timeout: float, timeout: float) -> None:
    """Runs one broken setup on a fresh group; raises whatever this rank runs into."""
    from torch import nn

    rank = dist.get_rank()
    sch = schedule("1f1b", 4, 4)
    mods = make_stages(4)
    x, y = batch(8)
    if case == "wrong world size":
        sch = schedule("1f1b", 2, 4)
    if case == "shape mismatch" and rank == 1:
        mods[1] = nn.Sequential()  # placeholder replaced below: expects another width

        class Narrow(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(3, 3)

            def forward(self, x, skip, ids):
                return {"x": self.lin(x), "skip": skip, "ids": ids}

        mods[1] = Narrow()
    if case == "shape changes" and rank == 1:

        class Grows(nn.Module):
            def __init__(self):
                super().__init__()
                self.calls = 0

            def forward(self, x, skip, ids):
                self.calls += 1  # the second microbatch comes out one column wider
                return {"x": torch.cat([x] * (1 + (self.calls == 2)), 1), "skip": skip, "ids": ids}

        mods[1] = Grows()
    if case == "stage raises" and rank == 2:

        class Raises(nn.Module):
            def forward(self, x, skip, ids):
                if x.shape[0] and torch.is_grad_enabled():
                    raise RuntimeError("deliberate failure in stage 2")
                return {"x": x, "skip": skip, "ids": ids}

        mods[2] = Raises()
    if case == "non-dict output" and rank == 3:

        class ListOut(nn.Module):  # a Tensor or a tuple would run (torch's forms); a list not
            def __init__(self):
                super().__init__()
                self.head = nn.Linear(6, 2)

            def forward(self, x, skip, ids):
                return [self.head(x), 3]

        mods[3] = ListOut()
    stages = [PipelineStage(mods[s], s, sch.num_stages) for s in sch.stages_on(rank)]
    waits = fail_timeout if rank in WAIT_IN_VAIN.get(case, ()) else timeout
    runner = ScheduleRunner(sch, stages, loss_fn, group=group, timeout=waits)
    targets = None if case == "missing target" else y
    runner.step(x, targets=targets)
    if case in ("batch changes", "batch changes, shapes forgotten"):
        # a smaller batch after the first step: its layout travels once, no call needed
        if case.endswith("forgotten"):
            runner.forget_shapes()  # on every rank, before the step
        x2, y2 = batch(4)
        for m in mods:
            m.zero_grad(set_to_none=True)
        expected = oracle(mods, x2, y2)[1]
        runner.step(x2, targets=y2)
        mine = sch.stages_on(rank)
        err = _max_err([mods[s] for s in mine], [expected[s] for s in mine])
        assert err < 1e-5, f"gradients after the batch changed differ by {err}"
        runner.step(x2, targets=y2)  # the same layout again: tensors only, nothing left
        assert runner.p2p.pending == 0, f"{runner.p2p.pending} transfers outlive the step"


def check_faults(cases: list[str], fail_timeout: float, timeout: float) -> list[dict]:
    """Every case on its own process group, so a failed case's stray messages stay there.

    A wait the case expects to time out gives up after `fail_timeout` seconds; every wait that
    must succeed gets `timeout` (WAIT_IN_VAIN says which is which).
    """
    report = []
    for case in cases:
        group = dist.new_group(list(range(dist.get_world_size())))
        # ranks leave a failed case at different times (some after a timeout): start the next
        # together, as the runner no longer runs a barrier per step
        dist.barrier(group)
        try:
            _fault_case(case, group, fail_timeout, timeout)
            outcome = "ok"
        except Exception as exc:  # the test asserts on the type and the message
            notes = "\n".join(getattr(exc, "__notes__", []))
            outcome = f"{type(exc).__name__}: {exc}\n{notes}"
        report.append({"case": case, "rank": dist.get_rank(), "outcome": outcome})
    return report


def check_everything(cases: list[tuple[str, int]], dp_names: list[str], backend: str) -> dict:
    """One launch for all schedules x microbatch counts, then PP x DP on the same ranks."""
    return {
        "schedules": check_schedules(cases, backend),
        "pp_dp": check_pp_dp(dp_names, 4, backend),
    }


def fail_in_stage() -> None:
    """Rank 2's stage raises mid-step (microbatch 1): the caller gets rank 2's traceback."""
    from torch import nn

    rank = dist.get_rank()
    sch = schedule("zb-h1", 4, 4)
    mods = make_stages(4)

    class FailsLater(nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x, skip, ids):
            self.calls += 1
            if self.calls == 2:
                raise RuntimeError("deliberate failure on the second microbatch")
            return {"x": x, "skip": skip, "ids": ids}

    if rank == 2:
        mods[2] = FailsLater()
    x, y = batch(8)
    stages = [PipelineStage(mods[s], s, 4) for s in sch.stages_on(rank)]
    ScheduleRunner(sch, stages, loss_fn, timeout=60).step(x, targets=y)
