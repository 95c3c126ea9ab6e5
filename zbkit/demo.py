"""`zbkit demo`: split a transformer block's backward into I and W, check it against autograd."""

from __future__ import annotations

import argparse
import copy

import torch

from zbkit.models import TransformerBlock
from zbkit.splitgrad import analyze, stage_backward_input, stage_backward_weight


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dim", type=int, default=32, help="model width (default 32)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    parser.add_argument("--tokens", type=int, default=8, help="sequence length (default 8)")
    parser.add_argument("--batch", type=int, default=2, help="batch size (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tol", type=float, default=1e-5, help="largest allowed |split - autograd| (default 1e-5)"
    )


def main(args: argparse.Namespace) -> int:
    torch.manual_seed(args.seed)
    block = TransformerBlock(args.dim, args.heads)
    reference = copy.deepcopy(block)
    # a middle pipeline stage: the input is an activation that requires grad
    x = torch.randn(args.batch, args.tokens, args.dim, requires_grad=True)
    grad_out = torch.randn(args.batch, args.tokens, args.dim)  # from the next stage

    out = block(x)
    analysis = analyze(out, x, block)
    print(analysis)
    print()

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
    return 0 if ok else 1
