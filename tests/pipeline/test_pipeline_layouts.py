"""What a stage sends may change between microbatches and steps (issue 32.4).

A Hugging Face stage returns a mask that is None for a microbatch without padding and a
bool tensor for one with padding; the runner moves either, without ``forget_shapes()``, and
what cannot travel fails both ranks at once with the reason. The oracle: plain autograd on
the whole batch (and LocalPipeline).

The tests without processes read the shape messages (`pipeline._shapes`) directly: a message
between two ranks is their only face, and those below the line see it through the runner.
"""

from __future__ import annotations

import sys

import cloudpickle
import layout_ranks
import pytest
import torch

from zbkit.launch import launch
from zbkit.pipeline._shapes import Meta, pack, read, unpack, unsendable

cloudpickle.register_pickle_by_value(layout_ranks)
cloudpickle.register_pickle_by_value(sys.modules[__name__])

CPU = torch.device("cpu")


# ---------------------------------------------------------------- no processes
def test_a_mask_that_is_none_or_a_tensor_makes_two_layouts() -> None:
    h = torch.randn(2, 16, 8, requires_grad=True)
    plain = Meta.of({"hidden": h, "mask4d": None})
    padded = Meta.of({"hidden": h, "mask4d": torch.ones(2, 1, 16, 16, dtype=torch.bool)})
    assert plain != padded and len({plain, padded, Meta.of({"mask4d": None, "hidden": h})}) == 2
    assert plain.describe() == "hidden: float32[2, 16, 8], mask4d: None"
    # a layout travels numbered, as JSON, and comes back equal
    assert read(pack(padded, CPU, 3)) == (3, padded)


def test_what_cannot_travel_is_named_with_what_to_do() -> None:
    t = torch.zeros(2)
    assert unsendable({"hidden": t, "mask4d": None}, CPU) is None
    assert "'note' is a str, not a tensor" in unsendable({"hidden": t, "note": "x"}, CPU)
    many = unsendable({f"t{i}": t for i in range(65)}, CPU)
    assert "65 tensors, over the 64" in many and "stack" in many
    sparse = unsendable({"s": torch.eye(2).to_sparse()}, CPU)
    assert "sparse" in sparse and ".to_dense()" in sparse
    assert "names are str" in unsendable({0: t}, CPU)
    big = Meta.of({"n" * 5000: t})
    with pytest.raises(ValueError, match="over the 4092 a shape message holds"):
        pack(big, CPU)


def test_shape_messages_are_json_not_pickle() -> None:
    tensors = {"x": torch.randn(2, 3, requires_grad=True), "ids": torch.arange(2)}
    meta = Meta.of(tensors)
    assert unpack(pack(meta, torch.device("cpu"))) == meta  # round trip, dtypes included
    buf = pack(meta, torch.device("cpu"))
    raw = bytes(buf.numpy())
    assert b'"names": ["ids", "x"]' in raw and b"pickle" not in raw
    evil = bytearray(raw)  # a dtype name that is not a torch dtype is refused, never run
    text = raw[4 : 4 + int.from_bytes(raw[:4], "little")].replace(b'"int64"', b'"Tensor"')
    evil[:4] = len(text).to_bytes(4, "little")
    evil[4 : 4 + len(text)] = text
    with pytest.raises(ValueError, match="unknown dtype 'Tensor'"):
        unpack(torch.frombuffer(evil, dtype=torch.uint8))


# ---------------------------------------------------------------- real ranks
@pytest.mark.multiprocess
def test_layouts_that_change_match_full_batch_autograd() -> None:
    out = launch(layout_ranks.check_layouts, ["1f1b", "zb-h1", "zb-v"], nprocs=2, timeout=300)
    rows = [r for rank in out for r in rank]
    assert len(rows) == 2 * 3 * len(layout_ranks.STEPS)
    for r in rows:
        assert r["loss_err"] < 1e-5 and r["local_loss_err"] < 1e-5, r
        assert r["grad_err"] < 1e-5 and r["local_grad_err"] < 1e-5, r
        assert r["pending"] == 0, r


@pytest.mark.multiprocess
def test_what_cannot_travel_fails_both_ranks_at_once() -> None:
    # a wait that must succeed gets minutes, so a fast failure cannot be the timeout's luck
    timeout = 120.0
    out = launch(
        layout_ranks.check_unsendable, ["a str", "65 tensors"], timeout, nprocs=2, timeout=400
    )
    got = {(r["case"], r["rank"]): r for rank in out for r in rank}
    for r in got.values():
        assert r["took"] < 60, r  # far less than the timeout
    # the stage refuses the str (rank 0, 0F1); rank 1, waiting for it, gets the same words
    sender, receiver = got["a str", 0]["outcome"], got["a str", 1]["outcome"]
    assert sender.startswith("StageError") and "stage 0 microbatch 1" in sender, sender
    assert "a stage module must return" in sender, sender
    assert receiver.startswith("CommTimeout: rank 1: rank 0 failed and told this rank"), receiver
    assert "which 1F1 needs" in receiver and "stage 0 microbatch 1" in receiver, receiver
    assert "a stage module must return" in receiver and "<-- ERROR HERE" in receiver, receiver
    # the wire refuses 65 tensors: the sender names the transfer and what to do ...
    sender, receiver = got["65 tensors", 0]["outcome"], got["65 tensors", 1]["outcome"]
    assert sender.startswith("ValueError: rank 0: refused sending the activations"), sender
    assert "(stage 1 microbatch 1)" in sender and "65 tensors, over the 64" in sender, sender
    # ... and the receiver fails at once with the same reason
    assert receiver.startswith("CommTimeout: rank 1: rank 0 failed"), receiver
    assert "which 1F1 needs" in receiver and "65 tensors, over the 64" in receiver, receiver
