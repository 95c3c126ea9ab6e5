"""Run a schedule for real: stages, point-to-point communication, executors, traces.

- ``PipelineStage``: a module plus its per-microbatch F / I / W / B state.
- ``ScheduleRunner``: this rank's part of a schedule, under ``launch``, a ``Cluster`` or
  ``torchrun`` (gloo on CPU, NCCL on GPUs), optionally with data parallelism.
- ``LocalPipeline``: every stage in one process, the same code path without the wire.
- ``Trace``: what ran when, in ``Simulation.events`` form; Chrome-trace export.
- ``SyntheticStage``: a stage whose F, I and W take set times, for seeing bubbles.
"""

from zbkit.pipeline._comms import CommTimeout
from zbkit.pipeline.local import LocalPipeline
from zbkit.pipeline.runner import ScheduleRunner, pp_dp_groups
from zbkit.pipeline.stage import PipelineStage, StageError
from zbkit.pipeline.synthetic import SyntheticStage
from zbkit.pipeline.trace import CommEvent, MemorySample, Trace

__all__ = [
    "CommEvent",
    "CommTimeout",
    "LocalPipeline",
    "MemorySample",
    "PipelineStage",
    "ScheduleRunner",
    "StageError",
    "SyntheticStage",
    "Trace",
    "pp_dp_groups",
]
