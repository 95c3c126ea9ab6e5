"""The autograd graph seen from the other side: who consumes each node.

Autograd stores the graph backwards: every node knows its producers
(``node.next_functions``, the edges the backward pass follows) but not its
consumers. Splitting the backward needs the forward direction too ("which nodes
depend on the stage inputs?"), so we build the reverse adjacency once per graph.
"""

from __future__ import annotations

from collections.abc import Container, Iterable

import torch
from torch.autograd.graph import Node, get_gradient_edge


def grad_node(t: torch.Tensor) -> Node | None:
    """`t.grad_fn`, or the AccumulateGrad node of a leaf that requires grad (None otherwise)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"grad_node expects a Tensor, got {type(t).__name__}")
    if not t.requires_grad:
        return None
    # get_gradient_edge creates the (lazily built) AccumulateGrad node of a leaf
    return get_gradient_edge(t).node


def build_reverse_graph(roots: Iterable[Node | None]) -> dict[Node, list[Node]]:
    """node -> the nodes that consume it, for every node reachable from `roots`.

    Every reachable node is a key (the roots too, with their consumers if any),
    and the lists keep the order of discovery, so results are deterministic.
    """
    reverse: dict[Node, list[Node]] = {}
    stack: list[Node] = []
    for root in roots:
        if root is not None and root not in reverse:
            reverse[root] = []
            stack.append(root)
    while stack:  # depth-first: the order only needs to be deterministic
        node = stack.pop()
        for producer, _ in node.next_functions:
            if producer is None:  # an input that does not require grad
                continue
            users = reverse.get(producer)
            if users is None:
                reverse[producer] = [node]
                stack.append(producer)
            else:
                users.append(node)
    return reverse


def ordered_closure(
    roots: Iterable[Node | None], targets: Container[Node], reverse: dict
) -> tuple[dict[Node, None], dict[Node, None]]:
    """`reverse_closure` returning insertion-ordered dicts (deterministic iteration)."""
    closure: dict[Node, None] = {}
    reached: dict[Node, None] = {}
    stack = []
    for root in roots:
        if root is not None and root not in closure:
            closure[root] = None
            stack.append(root)
    while stack:
        for user in reverse.get(stack.pop(), ()):
            if user in closure or user in reached:
                continue
            if user in targets:  # stop here: the target is reached, not entered
                reached[user] = None
                continue
            closure[user] = None
            stack.append(user)
    return closure, reached


def reverse_closure(
    roots: Iterable[Node | None], targets: set[Node], reverse_graph: dict[Node, list[Node]]
) -> tuple[set[Node], set[Node]]:
    """(closure, targets reached): every node reachable from `roots` along consumer edges.

    The walk stops at target nodes: they are reported in the second set, not
    entered. With no targets the closure of the stage inputs is exactly the set
    of nodes the input-gradient pass executes.
    """
    closure, reached = ordered_closure(roots, targets, reverse_graph)
    return set(closure), set(reached)
