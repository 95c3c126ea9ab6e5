"""needs_direction: which half each pass wants, and exactness when a Function skips."""

import pytest
import torch
from _splitgrad_oracle import compare_split_to_autograd, random_grads
from test_splitgrad_defects import Params, TwoOut, x_

from zbkit.splitgrad import GradDirection, grad_directions, needs_direction

IN, W = GradDirection.INPUT, GradDirection.WEIGHT


def test_default_and_nesting():
    assert needs_direction(IN) and needs_direction(W)
    with grad_directions(IN):
        assert needs_direction(IN) and not needs_direction(W)
        with grad_directions(W):
            assert needs_direction(W) and not needs_direction(IN)
        assert needs_direction(IN) and not needs_direction(W)
    assert needs_direction(IN) and needs_direction(W)
    with pytest.raises(TypeError, match="GradDirection"):
        with grad_directions("input"):
            pass


def test_first_stage_custom_function_on_param_only_activation():
    # first stage: the Function's "activation" argument comes from parameters
    # alone, so W must ask it for both halves or `emb` gets nothing
    torch.manual_seed(0)
    m = Params(emb=(2, 3), w=(3, 3))

    def fwd(m, xs):
        a, b = TwoOut.apply(torch.tanh(m.emb * xs[0]), m.w)
        return [a, b]

    TwoOut.calls.clear()
    compare_split_to_autograd(m, fwd, [[x_(2, 3, grad=False)]], output_grads=random_grads)
    assert TwoOut.calls[-1] == (True, True)


def test_custom_function_with_derived_weight_argument():
    # the weight reaches the Function through w * 2: still exact
    torch.manual_seed(1)
    m = Params(w=(3, 3))

    def fwd(m, xs):
        a, b = TwoOut.apply(xs[0], m.w * 2)
        return [a + b]

    compare_split_to_autograd(
        m, fwd, [[x_(2, 3)], [x_(2, 3)]], "I0 I1 W1 W0", output_grads=random_grads
    )
