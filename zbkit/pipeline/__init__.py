"""Run a schedule for real: stages, point-to-point communication, executors, traces.

- ``PipelineStage``: a module plus its per-microbatch F / I / W / B state.
- ``ScheduleRunner``: this rank's part of a schedule, under ``launch``, a ``Cluster`` or
  ``torchrun`` (gloo on CPU, NCCL on GPUs), optionally with data parallelism; it walks the
  rank's ``Plan`` (``print(runner.plan)``: compute actions and the sends/receives between).
- ``LocalPipeline``: every stage in one process, the same code path without the wire.
- ``Trace``: what ran when, in ``Simulation.events`` form; Chrome-trace export.
- ``SyntheticStage``: a stage whose F, I and W take set times, for seeing bubbles.
- ``trace_torch``: the same ``Trace`` of a torch.distributed.pipelining schedule's run.

In one process (the oracle twin of a real run)::

    schedule = build_schedule("zb-h1", pp=4, microbatches=8)
    pipe = LocalPipeline([m0, m1, m2, m3], schedule, loss_fn)   # m(**inputs) -> dict, or
                                          # torch's form: m(*tensors) -> Tensor or tuple
    losses = pipe.step(x, targets=y)      # .grad now as after loss_fn on the full batch
    viz.plot_schedule(pipe.trace)

On 4 ranks (``launch(fn, nprocs=4)``, a ``Cluster`` or ``torchrun``), inside ``fn``::

    rank = dist.get_rank()
    stages = [PipelineStage(mods[s], s, schedule.num_stages) for s in schedule.stages_on(rank)]
    runner = ScheduleRunner(schedule, stages, loss_fn)
    losses = runner.step(x, targets=y)    # losses on the last stage's rank, None elsewhere
    trace = runner.gather_trace()         # every rank's events, one clock
"""

from zbkit._public import public_dir
from zbkit.pipeline._comms import CommTimeout
from zbkit.pipeline.local import LocalPipeline
from zbkit.pipeline.runner import ScheduleRunner
from zbkit.pipeline.stage import PipelineStage, StageError
from zbkit.pipeline.synthetic import SyntheticStage
from zbkit.pipeline.torch_trace import TorchRecorder, schedule_of_trace, trace_torch
from zbkit.pipeline.trace import CommEvent, MemorySample, Trace
from zbkit.schedules.core.plan import Comm, Plan

__all__ = [
    "Comm",
    "CommEvent",
    "CommTimeout",
    "LocalPipeline",
    "MemorySample",
    "PipelineStage",
    "Plan",
    "ScheduleRunner",
    "StageError",
    "SyntheticStage",
    "TorchRecorder",
    "Trace",
    "schedule_of_trace",
    "trace_torch",
]


def __dir__() -> list[str]:  # dir() and tab completion: __all__ and the loaded submodules
    return public_dir(globals(), __all__)
