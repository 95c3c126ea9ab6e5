"""`plan(profile, world=, global_batch=, memory=)`: which schedule, stages and microbatches.

Every candidate is a schedule, a pipeline degree `pp` that divides `world` (the rest data
parallel, `dp = world / pp`), and a microbatch count `m` that divides each replica's batch
(up to `max_microbatches`). Each is partitioned (`partition`, the schedule's placement,
balanced by time; where that does not fit, balanced under the memory) and predicted
(`predict`): every rank's peak bytes and the step's seconds. With `dp > 1` the gradients'
all-reduce follows the pipeline's step on each rank, priced from its gradient bytes at the
`bandwidth` between replicas (a ring: `2 (dp - 1) / dp` of the bytes each way). zb-auto
searches under the memory left once the rank's static bytes are held.

A profile was taken on one microbatch size; a candidate with another takes the profile of
its size where one is given (`profile` may be a dict of them by microbatch size, as
`profile_sizes` makes), or scales the nearest one's times and per-microbatch bytes
(activations, W state, outputs, the forward's and input pass's transient bytes) by the
ratio of the sizes. That is exact for the closed forms of `profile_transformer`, an estimate
for a measured profile: a weight pass's transient bytes are the size of the weights, and
small microbatches pay fixed costs the scaling does not see.

The `Plan` holds the fastest candidate that fits and every candidate, with why it lost.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from html import escape
from typing import Any

from zbkit.planner.partition import partition
from zbkit.planner.predict import Prediction, _span, predict
from zbkit.planner.profile import Profile, Timing
from zbkit.planner.wire import Wire
from zbkit.schedules import SCHEDULES
from zbkit.schedules.catalog import record

__all__ = ["Candidate", "Plan", "parse_bytes", "plan", "profile_sizes"]

# zb-opt proves an optimum and takes up to a minute per candidate: asked for by name only
DEFAULT_SCHEDULES = tuple(s for s in SCHEDULES if s != "zb-opt")


@dataclass(frozen=True)
class Candidate:
    """One schedule x pp x m: its prediction, or why it was not built; and its verdict."""

    schedule: str
    pp: int
    dp: int
    microbatches: int
    microbatch_size: int
    prediction: Prediction | None
    step_seconds: float  # the pipeline's step and the data-parallel all-reduce after it
    peak_bytes: int  # the fullest rank's
    fullest_rank: int
    verdict: str  # "chosen", "6% slower", "does not fit: ...", "not built: ..."

    @property
    def fits(self) -> bool:
        return self.prediction is not None and not self.verdict.startswith("does not fit")

    @property
    def stages(self) -> list[range]:
        return self.prediction.stages if self.prediction is not None else []


@dataclass(frozen=True)
class Plan:
    """The fastest candidate that fits (`chosen`, None where none fits) and all of them."""

    chosen: Candidate | None
    candidates: list[Candidate]
    memory: int
    world: int
    global_batch: int
    advice: str  # where nothing fits: the least memory any needs, and what would change it

    def top(self, k: int = 3) -> list[Candidate]:
        """The `k` fastest that fit, the chosen first."""
        return [c for c in self.candidates if c.fits][:k]

    def summary(self, rows: int = 8) -> str:
        """The verdict and the first `rows` candidates (`str` holds them all)."""
        lines = str(self).splitlines()
        shown = lines[: rows + 2]
        if len(lines) > len(shown):
            shown.append(f"... and {len(lines) - len(shown)} more candidates")
        return "\n".join(shown)

    def __str__(self) -> str:
        head = (
            f"plan for {self.world} devices of {format_bytes(self.memory)}, global batch "
            f"{self.global_batch}: "
        )
        if self.chosen is None:
            head += "nothing fits. " + self.advice
        else:
            c = self.chosen
            head += (
                f"{c.schedule}, pp={c.pp}, dp={c.dp}, m={c.microbatches} (microbatch "
                f"{c.microbatch_size}): step {_ms(c.step_seconds)} ms, fullest rank "
                f"{c.fullest_rank} at {format_bytes(c.peak_bytes)}; stages "
                + ", ".join(_span(s) for s in c.stages)
            )
        return head + "\n" + _table(self.candidates)

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        first, *rest = self.summary(20).splitlines()
        return f"<p>{escape(first)}</p><pre>{escape(chr(10).join(rest))}</pre>"


def _table(candidates: list[Candidate]) -> str:
    head = (f"{'schedule':<17} {'pp':>3} {'dp':>3} {'m':>3} {'mb':>4} {'step ms':>9} "
            f"{'peak':>10}  why")  # fmt: skip
    rows = [head]
    for c in candidates:
        step = f"{_ms(c.step_seconds):>9}" if c.prediction is not None else f"{'-':>9}"
        peak = format_bytes(c.peak_bytes) if c.prediction is not None else "-"
        rows.append(
            f"{c.schedule:<17} {c.pp:>3} {c.dp:>3} {c.microbatches:>3} {c.microbatch_size:>4} "
            f"{step} {peak:>10}  {c.verdict}"
        )
    return "\n".join(rows)


# ---- bytes as people write them ----------------------------------------------------------

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip


def parse_bytes(value: int | float | str, what: str = "memory") -> int:
    """Bytes from an int or a string such as "80GB", "80 GiB", "512MB" (GB = 10^9 bytes,
    GiB = 2^30, as the vendors and torch print them)."""
    if isinstance(value, bool):
        raise ValueError(f"plan: {what} is bytes or a size like '80GB', got {value!r}")
    if isinstance(value, int | float):
        nbytes = int(value)
    elif isinstance(value, str):
        found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        if not found or found.group(2).lower() not in _UNITS:
            raise ValueError(
                f"plan: {what} {value!r} is not a size: write bytes, or e.g. '80GB' or '80GiB'"
            )
        nbytes = int(float(found.group(1)) * _UNITS[found.group(2).lower()])
    else:
        raise ValueError(f"plan: {what} is bytes or a size like '80GB', got {value!r}")
    if nbytes <= 0:
        raise ValueError(f"plan: {what} must be more than 0 bytes, got {value!r}")
    return nbytes


def format_bytes(nbytes: float) -> str:
    """GB (10^9) with three digits (whole GB from 1000), MB below a GB."""
    if nbytes >= 1e12:
        return f"{nbytes / 1e9:.0f} GB"
    if nbytes >= 1e9:
        return f"{nbytes / 1e9:.3g} GB"
    return f"{nbytes / 1e6:.3g} MB"


def _ms(seconds: float) -> str:
    """Milliseconds with four digits, whole ones from 1000."""
    ms = seconds * 1e3
    return f"{ms:.0f}" if ms >= 1000 else f"{ms:.4g}"


# ---- the search ---------------------------------------------------------------------------


def plan(
    profile: Profile | Mapping[int, Profile],
    *,
    world: int,
    global_batch: int,
    memory: int | str,
    schedules: Sequence[str] | None = None,
    dp: int | None = None,
    bandwidth: float | None = None,
    wire: Wire | Mapping[int, Wire] | None = None,
    max_microbatches: int = 64,
) -> Plan:
    """The fastest schedule x pp x m x partition that fits `memory` per device (module
    docstring). `schedules`: names of `zbkit.schedules.SCHEDULES` (default all but zb-opt);
    `dp`: fix the data-parallel degree (default: every pp dividing `world`); `bandwidth`:
    bytes/s between replicas for the all-reduce (default the profile's, or `wire`'s);
    `wire`: a measured `planner.wire()` for the pipeline's transfers and runtime, or one
    per pipeline degree ({pp: wire}: ranks crowd a host's cores more, the more there are)."""
    profiles = _by_size(profile)
    profile = profiles[min(profiles)]
    limit = parse_bytes(memory)
    names = _schedules(schedules)
    for what, value in (("world", world), ("global_batch", global_batch),
                        ("max_microbatches", max_microbatches)):  # fmt: skip
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"plan: {what} must be an int >= 1, got {value!r}")
    _check_fits_at_all(profile, world, limit)
    pps = degrees(profile, world, dp)
    wires = _wires(wire, pps)
    candidates = []
    # scaling a profile's times alike leaves its partition by time as it is: one per profile
    by_time: dict[tuple[int, str, int, int], list[range]] = {}
    for pp in pps:
        replicas = world // pp
        counts = _counts(global_batch, replicas, max_microbatches)
        speed = _bandwidth(profile, bandwidth, wires[pp])
        if replicas > 1 and speed is None and counts:
            raise ValueError(
                f"plan: pp={pp} leaves dp={replicas} replicas, whose gradient all-reduce needs "
                "the bandwidth between them: give bandwidth= (bytes/s; zbkit plan "
                "--bandwidth), or a wire"
            )
        for m in counts:
            rows = global_batch // replicas // m
            size = _nearest(profiles, rows)
            scaled = _scaled(profiles[size], rows / size)
            for name in names:
                candidates.append(_candidate(scaled, name, pp, replicas, m, limit, speed,
                                             wires[pp], rows, by_time, size))  # fmt: skip
    if not candidates:
        raise ValueError(
            f"plan: no microbatch count divides the batch: global_batch {global_batch} over "
            f"dp = {', '.join(str(world // p) for p in pps)} replicas leaves no whole "
            "batch per replica; choose a batch that the data-parallel degree divides"
        )
    return _ranked(candidates, limit, world, global_batch)


def _schedules(schedules: Sequence[str] | None) -> list[str]:
    if schedules is None:
        return list(DEFAULT_SCHEDULES)
    if isinstance(schedules, str):
        schedules = [schedules]
    names = list(schedules)
    for name in names:
        if name not in SCHEDULES:
            raise ValueError(f"plan: unknown schedule {name!r}: one of {', '.join(SCHEDULES)}")
    return names


def _check_fits_at_all(profile: Profile, world: int, limit: int) -> None:
    """A budget below the model's static bytes spread evenly over every device: no plan."""
    static = sum(x.param_bytes + x.grad_bytes + x.optimizer_bytes for x in profile.layers)
    if static / world > limit:
        raise ValueError(
            f"plan: {format_bytes(limit)} per device is below the parameters, gradients and "
            f"optimizer state alone: {format_bytes(static)} over {world} devices is "
            f"{format_bytes(static / world)} each; more devices, or more memory"
        )


def degrees(profile: Profile, world: int, dp: int | None) -> list[int]:
    """The pipeline degrees `plan` considers: each pp >= 2 dividing `world` with a layer
    for each of its ranks (or world / dp alone)."""
    if dp is not None:
        if not isinstance(dp, int) or isinstance(dp, bool) or dp < 1 or world % dp:
            raise ValueError(f"plan: dp={dp!r} does not divide world={world}")
        pps = [world // dp]
    else:
        pps = [p for p in range(2, world + 1) if world % p == 0]
    usable = [p for p in pps if 2 <= p <= len(profile)]
    if not usable:
        raise ValueError(
            f"plan: no pipeline degree fits world={world}"
            + (f" with dp={dp}" if dp is not None else "")
            + f": pp must divide it, be at least 2 and at most the {len(profile)} layers"
        )
    return usable


def _counts(global_batch: int, replicas: int, most: int) -> list[int]:
    if global_batch % replicas:
        return []
    batch = global_batch // replicas
    return [m for m in range(1, min(batch, most) + 1) if batch % m == 0]


def _by_size(profile: Profile | Mapping[int, Profile]) -> dict[int, Profile]:
    """The profiles by their microbatch's size, checked to be of one model."""
    if isinstance(profile, Profile):
        return {_microbatch_size(profile): profile}
    if not isinstance(profile, Mapping) or not profile:
        raise TypeError(
            f"plan takes a planner.Profile or a dict of them by microbatch size, got "
            f"{type(profile).__name__}"
        )
    out = {}
    for size, prof in profile.items():
        if not isinstance(prof, Profile):
            raise TypeError(f"plan: the profile for size {size!r} is a {type(prof).__name__}")
        if _microbatch_size(prof) != size:
            raise ValueError(
                f"plan: the profile under size {size!r} was taken on a microbatch of "
                f"{_microbatch_size(prof)}"
            )
        out[size] = prof
    names = {tuple(x.name for x in p.layers) for p in out.values()}
    if len(names) > 1:
        raise ValueError("plan: the profiles by size are not of one model (their layers differ)")
    return out


def _nearest(profiles: Mapping[int, Profile], rows: int) -> int:
    """The size whose profile a microbatch of `rows` takes: its own, else the largest
    below it, else the smallest above."""
    if rows in profiles:
        return rows
    below = [s for s in profiles if s < rows]
    return max(below) if below else min(profiles)


def profile_sizes(global_batch: int, world: int, profile: Profile, dp: int | None = None,
                  max_microbatches: int = 64) -> list[int]:  # fmt: skip
    """The microbatch sizes `plan` considers for this batch and world: profile each (a
    dict of profiles by size) and no candidate's bytes or seconds are scaled."""
    sizes = set()
    for pp in degrees(profile, world, dp):
        replicas = world // pp
        for m in _counts(global_batch, replicas, max_microbatches):
            sizes.add(global_batch // replicas // m)
    return sorted(sizes)


def _microbatch_size(profile: Profile) -> int:
    """The profiled microbatch's size: the first tensor's first dimension in `sample`."""
    todo: list[Any] = [profile.sample]
    while todo:
        item = todo.pop(0)
        if isinstance(item, dict) and isinstance(item.get("shape"), list):
            if item["shape"]:
                return int(item["shape"][0])
        elif isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    raise ValueError(
        "plan: the profile does not say its microbatch's size (no tensor in its sample): "
        "profile one microbatch of the batch the plan divides"
    )


def _wires(wire: Wire | Mapping[int, Wire] | None, degrees: list[int]) -> dict[int, Wire | None]:
    if wire is None or isinstance(wire, Wire):
        return dict.fromkeys(degrees, wire)
    if not isinstance(wire, Mapping) or not all(isinstance(w, Wire) for w in wire.values()):
        raise ValueError("plan: wire is a planner.wire() result, or a dict of them by pp")
    missing = [p for p in degrees if p not in wire]
    if missing:
        raise ValueError(
            f"plan: no wire for pp={', '.join(map(str, missing))}: measure planner.wire(pp=...) "
            "for each degree, or give one wire for all"
        )
    return {p: wire[p] for p in degrees}


def _bandwidth(profile: Profile, bandwidth: float | None, wire: Wire | None) -> float | None:
    if bandwidth is not None:
        if not isinstance(bandwidth, int | float) or bandwidth <= 0:
            raise ValueError(f"plan: bandwidth is bytes/s > 0, got {bandwidth!r}")
        return float(bandwidth)
    if profile.bandwidth is not None:
        return float(profile.bandwidth)
    if wire is not None and wire.per_byte > 0:
        return 1.0 / wire.per_byte
    return None


# what a microbatch's size scales; a weight pass's transients (a gradient being made) and
# the optimizer's do not
_PER_MICROBATCH = ("activation_bytes", "weight_state_bytes", "output_bytes",
                   "forward_extra_bytes", "input_grad_extra_bytes")  # fmt: skip
_TIMES = ("forward", "input_grad", "weight_grad")


def _scaled(profile: Profile, factor: float) -> Profile:
    """The profile at `factor` times its microbatch (module docstring)."""
    if factor == 1:
        return profile
    layers = []
    for x in profile.layers:
        changes: dict[str, Any] = {k: int(getattr(x, k) * factor) for k in _PER_MICROBATCH}
        changes |= {k: _times(getattr(x, k), factor) for k in _TIMES}
        if x.weight_grad_accumulate is not None:
            changes["weight_grad_accumulate"] = _times(x.weight_grad_accumulate, factor)
        layers.append(replace(x, **changes))
    return replace(profile, layers=tuple(layers))


def _times(t: Timing, factor: float) -> Timing:
    return Timing(t.median * factor, t.fastest * factor, t.slowest * factor)


def _candidate(profile, name, pp, dp, m, limit, speed, wire, size, by_time, source) -> Candidate:
    def refused(why: str) -> Candidate:
        return Candidate(name, pp, dp, m, size, None, 0.0, 0, 0, f"not built: {why}")

    found = record(name)
    try:
        count = len(found.stage_to_rank(pp))
        placement = found.placement
        key = (count, placement, pp, source)
        if key not in by_time:
            by_time[key] = partition(profile, count, placement=placement, pp=pp).stages
        parts = by_time[key]
        options = _auto_limit(profile, name, parts, found, pp, limit)
        pred = predict(profile, name, pp=pp, microbatches=m, stages=parts, wire=wire, **options)
        if _peak(pred)[0] > limit:  # balanced by time does not fit: balanced under the limit
            held = _held(pred)
            try:
                tight = partition(profile, count, placement=placement, pp=pp,
                                  memory=limit, held=held).stages  # fmt: skip
            except ValueError:
                tight = None
            if tight is not None and tight != parts:
                again = predict(profile, name, pp=pp, microbatches=m, stages=tight, wire=wire,
                                **_auto_limit(profile, name, tight, found, pp, limit))  # fmt: skip
                if _peak(again)[0] < _peak(pred)[0]:
                    pred = again
    except ValueError as err:  # too few microbatches, a placement it cannot take, ...
        return refused(str(err).split("\n")[0])
    peak, rank = _peak(pred)
    step = pred.step_seconds + _all_reduce(pred, dp, speed)
    verdict = ""
    if peak > limit:
        verdict = f"does not fit: rank {rank} needs {format_bytes(peak)} of {format_bytes(limit)}"
    return Candidate(name, pp, dp, m, size, pred, step, peak, rank, verdict)


def _auto_limit(profile, name, parts, found, pp, limit) -> dict[str, Any]:
    """zb-auto's limit: the bytes a rank may hold for activations and W state, what is
    left of `limit` once its parameters, gradients and optimizer state are held."""
    if found.searches != "always":
        return {}
    where = found.stage_to_rank(pp)
    static = [0] * pp
    for s, part in enumerate(parts):
        static[where[s]] += sum(
            profile.layers[i].param_bytes + profile.layers[i].grad_bytes
            + profile.layers[i].optimizer_bytes for i in part
        )  # fmt: skip
    left = limit - max(static)
    if left <= 0:
        raise ValueError(f"{name}: nothing left for activations once the parameters are held")
    return {"memory_limit": float(left)}


def _peak(pred: Prediction) -> tuple[int, int]:
    rank = max(range(len(pred.ranks)), key=lambda r: pred.ranks[r].peak_bytes)
    return pred.ranks[rank].peak_bytes, rank


def _held(pred: Prediction) -> list[float]:
    """Per stage, the most microbatches it held at once from F until their input pass, in
    the simulation (the counts `partition` weighs each stage's activations by)."""
    changes = []
    for e in pred.simulation.events:
        if e.kind == "F":
            changes.append((e.start, 1, e.stage))
        elif e.kind in ("I", "B"):
            changes.append((e.end, -1, e.stage))
    level = [0] * len(pred.stages)
    most = [1] * len(pred.stages)
    for _, delta, stage in sorted(changes):  # at one time, what is let go first
        level[stage] += delta
        most[stage] = max(most[stage], level[stage])
    return [float(n) for n in most]


def _all_reduce(pred: Prediction, dp: int, speed: float | None) -> float:
    """Seconds of the slowest rank's gradient all-reduce over `dp` replicas (a ring)."""
    if dp <= 1 or speed is None:
        return 0.0
    where = pred.schedule.stage_to_rank
    grads = [0] * pred.schedule.pp
    for s, part in enumerate(pred.stages):
        grads[where[s]] += sum(pred.profile.layers[i].grad_bytes for i in part)
    return 2 * (dp - 1) / dp * max(grads) / speed


def _ranked(candidates: list[Candidate], limit: int, world: int, batch: int) -> Plan:
    fits = sorted((c for c in candidates if c.prediction is not None and not c.verdict),
                  key=lambda c: (c.step_seconds, c.peak_bytes))  # fmt: skip
    rest = [c for c in candidates if c.prediction is None or c.verdict]
    over = sorted((c for c in rest if c.prediction is not None), key=lambda c: c.peak_bytes)
    refused = [c for c in rest if c.prediction is None]
    if not fits:
        return Plan(None, over + refused, limit, world, batch, _advice(over, limit))
    best = fits[0]
    ranked = [replace(best, verdict="chosen")]
    for c in fits[1:]:
        slower = c.step_seconds / best.step_seconds - 1
        ranked.append(replace(c, verdict=f"{slower:.0%} slower" if slower >= 0.005
                              else "as fast (within 0.5%)"))  # fmt: skip
    return Plan(ranked[0], ranked + over + refused, limit, world, batch, "")


def _advice(over: list[Candidate], limit: int) -> str:
    """Where nothing fits: the least any candidate needs, and what would lower it: more
    devices where even the candidate with the least static bytes per rank holds more than
    the budget in them; otherwise less held for the backward."""
    if not over:
        return "no candidate could be built (each says why)"
    least = over[0]
    static = min(_static(c) for c in over)
    if static > limit:
        change = (
            f"the parameters, gradients and optimizer state alone need {format_bytes(static)} "
            "on a rank of the deepest pipeline: more devices, or more memory"
        )
    else:
        change = (
            f"the model's state fits ({format_bytes(static)} on a rank of the deepest "
            "pipeline): what is held for the backward does not. Activation checkpointing "
            "(profile_transformer(..., checkpointing='full')), a smaller microbatch (more "
            "microbatches), more stages, or a schedule that holds fewer (1F1B, ZB-H1, V-Min)"
        )
    return (
        f"The least any candidate needs is {format_bytes(least.peak_bytes)} on its fullest "
        f"rank ({least.schedule}, pp={least.pp}, m={least.microbatches}, rank "
        f"{least.fullest_rank}), against {format_bytes(limit)}; {change}."
    )


def _static(c: Candidate) -> int:
    """The most parameter, gradient and optimizer bytes any of the candidate's ranks holds."""
    assert c.prediction is not None  # only built candidates are advised on
    return max(r.parameters + r.gradients + r.optimizer for r in c.prediction.ranks)
