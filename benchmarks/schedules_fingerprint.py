"""A fingerprint of `zbkit.schedules`' behaviour, read through its public API only.

Every named schedule's program over a grid of p and m (or the error it raises), its
simulation (makespan, bubble, per-rank peaks, busy and span) and its post-validated
throughput under several `Costs`, zb-auto's programs and explanations under several memory
limits and both placements, `lower_bound`, `bound_for`, `solve`, the closed forms and the
communication plans. A refactor of the package must leave it identical:

    python benchmarks/schedules_fingerprint.py            # prints the digest
    python benchmarks/schedules_fingerprint.py --out FILE  # and writes every value as JSON

`tests/schedules/test_fingerprint.py` holds the digest of today's behaviour.
"""

from __future__ import annotations

import argparse
import hashlib
import json

from zbkit.schedules import (
    SCHEDULES,
    Costs,
    build_schedule,
    derive_plan,
    explain_auto,
    lower_bound,
    simulate,
    solve,
    validate,
)
from zbkit.schedules.formulas import bubble, peak_memory
from zbkit.schedules.optimum.exact import bound_for
from zbkit.schedules.throughput import throughput

COSTS = {
    "equal": Costs(F=1, I=1, W=1),
    "paper": Costs(F=18.5, I=18.1, W=9.3, comm=0.6, mem_activation=1, mem_weight=0.37),
    "i-heavy": Costs(F=1, I=2, W=0.5, comm=0.25, mem_weight=0.5),
    "overlap": Costs(F=1, I=1.2, W=0.8, comm=0.1, overlap=0.3),
}
GRID = [(p, m) for p in (1, 2, 3, 4) for m in (1, 2, 3, 4, 6, 8)]


def _round(x: float) -> float:
    return round(float(x), 9)


def _sim(schedule, costs) -> dict:
    sim = simulate(schedule, costs)
    return {
        "makespan": _round(sim.makespan),
        "bubble": _round(sim.bubble_rate),
        "peaks": [_round(x) for x in sim.peak_memory],
        "busy": [_round(x) for x in sim.busy],
        "span": [_round(x) for x in sim.span],
    }


def _attempt(fn, *args, **kwargs):
    """fn's value, or the error it raises (its type and words are behaviour too)."""
    try:
        return fn(*args, **kwargs)
    except (ValueError, TypeError) as e:
        return f"{type(e).__name__}: {e}"


def named() -> dict:
    out = {}
    for name in SCHEDULES:
        if name in ("zb-auto", "zb-opt"):
            continue
        for p, m in GRID:
            s = _attempt(build_schedule, name, pp=p, microbatches=m)
            key = f"{name} p={p} m={m}"
            if isinstance(s, str):
                out[key] = s
                continue
            validate(s)
            entry = {"program": s.to_csv(), "plan0": str(derive_plan(s, 0))}
            for label, c in COSTS.items():
                entry[label] = _sim(s, c)
                t = throughput(s, c)
                entry[label]["throughput"] = [_round(t.synced), _round(t.unsynced)]
                entry[label]["bound_for"] = _round(bound_for(s, c) or -1)
            v = s.stages_per_rank
            entry["formulas"] = {
                label: [str(bubble(name, p, m, v, c)), str(peak_memory(name, p, m, v, c))]
                for label, c in COSTS.items()
            }
            out[key] = entry
    return out


def searched() -> dict:
    out = {}
    for placement in ("linear", "v"):
        for p, m in [(2, 2), (2, 4), (3, 4), (3, 6), (4, 4), (4, 8)]:
            for label, c in COSTS.items():
                for limit in (None, p - 0.5, p + 1, 2 * p):
                    key = f"zb-auto {placement} p={p} m={m} {label} limit={limit}"
                    found = _attempt(explain_auto, pp=p, microbatches=m, costs=c,
                                     memory_limit=limit, placement=placement)  # fmt: skip
                    if isinstance(found, str):
                        out[key] = found
                        continue
                    bound = lower_bound(pp=p, microbatches=m, costs=c, memory_limit=limit,
                                        placement=placement)  # fmt: skip
                    out[key] = {
                        "program": found.schedule.to_csv(),
                        "explained": str(found),
                        "lower_bound": _round(bound),
                        "sim": _sim(found.schedule, c),
                    }
    return out


def optimum() -> dict:
    out = {}
    for placement in ("linear", "v"):
        for p, m in [(2, 2), (2, 3), (3, 3)]:
            sol = solve(pp=p, microbatches=m, costs=COSTS["i-heavy"], placement=placement)
            out[f"solve {placement} p={p} m={m}"] = {
                "value": _round(sol.value),
                "bound": _round(sol.lower_bound),
                "optimal": sol.optimal,
            }
    return out


def fingerprint() -> dict:
    return {"named": named(), "searched": searched(), "optimum": optimum()}


def digest(values: dict) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write every value as JSON here")
    args = parser.parse_args()
    values = fingerprint()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(values, f, indent=1, sort_keys=True)
    count = sum(len(v) for v in values.values())
    print(f"{count} settings, sha256 {digest(values)}")


if __name__ == "__main__":
    main()
