"""Property test: random small graphs with parameter reuse, chunk/cat, elementwise ops."""

import torch
from _splitgrad_oracle import compare_split_to_autograd, random_grads
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_splitgrad_defects import Params, TwoOut

D = 4  # feature size of every value in the program
OPS = ["matmul", "scale", "add", "tanh", "swap_halves", "mul", "addcmul", "two_out"]

op = st.tuples(st.sampled_from(OPS), st.integers(0, 50), st.integers(0, 50))
program = st.lists(op, min_size=1, max_size=9)


def run(program, m, xs, outputs):
    # values: the stage inputs, then one per op; params are reused at random
    mats = [m.p0, m.p1, m.p2]
    vals = list(xs)
    for name, i, j in program:
        a, b = vals[i % len(vals)], vals[j % len(vals)]
        if name == "matmul":
            vals.append(a @ mats[j % 3])
        elif name == "scale":
            vals.append(a * m.v)
        elif name == "add":
            vals.append(a + b)
        elif name == "tanh":
            vals.append(torch.tanh(a))
        elif name == "swap_halves":  # chunk then cat: a node with two outputs
            lo, hi = a.chunk(2, dim=1)
            vals.append(torch.cat([hi, lo * mats[i % 3][0, 0]], dim=1))
        elif name == "two_out":  # a custom Function with two outputs that skips halves
            vals.extend(TwoOut.apply(a, mats[j % 3]))
        elif name == "addcmul":  # one node, the same parameter on two of its edges
            vals.append(torch.addcmul(a, m.v, m.v))
        else:
            vals.append(a * b)
    picked = [vals[-1]] + [vals[k % len(vals)] for k in outputs]
    return [v for v in picked if v.requires_grad] or [vals[-1] + m.v]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    program=program,
    outputs=st.lists(st.integers(0, 50), max_size=2),
    first_stage=st.booleans(),
    order=st.sampled_from(["I0 I1 W0 W1", "I0 I1 W1 W0", "I0 W0 I1 W1"]),
    seed=st.integers(0, 2**16),
)
def test_random_graphs_match_autograd(program, outputs, first_stage, order, seed):
    torch.manual_seed(seed)
    m = Params(p0=(D, D), p1=(D, D), p2=(D, D), v=(D,), unused=(D,))
    mbs = [
        [torch.randn(2, D, dtype=torch.float64, requires_grad=not first_stage) for _ in range(2)]
        for _ in range(2)
    ]
    compare_split_to_autograd(
        m, lambda m, xs: run(program, m, xs, outputs), mbs, order, output_grads=random_grads
    )
