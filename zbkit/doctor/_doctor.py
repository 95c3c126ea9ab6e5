"""`check`: every family of checks over one setup, before the first step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from zbkit.doctor import _graph, _modules, _schedule
from zbkit.doctor._setup import RUNTIMES, setup
from zbkit.doctor._trace import preserved, trace
from zbkit.doctor.findings import Finding, Report


def check(
    stages: Sequence[Any],
    schedule: Any,
    *,
    inputs: Any = None,
    target: Any = None,
    loss_fn: Callable[..., Any] | None = None,
    runtime: str | None = None,
    microbatches: int | None = None,
    batch: int | None = None,
    pp: int | None = None,
    rank: int | None = None,
) -> Report:
    """What will go wrong when `schedule` runs `stages`, said before the first step.

    Args:
        stages: one module per stage in stage order (the whole model, as `LocalPipeline`
            takes it), or the PipelineStages one rank holds (zbkit's or torch's; torch's
            know their rank, zbkit's are on `rank` or this process's rank).
        schedule: a zbkit `Schedule` (`build_schedule`), or torch's schedule object or
            class (`ScheduleZBVZeroBubble`, ...; a class needs `microbatches` and `pp`).
        inputs, target: one step's batch, as `step` takes it; microbatch 0 is traced
            through the stages (without `inputs` the graph checks are skipped).
        loss_fn: `loss_fn(output, target)`, where the last stage's backward starts.
        runtime: "zbkit" (its runtimes), "torch" (torch's own split backward) or
            "torch+zbkit" (torch's runtime inside `zbkit.torchpp.exact_split_backward()`);
            default: "zbkit" for a zbkit Schedule, "torch" for torch's.
        batch: the rows per step, when `inputs` is not given.

    Returns a `Report` (`report.ok`: nothing found). The stages' `.grad`, buffers and the
    RNG are as they were.

    Raises TypeError / ValueError for arguments that do not fit together.
    """
    if runtime is not None and runtime not in RUNTIMES:
        raise ValueError(
            f"runtime must be one of {', '.join(map(repr, RUNTIMES))}, got {runtime!r}"
        )
    if inputs is None and (target is not None or loss_fn is not None):
        raise ValueError("target and loss_fn are read with inputs: pass inputs= too")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
    rows = _schedule.rows_of(inputs) if inputs is not None else batch
    if batch is not None and rows != batch:
        raise ValueError(f"batch={batch}, but inputs have {rows} rows")
    done, refused = setup(stages, schedule, runtime, microbatches, pp, rank)
    found: list[Finding] = [*_schedule.check_refused(done, refused, microbatches)]
    found += _schedule.check_program(done) + _schedule.check_batch(done, rows)
    found += _schedule.check_placement(done)
    for s in done.stages:
        found += _modules.check_ddp(done, s)
    found += _modules.check_shared(done) + _modules.check_shared_across_ranks(done)
    skipped: list[str] = []
    if inputs is None:
        skipped.append("the stages' graphs: no inputs= to trace a microbatch with")
    elif not any(f.trap in ("too-few-microbatches", "stage-off-placement") for f in found):
        graph, skipped = _graph_findings(done, inputs, target, loss_fn)
        found += graph
    name = done.name  # a refused size: the checks ran at the fewest it takes; say what was asked
    if refused is not None:
        name = f"{done.label} (pp={done.schedule.pp}, microbatches={microbatches}: refused)"
    return Report(tuple(found), done.runtime, name, tuple(skipped))


def _graph_findings(
    done: Any, inputs: Any, target: Any, loss_fn: Any
) -> tuple[list[Finding], list[str]]:
    found: list[Finding] = []
    with preserved([s.module for s in done.stages]):
        traced, skipped = trace(done, inputs, target, loss_fn)
        for t in traced:
            found += _graph.check_compiled(done, t) + _graph.check_reentrant(done, t)
            found += _graph.check_torch_split(done, t)
    return found, skipped
