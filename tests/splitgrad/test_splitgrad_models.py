"""Whole models: after I then W every gradient equals plain autograd's."""

import pytest
import torch
from _splitgrad_oracle import compare_split_to_autograd, random_grads

from zbkit.models import MLP, SmallConvNet, TiedLM, TransformerBlock

ORDERS = ["I0 I1 W0 W1", "I0 W0 I1 W1", "I0 I1 W1 W0", "I1 I0 W0 W1"]


def one(m):
    return lambda mod, xs: [mod(xs[0])]


@pytest.mark.parametrize("order", ORDERS)
def test_mlp_microbatch_orders(order):
    torch.manual_seed(0)
    mlp = MLP((6, 10, 10, 3)).double()
    mbs = [[torch.randn(5, 6, dtype=torch.float64, requires_grad=True)] for _ in range(2)]
    compare_split_to_autograd(mlp, one(mlp), mbs, order, output_grads=random_grads)


def test_mlp_scalar_loss():
    torch.manual_seed(1)
    mlp = MLP().double()
    mbs = [[torch.randn(4, 8, dtype=torch.float64, requires_grad=True)]]
    compare_split_to_autograd(mlp, lambda m, xs: [m(xs[0]).pow(2).mean()], mbs)


@pytest.mark.parametrize("order", ["I0 I1 I2 W2 W0 W1", "I0 W0 I1 I2 W1 W2"])
def test_transformer_block(order):
    torch.manual_seed(2)
    block = TransformerBlock(dim=16, heads=2).double()
    mbs = [[torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)] for _ in range(3)]
    compare_split_to_autograd(block, one(block), mbs, order, output_grads=random_grads)


def test_conv_net():
    torch.manual_seed(3)
    net = SmallConvNet().double()
    mbs = [[torch.randn(2, 3, 7, 7, dtype=torch.float64, requires_grad=True)] for _ in range(2)]
    compare_split_to_autograd(net, one(net), mbs, "I0 I1 W1 W0", output_grads=random_grads)


def test_tied_embeddings_first_stage():
    # ids do not require grad: I does nothing, W must produce every gradient,
    # and the tied weight gets both its embedding and its projection share
    torch.manual_seed(4)
    lm = TiedLM().double()
    mbs = [[torch.randint(0, 11, (2, 5))] for _ in range(2)]
    compare_split_to_autograd(lm, one(lm), mbs, "I0 I1 W1 W0", output_grads=random_grads)


def test_tied_weights_middle_stage():
    torch.manual_seed(5)
    lm = TiedLM(vocab=7, dim=6).double()

    def fwd(m, xs):  # the stage input is an activation; the tied weight is used twice
        h = xs[0] @ m.embed.weight  # (b, t, dim)
        return [m.block(h) @ m.embed.weight.T]

    mbs = [[torch.randn(2, 3, 7, dtype=torch.float64, requires_grad=True)] for _ in range(2)]
    compare_split_to_autograd(lm, fwd, mbs, "I0 I1 W0 W1", output_grads=random_grads)
