"""The fast paths of the split backward, and the one check that guards them.

The reference path (_weight.py) is the whole idea; these only make it cheaper:

- Norm halves in I (`eager_candidates`, `eager_edges`): a normalisation node whose parameters
  only it uses gets its weight gradients in I, from the same fused kernel call as
  its input gradient; W then only delivers them into `.grad`.
- batched W (`run_batched`): the reference path makes one engine call per group,
  and each engine call walks the whole graph below its roots first, so a deep
  stage pays O(groups x nodes). Here W calls every single-intermediate group's
  node itself, inside one tiny engine call whose bookkeeping marks only the
  parameter-side edges as needed (so each node computes only its weight half),
  then one more engine call delivers all those gradients into `.grad`. Hooks
  on the replayed node itself do not run again in W (they ran in I). Were a
  node called this way to compute its input half too, W would stay exact, only
  slower: tests/splitgrad counts the matmuls to notice.
- freeing saved tensors (`_free.release_saved`): what only I needs (a GELU's
  input, a LayerNorm's statistics) is dropped when I ends, and each node W calls
  itself drops its saved tensors once called, as the engine does for the nodes
  it runs without retain_graph. A freed tensor's unpack raises, naming the fix.
- the analysis cached per graph structure (`_plan`): the same model gives the
  same graph shape every microbatch, so I analyses each shape once.

All lean on torch internals: `torch.autograd.graph._engine_run_backward`, a
node's `_input_metadata` and `_raw_saved_*` tensors (their `register_hooks`),
a built-in node called from Python inside a backward, and a leaf's
`_backward_hooks`. `fast_paths_available()` probes them once on a tiny graph
against plain autograd; where they are missing or behave differently
(another torch version) zbkit falls back to the reference path: exact, slower.
`reference_weight_pass()` or ZBKIT_SPLITGRAD_REFERENCE=1 force that fallback.
Measured gains: benchmarks/splitgrad_overhead.py.
"""

from __future__ import annotations

import functools
import os
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch.autograd.function import BackwardCFunction
from torch.autograd.graph import GradientEdge, Node

from zbkit.splitgrad._free import release_named, release_saved, unpack_freed
from zbkit.splitgrad._graph import build_reverse_graph, grad_node
from zbkit.splitgrad._groups import ParamGroup, group_params
from zbkit.splitgrad._pending import PendingGroup

ENV_REFERENCE = "ZBKIT_SPLITGRAD_REFERENCE"  # set to 1: never take a fast path
_force_reference: ContextVar[bool] = ContextVar("zbkit_splitgrad_reference", default=False)


@contextmanager
def reference_weight_pass() -> Iterator[None]:
    """Within the block, I and W take the reference path only (no fast path, no torch internals)."""
    token = _force_reference.set(True)
    try:
        yield
    finally:
        _force_reference.reset(token)


def use_fast_paths() -> bool:
    """Whether this I or W may take the fast paths: not forced off, and the probe passed."""
    if _force_reference.get() or os.environ.get(ENV_REFERENCE, "0") not in ("", "0"):
        return False
    return fast_paths_available()


@functools.cache
def fast_paths_available() -> bool:
    """Whether this torch's internals work as the fast paths expect (probed once, cached)."""
    try:
        with torch.enable_grad():  # the first I may run inside a caller's no_grad block
            reason = _probe()
    # what a changed internal raises: gone (Attribute/Import), new signature (Type), new checks
    except (AttributeError, ImportError, IndexError, RuntimeError, TypeError) as exc:
        reason = f"{type(exc).__name__}: {exc}"
    if reason is not None:
        warnings.warn(
            f"zbkit.splitgrad: the fast weight pass does not work on torch {torch.__version__} "
            f"({reason}); using the reference path (exact gradients, slower W)",
            RuntimeWarning,
            stacklevel=2,
        )
    return reason is None


def _probe() -> str | None:
    """None if the fast paths give plain autograd's gradients on a tiny stage, else why not."""
    if not hasattr(torch.autograd.graph, "_engine_run_backward"):
        return "torch.autograd.graph._engine_run_backward is missing"
    leaf = torch.zeros(2, device="cpu", requires_grad=True)
    handle = leaf.register_hook(lambda g: g)
    hooked = bool(leaf._backward_hooks)  # eager_edges skips parameters with tensor hooks
    handle.remove()
    if not hooked or leaf._backward_hooks:
        return "Tensor._backward_hooks does not list a leaf's hooks"
    # a Linear as a middle stage: W replays its node and reduces the bias gradient
    gen = torch.Generator().manual_seed(0)  # its own generator: the caller's stream is untouched
    x, w, b, g = (
        torch.randn(shape, generator=gen, dtype=torch.float64, device="cpu", requires_grad=grad)
        for shape, grad in (((4, 2), True), ((3, 2), True), ((3,), True), ((4, 3), False))
    )
    y = torch.nn.functional.linear(x, w, b)
    want = torch.autograd.grad(y, [w, b], g, retain_graph=True)
    reverse = build_reverse_graph([y.grad_fn])
    groups = group_params([grad_node(x)], [grad_node(w), grad_node(b)], reverse)
    work = [PendingGroup(groups[0], [w, b], [(g,)])] if len(groups) == 1 else []
    if not work or not batchable(work[0]):
        return "a Linear's parameters do not form one batchable group"
    run_batched(work, retain_graph=False)
    if not all(
        p.grad is not None and torch.allclose(p.grad, e) for p, e in zip((w, b), want, strict=True)
    ):
        return "the batched weight pass gives gradients that differ from plain autograd's"
    h = x * 2
    node, alive = torch.sin(h).grad_fn, weakref.ref(h)  # sin's node saves its input h
    assert node is not None, "sin of a tensor that requires grad has a node"
    del h
    release_saved([node])
    saved = node._raw_saved_self  # type: ignore[attr-defined]  # private: what this probes
    if alive() is not None or saved.unpack_hook is not unpack_freed:
        return "releasing a node's saved tensors does not free them"
    return None


# ---------------------------------------------------------------- LayerNorm halves in I

# Nodes whose weight half is cheap next to what splitting it off costs. A
# LayerNorm's weight gradients are two row reductions (O(N*d), like its input
# half), but computed alone in W they first recompute the normalised input, and
# W needs the node's incoming gradient (N*d floats) kept alive from I. So I asks
# for them too: one fused kernel call, exactly as plain backward makes it, and
# only two d-sized gradients wait for W. A training-mode BatchNorm's input
# gradient needs exactly the two reductions that are its weight gradients, so
# splitting it would compute them twice. Matmul-like nodes stay split: their
# weight half is the expensive part that W exists to defer.
EAGER_NODES = frozenset(
    {
        "NativeLayerNormBackward0",
        "NativeGroupNormBackward0",
        "NativeBatchNormBackward0",
        "CudnnBatchNormBackward0",
    }
)


def eager_candidates(group: ParamGroup, reverse: dict[Node, list[Node]]) -> list[GradientEdge]:
    """The parameter edges of a group whose weight half I may compute ([] if not eligible).

    Eligible: one intermediate named in EAGER_NODES, no outputs outside the input
    closure, and every parameter of the group a leaf fed by that node alone (so
    capturing its edge in I sees exactly what plain backward would deliver). The
    graph's structure decides this; tensor hooks, which may come and go between
    microbatches, are `eager_edges`' to check.
    """
    if len(group.intermediates) != 1 or group.roots or group.needs_both_directions:
        return []
    node = group.intermediates[0]
    if node.name() not in EAGER_NODES:
        return []
    edges = []
    for k in group.exits[0]:
        param, nr = node.next_functions[k]
        if param is None or not hasattr(param, "variable") or reverse.get(param) != [node]:
            return []  # only AccumulateGrad nodes have `variable`
        edges.append(GradientEdge(param, nr))
    return edges if len(edges) == len(group.param_nodes) else []


def eager_edges(candidates: list[GradientEdge]) -> list[GradientEdge]:
    """The candidates, if none of their parameters has tensor hooks (capturing runs
    them in I; W would run them again), else []."""
    # `variable`: an AccumulateGrad node's leaf, not in torch's Node stub
    if any(edge.node.variable._backward_hooks for edge in candidates):  # type: ignore[attr-defined]
        return []
    return candidates


# ---------------------------------------------------------------- batched W


def batchable(work: PendingGroup) -> bool:
    """Ready groups, and groups with one built-in intermediate that I reached."""
    group = work.group
    return bool(work.ready) or (
        len(group.intermediates) == 1
        and not group.roots
        and work.captured[0] is not None
        and not isinstance(group.intermediates[0], BackwardCFunction)
    )


def run_batched(works: list[PendingGroup], retain_graph: bool) -> None:
    """Weight halves of many batchable groups in two engine calls, then into `.grad`.

    Groups whose weight half I computed only join the delivery. Empties `works`.
    """
    edges, grads = _replay([wk for wk in works if not wk.ready], retain_graph)
    params = [t for wk in works for t in wk.tensors]
    for start, start_grads in (wk.start_edges() for wk in works if wk.ready):
        edges += start
        grads += start_grads
    # drop the groups, and through them the replayed nodes with their saved
    # activations, before the delivery allocates the weight gradients
    works.clear()
    if edges:
        # the engine's own entry point: it reduces broadcast gradients (a bias)
        # to the shape each node expects, like a normal backward does
        torch.autograd.graph._engine_run_backward(
            tuple(edges),
            tuple(grads),
            retain_graph,
            False,  # create_graph
            tuple(params),
            allow_unreachable=True,
            accumulate_grad=True,
        )


def _replay(
    works: list[PendingGroup], retain_graph: bool
) -> tuple[list[GradientEdge], list[torch.Tensor]]:
    """Call each group's intermediate for its weight half: the exit edges and their gradients."""
    if not works:
        return [], []
    nodes = [wk.group.intermediates[0] for wk in works]
    exit_edges = [
        # an exit edge leads to a parameter's node: never None
        [GradientEdge(*node.next_functions[k]) for k in wk.group.exits[0]]  # type: ignore[arg-type]
        for wk, node in zip(works, nodes, strict=True)
    ]
    # the shape each exit edge's node expects: a Linear's bias gradient comes out
    # of AddmmBackward unreduced (as big as the captured gradient, often aliasing
    # it); reducing it right away, as the engine would, frees the capture now
    # instead of after the last group, so W's own allocations reuse that memory
    shapes = [[e.node._input_metadata[e.output_nr].shape for e in edges] for edges in exit_edges]
    edges: list[GradientEdge] = []
    grads: list[torch.Tensor] = []

    def replay(_grad_outputs: tuple) -> None:
        # runs inside the tiny engine call below: its bookkeeping lists exactly the
        # exit edges as needed, so each node skips its input half
        for wk, node, exits, exit_shapes in zip(works, nodes, exit_edges, shapes, strict=True):
            captured, wk.captured = wk.captured[0], []  # free each captured gradient once used
            assert captured is not None, "batchable: I reached this group's node"
            out = node(*captured)  # type: ignore[operator]  # a Node is callable; its stub says not
            del captured
            if not retain_graph:  # this group is done with its node: free what it saved
                if wk.free is None:
                    release_saved((node,))
                else:
                    release_named(node, wk.free)
            for k, edge, shape in zip(wk.group.exits[0], exits, exit_shapes, strict=True):
                grad = out[k]
                if grad is None:
                    continue
                if grad.shape != shape:
                    grad = grad.sum_to_size(shape)  # what the engine's check would do
                edges.append(edge)
                grads.append(grad)
            out = grad = None  # the unreduced bias gradient may alias the capture

    anchor = torch.zeros((), requires_grad=True)  # a one-node graph to hang `replay` on
    trigger = anchor.view_as(anchor)
    assert trigger.grad_fn is not None, "a view of a tensor that requires grad has a node"
    handle = trigger.grad_fn.register_prehook(replay)
    try:
        wanted = [edge for exits in exit_edges for edge in exits]
        # torch takes GradientEdges and tensors in one list; its stub wants one kind
        torch.autograd.grad(
            trigger,
            [*wanted, anchor],  # type: ignore[arg-type]
            torch.zeros(()),
            allow_unused=True,
        )
    finally:
        handle.remove()
    return edges, grads
