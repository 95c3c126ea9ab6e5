"""Freeing saved tensors early: what `retain_graph=False` does, at the split's own pace.

A plain backward frees each node's saved tensors as soon as the node ran. The
split backward runs most nodes twice at most (I, then W for the split points),
so it frees in two steps instead (a fast path, guarded by `_fast`):

- in I: the nodes W never runs (a GELU's input, a LayerNorm's statistics),
  `input_only_nodes`; those holding at least EARLY_BYTES right after each has run
  (`release_when_run`), the rest when I returns;
- during W: each replayed node, as soon as its group's weight half ran.

A slot that holds a parameter (a LayerNorm's weight, a Linear's `weight.t()`)
is left alone: the module keeps that tensor alive anyway, so dropping it would
free nothing and cost a hook registration (~2 us).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator

import torch
from torch import nn
from torch.autograd.function import BackwardCFunction
from torch.autograd.graph import Node
from torch.utils.hooks import RemovableHandle

from zbkit.splitgrad._pending import PendingGroup

_SAVED_NAMES: dict[type, tuple[str, ...]] = {}  # node class -> its saved-tensor attributes
# an input-only node saving this much is freed as soon as it has run in I, not when I ends:
# the gradients I keeps for W then reuse that memory instead of new pages (first-touch page
# faults cost compute-bound models up to ~10%); smaller ones wait (a hook costs ~3 us)
EARLY_BYTES = 1 << 18


def _drop(_tensor: torch.Tensor) -> None:
    return None  # pack hook: keep nothing, so the tensor dies with its last other reference


def unpack_freed(_packed: None) -> torch.Tensor:
    raise RuntimeError(
        "zbkit.splitgrad freed this saved tensor: only the input pass (I) or this node's "
        "weight half in W needed it. To backward through this graph again, pass "
        "retain_graph=True to stage_backward_input and to stage_backward_weight"
    )


def input_only_nodes(closure: Iterable[Node], works: list[PendingGroup]) -> list[Node]:
    """The built-in nodes of the input closure that W never runs: what I may free when it ends.

    W starts at the intermediates of the groups it replays; a group with several
    also replays the closure's path below them, so all of that stays.
    """
    closure = dict.fromkeys(closure)
    keep: set[Node] = set()
    below: set[Node] = set()  # what lies under a group with several intermediates
    stack: list[Node] = []
    for work in works:
        if not work.ready:
            keep.update(work.group.intermediates)
            if len(work.group.intermediates) > 1:
                stack += work.group.intermediates
    while stack:
        for producer, _ in stack.pop().next_functions:
            if producer in closure and producer not in below:
                below.add(producer)
                stack.append(producer)
    keep |= below
    return [n for n in closure if n not in keep and not isinstance(n, BackwardCFunction)]


def _names(node: Node) -> tuple[str, ...]:
    """A built-in node's saved-tensor attributes (`_raw_saved_*`)."""
    names = _SAVED_NAMES.get(type(node))
    if names is None:  # dir() is slow: once per node class
        names = tuple(a for a in dir(node) if a.startswith("_raw_saved_"))
        _SAVED_NAMES[type(node)] = names
    return names


def _entries(node: Node, name: str) -> Iterable:
    """The SavedVariables of one saved-tensor attribute (a list for some ops)."""
    saved = getattr(node, name)
    return saved if isinstance(saved, list | tuple) else (saved,)


def _slots(node: Node) -> Iterator:
    """A built-in node's SavedVariables (lists flattened)."""
    for name in _names(node):
        yield from _entries(node, name)


def free_early(nodes: Iterable[Node]) -> tuple[list[Node], list[Node]]:
    """(nodes whose saved tensors hold at least EARLY_BYTES, the rest)."""
    early: list[Node] = []
    late: list[Node] = []
    for node in nodes:
        held = 0
        for one in _slots(node):  # input-only nodes are built-in (`input_only_nodes`)
            tensor = one.data if one.unpack_hook is None else None
            if tensor is not None:
                held += tensor.numel() * tensor.element_size()
        (early if held >= EARLY_BYTES else late).append(node)
    return early, late


def release_saved(nodes: Iterable[Node]) -> None:
    """Drop the tensors these built-in nodes saved for backward (what retain_graph=False does).

    Saved tensors that already carry hooks (a `saved_tensors_hooks` forward) are left
    alone, and so are parameters (and views of them): dropping those frees nothing.
    """
    for node in nodes:
        for one in _slots(node):
            if _freeable(one):
                one.register_hooks(_drop, unpack_freed)


def _freeable(one) -> bool:
    if one.unpack_hook is not None:
        return False
    tensor = one.data  # None: an optional tensor the op did not get
    # `type() is`: Parameter's isinstance goes through a slow metaclass hook
    return (
        tensor is not None
        and type(tensor) is not nn.Parameter
        and type(tensor._base) is not nn.Parameter  # weight.t() in a Linear
    )


def hooked(node: Node) -> bool:
    """Whether some tensor `node` saved carries hooks (its forward ran under
    `saved_tensors_hooks`): what can be freed there cannot be read, so a plan must not
    learn from it what later graphs, saved without hooks, may free."""
    return any(one.unpack_hook is not None for one in _slots(node))


def freeable(node: Node) -> tuple[str, ...]:
    """The saved-tensor attributes of `node` that `release_saved` would drop now.

    The same graph structure saves the same kinds of tensor in the same places, so the
    analysis plan keeps these names per node position (`_plan`) and later graphs free
    with `release_named`: a third of the cost, without reading each tensor back.
    """
    return tuple(n for n in _names(node) if any(_freeable(one) for one in _entries(node, n)))


def release_named(node: Node, names: tuple[str, ...]) -> None:
    """`release_saved` of one node whose freeable attributes are known (`freeable`).

    A slot that already has hooks (this forward ran under `saved_tensors_hooks`, or it
    was freed) or holds nothing this time is skipped, as `release_saved` would skip it.
    """
    for name in names:
        for one in _entries(node, name):
            try:
                one.register_hooks(_drop, unpack_freed)
            except RuntimeError:  # hooks already set, or no tensor saved there
                continue


def release_when_run(node: Node, names: tuple[str, ...]) -> RemovableHandle:
    """Drop `node`'s saved tensors `names` right after it runs (a post hook; remove it
    after)."""
    return node.register_hook(functools.partial(_release_one, node, names))


def _release_one(
    node: Node, names: tuple[str, ...], _grad_inputs: object, _grad_outputs: object
) -> None:
    release_named(node, names)
