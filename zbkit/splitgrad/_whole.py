"""Graphs zbkit runs whole: nodes whose backward must not run twice, and what torch refuses.

A split backward runs some nodes twice: I runs every node of the input closure, and W runs
each group's split points (its intermediates) again, from the gradients I captured there,
to reach the parameters. That is exact for autograd's own nodes, which are pure functions of
what they saved. It is not for a torch.compile region: AOTAutograd compiles a region's
backward into one opaque call that returns its input and its weight gradients together, may
free ("donate") its saved buffers on the first run, and was seen to return wrong weight
gradients when run a second time (pytorch/pytorch issue 161904). So where such a node is in
the input closure, I computes that stage's weight gradients too, in the same engine call
(the backward runs whole, once), and W only adds them into ``.grad``: the gradients are
autograd's, the schedule keeps its I and W slots, and zbkit says so once.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator

from torch.autograd.graph import Node


class WholeBackwardWarning(UserWarning):
    """A stage's backward ran whole at I: its graph holds a node a split would run twice."""


def opaque_node(nodes: Iterable[Node]) -> str | None:
    """The type name of the first node whose backward must run once (None: every node may
    be replayed). Read from the node itself: a compiled region's backward is a custom
    Function of torch._functorch's, whatever the user called the module."""
    for node in nodes:
        cls = getattr(node, "_forward_cls", None)  # set on custom Functions' backward nodes
        if cls is not None and cls.__module__.startswith("torch._functorch"):
            return type(node).__name__
    return None


def warn_whole(node_name: str, where: str = "a stage") -> None:
    """Says, once per process and `where` (the text is fixed), that a stage's backward ran
    whole."""
    whose = "a stage's" if where == "a stage" else f"{where}'s"
    warnings.warn(
        f"zbkit.splitgrad: {whose} backward ran whole at I, not split into I and W: its "
        f"input gradients pass a torch.compile region ({node_name}), whose compiled backward "
        "computes input and weight gradients in one call that must not run twice (donated "
        "buffers, wrong weight gradients: pytorch/pytorch issue 161904). The gradients are "
        "exact and W still adds them into .grad, but this stage's I now costs I + W. To keep "
        "the split, compile the blocks' parameter-free parts only, or leave the stage "
        "uncompiled; a schedule without I/W (1f1b) loses nothing",
        WholeBackwardWarning,
        stacklevel=4,
    )


@contextlib.contextmanager
def explain_refusals() -> Iterator[None]:
    """Names the cause, in zbkit's words, when torch refuses a backward zbkit asked for.

    - ``checkpoint(..., use_reentrant=True)`` reruns its forward inside the backward and
      calls ``backward`` on it alone, which torch refuses inside ``.grad()`` or a backward
      with ``inputs=``: exactly the engine calls that split I from W.
    - a torch.compile region with donated buffers refuses ``retain_graph=True``, which a
      split (or a check of it) needs wherever the region is run again.
    """
    try:
        yield
    except RuntimeError as exc:
        text = str(exc)
        if "use_reentrant" in text:
            raise RuntimeError(REENTRANT) from exc
        if "donated buffers" in text:
            raise RuntimeError(DONATED) from exc
        raise


REENTRANT = (
    "a reentrant activation checkpoint (torch.utils.checkpoint.checkpoint with "
    "use_reentrant=True) cannot be split into I and W: its backward reruns the "
    "forward and runs a whole backward of its own, which stops at no split point. "
    "Use checkpoint(..., use_reentrant=False) (torch's recommended form; HF models: "
    "gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': "
    "False})); gradients are the same"
)

DONATED = (
    "a torch.compile region's backward was asked to run while keeping its graph "
    "(retain_graph=True), which torch refuses for a region compiled with donated buffers "
    "(freed on its first run). zbkit runs a stage whose input gradients pass such a region "
    "whole at I; this call kept the graph anyway: stage_backward_input(retain_graph=True), "
    "a weight pass replaying the region, or torch's own split backward "
    "(torch.distributed.pipelining without zbkit.torchpp.exact_split_backward()). Drop "
    "retain_graph, or set torch._functorch.config.donated_buffer = False for such a check"
)
