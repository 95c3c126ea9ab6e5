"""Part 1 of `zbkit demo`: one transformer block's backward split into I and W.

The block stands for a middle pipeline stage (its input requires grad). I computes the input
gradient only, leaving every parameter's ``.grad`` empty; W then fills them. Both are checked
against plain autograd on a copy of the block.
"""

from __future__ import annotations

import argparse
import copy

import torch

from zbkit.models import TransformerBlock
from zbkit.splitgrad import analyze, stage_backward_input, stage_backward_weight


def split_backward_demo(args: argparse.Namespace) -> bool:
    """One block as a middle stage: its groups, then I and W against plain autograd."""
    torch.manual_seed(args.seed)
    block = TransformerBlock(args.dim, args.heads)
    reference = copy.deepcopy(block)
    # a middle pipeline stage: the input is an activation that requires grad
    x = torch.randn(args.batch, args.tokens, args.dim, requires_grad=True)
    grad_out = torch.randn(args.batch, args.tokens, args.dim)  # from the next stage

    out = block(x)
    analysis = analyze(out, x, block)
    print(f"Part 1: one transformer block's backward split into I and W\n{analysis}\n")

    params = [p for p in block.parameters() if p.requires_grad]
    result = stage_backward_input([out], [grad_out], [x], params)  # I: input gradient only
    untouched = all(p.grad is None for p in params)
    print(f"after I: input grad ready, parameter .grad still empty: {untouched}")
    stage_backward_weight(params, result.param_groups)  # W: the weight gradients
    print("after W: parameter .grad filled\n")

    x_ref = x.detach().requires_grad_()
    reference(x_ref).backward(grad_out)  # the oracle: plain autograd

    rows = [("input x", result.input_grads[0], x_ref.grad)]
    rows += [
        (name, p.grad, q.grad)
        for (name, p), q in zip(block.named_parameters(), reference.parameters(), strict=True)
    ]
    width = max(len(name) for name, _, _ in rows)
    worst = 0.0
    print(f"{'gradient':<{width}}  max |split - autograd|")
    for name, got, want in rows:
        if got is None or want is None:
            diff = 0.0 if got is None and want is None else float("inf")
        else:
            diff = (got - want).abs().max().item()
        worst = max(worst, diff)
        print(f"{name:<{width}}  {diff:.3e}")
    ok = untouched and worst <= args.tol
    print(f"\nworst difference {worst:.3e} (tolerance {args.tol:g}): {'OK' if ok else 'FAILED'}")
    return ok
