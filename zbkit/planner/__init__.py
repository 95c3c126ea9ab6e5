"""Your model in seconds and bytes: profile its layers, predict every rank's step.

>>> from zbkit import planner
>>> prof = planner.profile([embed, *blocks, head], (tokens, targets), loss_fn=loss)
>>> prof.layers[0].activation_bytes, prof.layers[0].forward.median
>>> print(planner.predict(prof, "zb-v", pp=2, microbatches=4))

`profile` measures each layer's F, I and W in seconds (zbkit's own split backward) and its
bytes (torch's own allocator for what is held between them; the tensors for parameters,
optimizer state and the output). A `Profile` saves and loads as JSON. `predict` runs the
simulator on a schedule's stages in seconds and bytes and says, per rank, the peak bytes of
a training step with what is held at that peak, and the step's seconds. `measure` runs the
same plan on real ranks and reads each rank's peak from torch's own allocator; `compare`
puts the two side by side. `wire` measures what a transfer and the runtime add, for
`predict(..., wire=...)`. `partition` balances a schedule's stages by time under a memory
limit; `plan` chooses the schedule, pipeline degree, microbatches and partition that is
fastest within a memory budget; `check` runs its top candidates for real.
`profile_transformer` builds a profile from a decoder's shape (an HF config), for models
too large to run here.
"""

from zbkit._public import public_dir
from zbkit.planner.check import Check, check
from zbkit.planner.choose import Candidate, Plan, parse_bytes, plan, profile_sizes
from zbkit.planner.compare import Comparison, compare
from zbkit.planner.measure import Chain, Measured, RankMeasured, measure
from zbkit.planner.partition import PLACEMENTS, Partition, partition
from zbkit.planner.predict import Prediction, RankPrediction, balanced, plot_peaks, predict
from zbkit.planner.profile import OPTIMIZERS, LayerProfile, Profile, Timing, profile
from zbkit.planner.transformer import profile_transformer
from zbkit.planner.wire import Wire, wire

__all__ = [
    "OPTIMIZERS",
    "PLACEMENTS",
    "Candidate",
    "Chain",
    "Check",
    "Comparison",
    "LayerProfile",
    "Measured",
    "Partition",
    "Plan",
    "Prediction",
    "Profile",
    "RankMeasured",
    "RankPrediction",
    "Timing",
    "Wire",
    "balanced",
    "check",
    "compare",
    "measure",
    "parse_bytes",
    "partition",
    "plan",
    "plot_peaks",
    "predict",
    "profile",
    "profile_sizes",
    "profile_transformer",
    "wire",
]


def __dir__() -> list[str]:  # dir() and tab completion: __all__ and the loaded submodules
    return public_dir(globals(), __all__)
