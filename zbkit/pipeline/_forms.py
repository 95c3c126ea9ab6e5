"""The forms a stage's tensors take: zbkit's dicts and torch's Tensors and tuples.

A stage module returns ``dict[str, Tensor]`` (zbkit's form) or, as torch's stages do, a
Tensor or a tuple; those travel as ``{"0": t0, "1": t1, ...}`` and are handed to the next
stage's module positionally. These helpers turn one form into the other, pick the inputs a
gradient goes back for, and describe tensors in error messages. No state, no autograd.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

Tensors = dict[str, torch.Tensor]


def as_dict(out: Any) -> tuple[Mapping[str, Any], type | int] | None:
    """A module's output as a dict, and its form (for ``module_output``); None for a form
    that is none of these (``unknown_form`` says why).

    torch's forms get positional keys: a Tensor ``{"0": t}``, a tuple ``{"0": t0, "1": t1}``.
    Digits are no Python argument name, so these keys never clash with a dict module's.
    """
    if isinstance(out, torch.Tensor):
        return {"0": out}, torch.Tensor
    if isinstance(out, tuple | list) and all(isinstance(v, torch.Tensor | None) for v in out):
        return {str(i): v for i, v in enumerate(out)}, len(out)
    if isinstance(out, Mapping) and all(
        isinstance(k, str) and isinstance(v, torch.Tensor | None) for k, v in out.items()
    ):
        return out, dict
    return None


def unknown_form(out: Any) -> str:
    return (
        "a stage module must return a Tensor, a tuple of Tensors (torch's forms) or "
        f"dict[str, Tensor] (zbkit's: outputs by name), got {_kind(out)}"
    )


def _kind(value: Any) -> str:
    if isinstance(value, tuple | list | Mapping):
        items = value.values() if isinstance(value, Mapping) else value
        inner = sorted({type(v).__name__ for v in items})
        return f"{type(value).__name__} of {', '.join(inner) or 'nothing'}"
    return type(value).__name__


def positional(inputs: Mapping[str, Any]) -> tuple:
    """The positional arguments a Tensor- or tuple-returning previous stage handed over:
    keys "0".."n-1" (in any order: the wire sorts names as strings, "10" before "2")."""
    n = len(inputs)
    if n and all(k.isdigit() for k in inputs) and {int(k) for k in inputs} == set(range(n)):
        return tuple(inputs[str(i)] for i in range(n))
    return ()


def as_leaves(inputs: Mapping[str, Any] | torch.Tensor | tuple) -> Any:
    def leaf(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            return t.detach().requires_grad_()
        return t

    if isinstance(inputs, torch.Tensor):
        return leaf(inputs)
    if isinstance(inputs, tuple | list):
        return tuple(leaf(v) for v in inputs)
    if isinstance(inputs, Mapping):
        return {k: leaf(v) for k, v in inputs.items()}
    return inputs


def grad_inputs(inputs: Tensors) -> tuple[list[str], list[torch.Tensor]]:
    """The inputs a gradient is sent back for: those that arrived requiring grad."""
    names = [k for k, v in inputs.items() if isinstance(v, torch.Tensor) and v.requires_grad]
    return names, [inputs[k] for k in names]


def named_grads(names: list[str], grads: list[torch.Tensor | None]) -> Tensors:
    return {k: g for k, g in zip(names, grads, strict=True) if g is not None}


def describe(tensors: Mapping[str, Any]) -> str:
    parts = []
    for k, v in tensors.items():
        if isinstance(v, torch.Tensor):
            parts.append(f"{k}: {str(v.dtype).removeprefix('torch.')}{list(v.shape)}")
        else:
            parts.append(f"{k}: {type(v).__name__}")
    return "{" + ", ".join(parts) + "}"
