"""Walk an autograd graph into plain records the drawing can style: ids, labels, module paths.

Ids are sequential in a fixed walk order (outputs in order, `next_functions` in order), never
`id()`, so the same model gives the same DOT source and the same SVG on every run.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(eq=False)
class GNode:
    id: str  # "n0", "n1", ... in walk order
    node: Any  # the torch autograd Node
    kind: Literal["op", "param", "input"]
    label: str
    module: str = ""  # dotted module path the node belongs to ("" = the top module)
    children: list[GNode] = field(default_factory=list)  # next_functions: forward inputs


@dataclass
class Walk:
    nodes: list[GNode]  # in id order
    by_node: dict[Any, GNode]
    roots: list[GNode]  # the node of each output, in output order (repeats possible)
    output_shapes: list[tuple[int, ...] | None]

    def edges(self) -> list[tuple[GNode, GNode]]:
        """(producer, consumer) pairs in forward direction, each once, in a fixed order."""
        seen: set[tuple[str, str]] = set()
        out = []
        for consumer in self.nodes:
            for producer in consumer.children:
                if (producer.id, consumer.id) not in seen:
                    seen.add((producer.id, consumer.id))
                    out.append((producer, consumer))
        return out


def shape_text(shape: Any) -> str:
    """'(5, 8)' for a shape; '' when it is unknown (None)."""
    return "(" + ", ".join(str(s) for s in shape) + ")" if shape is not None else ""


def output_shapes(node: Any) -> list[tuple[int, ...]]:
    """Shapes of the tensors this node's forward produced (the gradients it receives), if known."""
    variable = getattr(node, "variable", None)
    if variable is not None:  # AccumulateGrad: the leaf itself
        return [tuple(variable.shape)]
    try:  # private but long-lived: the metadata autograd checks incoming gradients against
        return [tuple(m.shape) for m in node._input_metadata]
    except (AttributeError, TypeError):  # another torch: shapes left out of the labels
        return []


def node_shape(node: Any) -> tuple[int, ...] | None:
    """Shape of the (first) tensor this node's forward produced, if torch tells us."""
    shapes = output_shapes(node)
    return shapes[0] if shapes else None


def walk(
    roots: list[Any],
    output_shapes: list[tuple[int, ...] | None],
    input_nodes: dict[Any, int],
    param_names: dict[Any, str],
    op_labels: dict[Any, str] | None = None,
) -> Walk:
    """Breadth-first from the outputs' nodes; stops at the inputs (the stage boundary).

    `input_nodes` maps each input's grad node to its position; `param_names` maps the
    AccumulateGrad node of each parameter to its `named_parameters()` name; `op_labels` the
    other nodes to the names `analyze` prints ("TanhBackward0#1"), so a drawing and a printed
    analysis name each node alike (torch's own name, unnumbered, where it has none).
    """
    op_labels = op_labels or {}
    nodes: list[GNode] = []
    by_node: dict[Any, GNode] = {}

    def visit(node: Any) -> tuple[GNode, bool]:
        if node in by_node:
            return by_node[node], False
        nid = f"n{len(nodes)}"
        shape = shape_text(node_shape(node))
        if node in input_nodes:
            g = GNode(nid, node, "input", f"input[{input_nodes[node]}]\n{shape}")
        elif hasattr(node, "variable"):  # AccumulateGrad: a leaf that is not an input
            name = param_names.get(node)  # None: a leaf the module does not own
            module = name.rpartition(".")[0] if name else ""
            g = GNode(nid, node, "param", f"{name or 'leaf tensor'}\n{shape}", module)
        else:
            g = GNode(nid, node, "op", op_labels.get(node) or node.name())
        nodes.append(g)
        by_node[node] = g
        return g, True

    root_nodes = []
    queue: deque[GNode] = deque()
    for node in roots:
        g, new = visit(node)
        root_nodes.append(g)
        if new:
            queue.append(g)
    while queue:
        g = queue.popleft()
        if g.kind == "input":  # the previous stage's graph is not ours to draw
            continue
        for child, _ in g.node.next_functions:
            if child is None:  # an input of the op that needs no gradient
                continue
            c, new = visit(child)
            g.children.append(c)
            if new:
                queue.append(c)
    return Walk(nodes, by_node, root_nodes, list(output_shapes))


def forward_order(w: Walk) -> list[GNode]:
    """Nodes with every producer before its consumers (a post-order of the backward graph)."""
    order: list[GNode] = []
    done: set[str] = set()
    for root in w.roots:
        stack = [(root, 0)]
        while stack:
            g, i = stack.pop()
            if g.id in done:
                continue
            if i < len(g.children):
                stack.append((g, i + 1))
                if g.children[i].id not in done:
                    stack.append((g.children[i], 0))
            else:
                done.add(g.id)
                order.append(g)
    return order


def assign_modules(w: Walk) -> None:
    """Guess which module each op ran in, from the parameters it reads.

    Autograd nodes do not record their module, so: an op that reads parameters belongs to the
    deepest module holding all of them; an op that reads none belongs to the module of its
    latest input in forward order (a residual add after `layers.3` joins `layers.3`). Inputs
    stay at the top level.
    """
    position = {g.id: i for i, g in enumerate(forward_order(w))}
    for g in sorted(w.nodes, key=lambda g: position.get(g.id, -1)):
        if g.kind != "op":
            continue
        params = [c.module.split(".") if c.module else [] for c in g.children if c.kind == "param"]
        if params:
            common = params[0]
            for path in params[1:]:
                k = 0  # length of the shared prefix
                while k < min(len(common), len(path)) and common[k] == path[k]:
                    k += 1
                common = common[:k]
            g.module = ".".join(common)
            continue
        ops = [c for c in g.children if c.kind == "op"]
        if ops:
            g.module = max(ops, key=lambda c: position.get(c.id, -1)).module


def depth_of(module: str) -> int:
    return len(module.split(".")) if module else 0
