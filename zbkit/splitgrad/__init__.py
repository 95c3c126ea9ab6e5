"""Split a stage's backward into an input pass (I) and a weight pass (W), exactly.

Pure torch, no distributed code. Where to start reading: _groups.py (what the
analysis finds), _backward.py (I), _weight.py (W, the reference path); _fast.py
holds the optional fast paths and the check that guards them, with _free.py
(freeing saved tensors early) and _plan.py (the analysis cached per graph
structure). See docs/architecture.md, section splitgrad.
"""

from zbkit._public import public_dir
from zbkit.splitgrad._backward import (
    NO_GRAPH,
    BackwardInputResult,
    output_roots,
    stage_backward_full,
    stage_backward_input,
)
from zbkit.splitgrad._check import SplitMismatch
from zbkit.splitgrad._directions import GradDirection, grad_directions, needs_direction
from zbkit.splitgrad._fast import fast_paths_available, reference_weight_pass
from zbkit.splitgrad._graph import build_reverse_graph, grad_node, reverse_closure
from zbkit.splitgrad._groups import ParamGroup, group_params
from zbkit.splitgrad._pending import PendingWeight
from zbkit.splitgrad._weight import stage_backward_weight
from zbkit.splitgrad._whole import WholeBackwardWarning, opaque_node
from zbkit.splitgrad.analysis import SplitGradAnalysis, analyze

__all__ = [
    "BackwardInputResult",
    "NO_GRAPH",
    "GradDirection",
    "ParamGroup",
    "PendingWeight",
    "SplitGradAnalysis",
    "SplitMismatch",
    "WholeBackwardWarning",
    "analyze",
    "build_reverse_graph",
    "fast_paths_available",
    "grad_directions",
    "grad_node",
    "group_params",
    "needs_direction",
    "opaque_node",
    "output_roots",
    "reference_weight_pass",
    "reverse_closure",
    "stage_backward_full",
    "stage_backward_input",
    "stage_backward_weight",
]


def __dir__() -> list[str]:  # dir() and tab completion: __all__ and the loaded submodules
    return public_dir(globals(), __all__)
