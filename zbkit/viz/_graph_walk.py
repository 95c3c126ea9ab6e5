"""What `draw_graph` accepts, read into one `Walk` of the autograd graph and its analysis."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from zbkit.splitgrad import analyze, grad_node
from zbkit.viz._autograd import Walk, node_shape, walk


def _is_tensors(x: Any) -> bool:
    return isinstance(x, torch.Tensor) or (
        isinstance(x, Sequence) and len(x) > 0 and all(isinstance(t, torch.Tensor) for t in x)
    )


def unpack(obj: Any, inputs: Any, module: torch.nn.Module | None) -> tuple[Walk, Any]:
    """(walk, analysis) from a SplitGradAnalysis, or from output tensors (analysed here)."""
    if _is_tensors(obj):
        outputs = [obj] if isinstance(obj, torch.Tensor) else list(obj)
        for i, t in enumerate(outputs):
            if grad_node(t) is None:
                raise ValueError(
                    f"output {i} (shape {tuple(t.shape)}) does not require grad: nothing it "
                    "depends on requires grad, so there is no autograd graph to draw"
                )
        ins = [] if inputs is None else [inputs] if isinstance(inputs, torch.Tensor) else inputs
        # without a module the graph is still drawn, with parameters unnamed and no groups
        analysis = analyze(outputs, list(ins), module if module is not None else torch.nn.Module())
        roots = [grad_node(t) for t in outputs]
        shapes: list[tuple[int, ...] | None] = [tuple(t.shape) for t in outputs]
    elif hasattr(obj, "reverse_graph") and hasattr(obj, "groups"):
        analysis = obj
        # the outputs are the nodes nobody consumes, first in the reverse graph's order
        roots = [n for n, users in analysis.reverse_graph.items() if not users]
        shapes = [node_shape(n) for n in roots]
    else:
        raise TypeError(
            "draw_graph takes a SplitGradAnalysis (from zbkit.splitgrad.analyze) or the "
            f"stage's output tensor(s); got {type(obj).__name__}"
        )
    labels: dict[Any, str] = analysis.labels
    input_nodes = {
        n: int(label[len("input[") : -1])
        for n, label in labels.items()
        if label.startswith("input[")
    }
    # analyze labels a parameter by its name and every other node "Name#k"
    param_names = {
        n: label
        for n, label in labels.items()
        if hasattr(n, "variable") and "#" not in label and n not in input_nodes
    }
    return walk(roots, shapes, input_nodes, param_names, labels), analysis
