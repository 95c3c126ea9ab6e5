"""`zbkit plan MODEL --world 4 --memory 80GB --batch 64`: the fastest plan that fits.

MODEL is one of:
- `module:function`: a function (importable from the working directory) returning
  `(layers, sample)` or `(layers, sample, loss_fn)`, the sample one microbatch (with its
  targets where there is a loss): profiled here (`planner.profile`) at every microbatch
  size the plan considers (the sample repeated or cut to it), the wire measured for each
  pipeline degree (`planner.wire`), and with `--check` the plan's top three run on gloo
  ranks (`planner.check`) on a batch of the sample repeated;
- a saved profile (`Profile.save`'s JSON);
- a Hugging Face `config.json` (or any JSON of a decoder's shape): profiled from its closed
  forms (`planner.profile_transformer`) with `--microbatch`, `--seq`, `--dtype`,
  `--tflops` and `--bandwidth`.

A progress line goes to stderr while it profiles, plans and measures; the plan (or with
`--json` its candidates as JSON) to stdout. Bad input: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import torch

from zbkit.planner.check import Check, check
from zbkit.planner.choose import (
    Plan,
    _microbatch_size,
    degrees,
    parse_bytes,
    plan,
    profile_sizes,
)
from zbkit.planner.profile import Profile, map_tensors, profile
from zbkit.planner.transformer import profile_transformer
from zbkit.planner.wire import Wire, wire


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        help="module:function returning (layers, sample[, loss_fn]); a saved profile (JSON); "
        "or an HF config.json",
    )
    parser.add_argument("--schedules", nargs="+", help="default: every one but zb-opt")
    parser.add_argument("--world", type=int, required=True, help="devices in all")
    parser.add_argument("--memory", required=True, help="per device, e.g. 80GB or 24GiB")
    parser.add_argument("--batch", type=int, required=True, help="the global batch, in samples")
    parser.add_argument("--dp", type=int, help="fix the data-parallel degree")
    parser.add_argument("--max-microbatches", type=int, default=64, help="default 64")
    parser.add_argument("--check", action="store_true",
                        help="run the top three on gloo ranks beside their predictions "
                        "(module:function models)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="the candidates as JSON")
    parser.add_argument("--no-wire", action="store_true",
                        help="do not measure the wire and runtime per pipeline degree (code "
                        "models; measured by default, a few seconds each)")  # fmt: skip
    group = parser.add_argument_group("a config.json's closed forms")
    group.add_argument("--microbatch", type=int, default=1, help="samples per microbatch")
    group.add_argument("--seq", type=int, default=4096, help="tokens per sample (default 4096)")
    group.add_argument("--dtype", default="bfloat16", help="default bfloat16")
    group.add_argument("--tflops", type=float, default=400.0,
                       help="the device's dense TFLOP/s (default 400)")  # fmt: skip
    group.add_argument("--checkpointing", default="none", choices=("none", "full"))
    parser.add_argument("--bandwidth",
                        help="bytes/s between data-parallel replicas, e.g. 50GB (default: a "
                        "config's 50GB, a saved profile's own, a code model's measured "
                        "wire)")  # fmt: skip


def main(args: argparse.Namespace) -> int:
    try:
        made = _model(args)
        say(f"planning on {args.world} devices of {args.memory}, global batch {args.batch}")
        found = plan(made["profile"], world=args.world, global_batch=args.batch,
                     memory=args.memory, schedules=args.schedules, dp=args.dp,
                     max_microbatches=args.max_microbatches, wire=made.get("wire"),
                     bandwidth=_bandwidth(args))  # fmt: skip
        checked = _check(args, made, found)
    except (ValueError, TypeError) as err:
        return _refuse(str(err).splitlines()[0])
    print(json.dumps(_as_json(found, checked), indent=1) if args.json else _as_text(found, checked))
    return 0


def say(line: str) -> None:
    """The progress line, on stderr (stdout holds only the plan)."""
    print(f"zbkit plan: {line} ...", file=sys.stderr, flush=True)


def _refuse(message: str) -> int:
    print(f"zbkit plan: {message}", file=sys.stderr)
    return 2


def _model(args: argparse.Namespace) -> dict[str, Any]:
    """The profile (and the layers, sample and loss where the model is code)."""
    text = args.model
    if ":" in text and not Path(text).exists():
        made = _from_code(text, args)
        if not args.no_wire:
            made["wire"] = _wires(made["profile"], args)
        return made
    path = Path(text)
    if not path.is_file():
        raise ValueError(f"{text} is neither module:function nor a file that exists")
    if args.check:
        raise ValueError("--check runs the model: give it as module:function, not a JSON file")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{text} is not JSON ({err})") from err
    if isinstance(data, dict) and "layers" in data and "device" in data:
        return {"profile": Profile.from_json(path.read_text())}
    say(f"profiling {text} from its shape")
    bandwidth = _bandwidth(args) or 50e9  # a config's default: 50 GB/s between replicas
    prof = profile_transformer(path, microbatch=args.microbatch, seq=args.seq, dtype=args.dtype,
                               device_tflops=args.tflops, bandwidth=bandwidth,
                               checkpointing=args.checkpointing)  # fmt: skip
    return {"profile": prof}


def _bandwidth(args: argparse.Namespace) -> float | None:
    """--bandwidth in bytes/s ("50GB" or "50GB/s"), None where not given."""
    if args.bandwidth is None:
        return None
    return float(parse_bytes(args.bandwidth.removesuffix("/s"), "--bandwidth"))


def _from_code(text: str, args: argparse.Namespace) -> dict[str, Any]:
    module_name, _, function_name = text.partition(":")
    sys.path.insert(0, os.getcwd())  # as `python -m` does: the user's own modules
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"cannot import {module_name!r} ({err})") from err
    finally:
        sys.path.remove(os.getcwd())
    # the ranks `--check` starts cannot import it from here: its code travels with the call
    cloudpickle.register_pickle_by_value(module)
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ValueError(f"{module_name} has no function {function_name!r}")
    made = function()
    if not isinstance(made, tuple | list) or len(made) not in (2, 3):
        raise ValueError(
            f"{text} returned {type(made).__name__}: return (layers, sample) or "
            "(layers, sample, loss_fn)"
        )
    layers, sample, loss_fn = (*made, None) if len(made) == 2 else made
    layers = list(layers)
    say(f"profiling {len(layers)} layers of {text}")
    first = profile(layers, sample, loss_fn=loss_fn)  # the sample's own size, kept below
    own = _microbatch_size(first)
    sizes = profile_sizes(args.batch, args.world, first, args.dp, args.max_microbatches)
    say(f"profiling {len(layers)} layers of {text} at microbatch sizes "
        + ", ".join(map(str, sizes)))  # fmt: skip
    # no size (a batch no count divides): `plan` says so, on the first profile
    profiles = {
        n: first if n == own else profile(layers, _rows(sample, n), loss_fn=loss_fn) for n in sizes
    } or first
    return {"profile": profiles, "layers": layers, "sample": sample, "loss_fn": loss_fn}


def _wires(profiles: dict[int, Profile] | Profile, args: argparse.Namespace) -> dict[int, Wire]:
    """The wire and the runtime measured for each pipeline degree the plan considers."""
    parse_bytes(args.memory)  # a bad budget said before the ranks start
    out = {}
    one = profiles if isinstance(profiles, Profile) else next(iter(profiles.values()))
    for pp in degrees(one, args.world, args.dp):
        say(f"measuring the wire and the runtime on {pp} ranks")
        out[pp] = wire(pp=pp)
    return out


def _check(args: argparse.Namespace, made: dict[str, Any], found: Plan) -> Check | None:
    if not args.check:
        return None
    if made.get("loss_fn") is None:
        raise ValueError("--check trains the model: return (layers, sample, loss_fn)")
    batch = _rows(made["sample"], args.batch)
    progress: Callable[[str], None] = say
    started = time.perf_counter()
    checked = check(found, made["layers"], batch, loss_fn=made["loss_fn"], progress=progress)
    say(f"measured in {time.perf_counter() - started:.0f} s")
    return checked


def _rows(sample: Any, rows: int) -> Any:
    """`sample` repeated along dim 0 and cut to `rows` (a microbatch of that size, or the
    batch `check` runs, for its seconds and bytes)."""

    def tiled(t: torch.Tensor) -> torch.Tensor:
        return t.repeat(-(-rows // t.shape[0]), *[1] * (t.dim() - 1))[:rows]

    return map_tensors(tiled, sample)


def _as_text(found: Plan, checked: Check | None) -> str:
    text = str(found)
    if checked is not None:
        text += "\n\nmeasured on gloo ranks:\n" + str(checked)
    return text


def _as_json(found: Plan, checked: Check | None) -> dict[str, Any]:
    rows = [
        {
            "schedule": c.schedule, "pp": c.pp, "dp": c.dp, "microbatches": c.microbatches,
            "microbatch_size": c.microbatch_size,
            "step_seconds": c.step_seconds if c.prediction is not None else None,
            "peak_bytes": c.peak_bytes if c.prediction is not None else None,
            "fullest_rank": c.fullest_rank, "verdict": c.verdict,
            "stages": [[s.start, s.stop] for s in c.stages],
        }
        for c in found.candidates
    ]  # fmt: skip
    out: dict[str, Any] = {"memory": found.memory, "world": found.world,
                           "global_batch": found.global_batch, "advice": found.advice,
                           "chosen": rows[0] if found.chosen is not None else None,
                           "candidates": rows}  # fmt: skip
    if checked is not None:
        out["check"] = [
            {"schedule": c.schedule, "pp": c.pp, "microbatches": c.microbatches,
             "predicted_seconds": c.step_seconds, "measured_seconds": secs,
             "peak_ratios": comp.peak_ratios}
            for c, comp, secs in zip(checked.candidates, checked.comparisons,
                                     checked.measured_seconds, strict=True)
        ]  # fmt: skip
    return out
