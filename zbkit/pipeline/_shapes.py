"""What a message carries (its layout: names, shapes, dtypes, requires_grad, None places).

A transfer's layouts are numbered as they first appear; a new one travels once as a shape
message: a fixed-size byte tensor, so a receiver can post it before it knows anything: 4
bytes of length, then JSON (the layout's number, names, shapes, dtype names, requires_grad).
JSON, not pickle: nothing that arrives over the wire is ever executed, and a dtype name is
only looked up among torch's dtypes. ``unsendable`` says why a message cannot travel at all.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

META_BYTES = 4096  # one fixed-size message
MAX_TENSORS = 64  # tensors in one message: each has its own tag (see _comms._SLOTS)


@dataclass(frozen=True, slots=True)
class Meta:
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    requires_grad: tuple[bool, ...]
    nones: tuple[str, ...] = ()  # names that travel as None (no data): a tuple keeps its places

    @classmethod
    def of(cls, tensors: Mapping[str, torch.Tensor | None]) -> Meta:
        # a deterministic order by key on both sides
        present = {k: v for k, v in tensors.items() if v is not None}
        names = tuple(sorted(present))
        return cls(
            names,
            tuple(tuple(present[k].shape) for k in names),
            tuple(present[k].dtype for k in names),
            tuple(present[k].requires_grad for k in names),
            tuple(sorted(k for k, v in tensors.items() if v is None)),
        )

    def describe(self) -> str:
        parts = [
            f"{n}: {str(d).removeprefix('torch.')}{list(s)}"
            for n, s, d in zip(self.names, self.shapes, self.dtypes, strict=True)
        ]
        return ", ".join(parts + [f"{n}: None" for n in self.nones])


def unsendable(tensors: Mapping[Any, Any], device: torch.device) -> str | None:
    """Why ``tensors`` cannot travel as one message (what to do included), or None."""
    for k, v in tensors.items():
        if not isinstance(k, str):
            return f"the name {k!r} is a {type(k).__name__}: names are str"
        if v is None:
            continue  # travels as a name in the shape message, no data
        if not isinstance(v, torch.Tensor):
            return (
                f"{k!r} is a {type(v).__name__}, not a tensor: only tensors and None travel "
                "between stages; make it a tensor, or compute it on the stage that needs it"
            )
        if v.layout is not torch.strided:
            return f"{k!r} is a {v.layout} tensor: only dense tensors travel (.to_dense())"
        if v.device.type != device.type:
            return (
                f"{k!r} is on {v.device} but this pipeline moves {device.type} tensors: "
                f"return it on {device.type}"
            )
    n = sum(v is not None for v in tensors.values())
    if n > MAX_TENSORS:
        return (
            f"it carries {n} tensors, over the {MAX_TENSORS} one message holds: "
            "stack some of them into one tensor"
        )
    return None


def pack(meta: Meta, device: torch.device, layout: int = 0) -> torch.Tensor:
    """The meta, numbered ``layout``, as a fixed-size byte tensor: 4 bytes of length, then
    the JSON."""
    doc = {
        "layout": layout,
        "names": list(meta.names),
        "shapes": [list(s) for s in meta.shapes],
        "dtypes": [str(d).removeprefix("torch.") for d in meta.dtypes],
        "requires_grad": list(meta.requires_grad),
        "nones": list(meta.nones),
    }
    blob = json.dumps(doc).encode()
    if len(blob) + 4 > META_BYTES:
        raise ValueError(
            f"the names and shapes of one message take {len(blob)} bytes, over the "
            f"{META_BYTES - 4} a shape message holds; send fewer tensors per stage"
        )
    return to_bytes_tensor(blob, META_BYTES, device)


def to_bytes_tensor(blob: bytes, size: int, device: torch.device) -> torch.Tensor:
    """`blob` as a fixed-size byte tensor (4 bytes of length, the bytes, zeros), so a
    receiver can post its buffer before it knows the length. `len(blob) + 4 <= size`."""
    buf = bytearray(size)
    buf[:4] = len(blob).to_bytes(4, "little")
    buf[4 : 4 + len(blob)] = blob
    return torch.frombuffer(buf, dtype=torch.uint8).to(device)  # NCCL sends device memory


def from_bytes_tensor(buf: torch.Tensor) -> bytes:
    """The bytes `to_bytes_tensor` put in `buf`."""
    raw = bytes(buf.cpu().tolist())  # not .numpy(): the core install has no NumPy
    return raw[4 : 4 + int.from_bytes(raw[:4], "little")]


def unpack(buf: torch.Tensor) -> Meta:
    return read(buf)[1]


def read(buf: torch.Tensor) -> tuple[int, Meta]:
    """What ``pack`` wrote: the layout's number and the meta."""
    doc = json.loads(from_bytes_tensor(buf))
    dtypes = []
    for name in doc["dtypes"]:
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"a shape message names an unknown dtype {name!r}")
        dtypes.append(dtype)
    return int(doc.get("layout", 0)), Meta(
        tuple(str(n) for n in doc["names"]),
        tuple(tuple(int(x) for x in s) for s in doc["shapes"]),
        tuple(dtypes),
        tuple(bool(r) for r in doc["requires_grad"]),
        tuple(str(n) for n in doc.get("nones", ())),
    )
