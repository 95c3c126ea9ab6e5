"""`predict(profile, schedule, pp=, microbatches=)`: every rank's step time and peak bytes.

Each stage is a contiguous run of the profile's layers (`stages`, or balanced by time). Its
`Costs` are in seconds and bytes: F, I and W the sums of its layers' medians (plus the
runtime's own `overhead` per action and the wire's `hop` per transfer, both measured by the
caller), `mem_activation` what one microbatch's F leaves held until its I (its layers'
activations, its output among them), `mem_weight` what I leaves held until W. The
simulator runs the schedule on them; every rank's peak is then read from the same memory
rule, split into what is held: parameters, gradients (from a stage's first weight pass on),
optimizer state, activations, W state, and what the runtime keeps for the wire:

- receive buffers, one per microbatch and transfer from another rank, made at the first
  step and received into again at every later one (static, like the parameters);
- on the CPU, what a stage sent (its outputs, its input gradients) from the backward that
  let go of it until the step's end: gloo says a send is done only when it is waited, and
  the runtime waits for its sends when the step ends. On CUDA a finished send is let go at
  the next one and counts nothing here.

The optimizer's step follows the last action of each rank and may peak higher: its own
transient bytes above the state.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import accumulate

from zbkit.planner.profile import Profile
from zbkit.planner.wire import Wire
from zbkit.schedules import KINDS, Costs, Schedule, Simulation, build_schedule, simulate
from zbkit.schedules.catalog import record

__all__ = ["Prediction", "RankPrediction", "balanced", "plot_peaks", "predict"]

_PARTS = ("activations", "weight_state", "sent", "gradients")


@dataclass(frozen=True)
class RankPrediction:
    """One rank's step: its peak bytes, what is held at that peak, and its seconds."""

    peak_bytes: int
    parameters: int
    gradients: int  # at the peak: the stages whose first weight pass has run
    optimizer: int
    activations: int  # saved for the backward (F until I)
    weight_state: int  # kept for the weight pass (I until W)
    received: int  # receive buffers: one per microbatch and transfer from another rank
    sent: int  # what sends still hold (the CPU's gloo: until the step's end)
    transient: int  # held for a while inside the action running at the peak, beyond the above
    seconds: float  # from the step's start to the end of this rank's optimizer step
    at_step: bool  # the peak is the optimizer's step, not the compute

    @property
    def breakdown(self) -> dict[str, int]:
        return {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "weight_state": self.weight_state,
            "received": self.received,
            "sent": self.sent,
            "transient": self.transient,
        }


@dataclass(frozen=True)
class Prediction:
    """What `predict` says of one plan: per rank, and the step as a whole."""

    schedule: Schedule
    stages: list[range]  # the layers of each stage
    costs: list[Costs]  # per stage, in seconds and bytes
    simulation: Simulation
    ranks: list[RankPrediction]
    step_seconds: float
    profile: Profile = field(repr=False)

    def __str__(self) -> str:
        lines = [
            f"{self.schedule.name}, pp={self.schedule.pp}, m={self.schedule.microbatches}: "
            f"step {self.step_seconds * 1e3:.3g} ms",
            f"{'rank':>4} {'peak':>10} {'params':>10} {'grads':>10} {'optim':>10} "
            f"{'activ':>10} {'W state':>10} {'recv':>10} {'sent':>10} {'transient':>10}",
        ]
        for r, p in enumerate(self.ranks):
            cells = [p.peak_bytes, *p.breakdown.values()]
            lines.append(f"{r:>4} " + " ".join(f"{_mb(c):>10}" for c in cells))
        lines.append(
            "(MiB; the parts are what the compute holds at its peak: a peak at the optimizer's "
            "step is above them; stages: " + ", ".join(_span(s) for s in self.stages) + ")"
        )
        return "\n".join(lines)

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        printer.text(str(self))

    def plot(self):
        """Each rank's peak, stacked by what is held at it: a matplotlib Figure."""
        return plot_peaks([self])


# the parts drawn, bottom up: the model's state, then what the schedule holds
_DRAWN = {"parameters, gradients, optimizer": ("parameters", "gradients", "optimizer"),
          "activations": ("activations",), "W state": ("weight_state",),
          "buffers and transient": ("received", "sent", "transient")}  # fmt: skip
_COLOURS = ("#9a9a9a", "#3b6ea8", "#d08a2c", "#c9c9c9")


def plot_peaks(predictions: Sequence[Prediction], unit: str = "GB"):
    """Per prediction, each rank's peak bytes stacked by what is held at it (the model's
    state, activations, W state, the rest): one panel each, side by side, on one scale."""
    # lazily: matplotlib is the notebook extra; the numbers above need none of it
    import matplotlib.pyplot as plt

    if not predictions or not all(isinstance(p, Prediction) for p in predictions):
        raise ValueError("plot_peaks takes a list of planner.predict(...) results")
    scale = {"GB": 1e9, "GiB": 2**30, "MB": 1e6, "MiB": 2**20}.get(unit)
    if scale is None:
        raise ValueError(f"plot_peaks: unit is GB, GiB, MB or MiB, got {unit!r}")
    # at most 9.6 in (960 px at 100 dpi): JupyterLab's column shows it at its own size
    width = min(2.3 * len(predictions) + 1.6, 9.6)
    fig, axes = plt.subplots(1, len(predictions), figsize=(width, 3), sharey=True, squeeze=False)
    for ax, pred in zip(axes[0], predictions, strict=True):
        ranks = range(len(pred.ranks))
        bottom = [0.0] * len(pred.ranks)
        for (label, keys), colour in zip(_DRAWN.items(), _COLOURS, strict=True):
            part = [sum(r.breakdown[k] for k in keys) / scale for r in pred.ranks]
            ax.bar(ranks, part, bottom=bottom, color=colour, label=label)
            bottom = [b + v for b, v in zip(bottom, part, strict=True)]
        peaks = [r.peak_bytes / scale for r in pred.ranks]
        ax.scatter(ranks, peaks, marker="_", s=200, color="black", label="peak", zorder=3)
        ax.set_title(f"{pred.schedule.name} (m={pred.schedule.microbatches})", fontsize=10)
        ax.set_xticks(list(ranks))
        ax.set_xlabel("rank")
    axes[0, 0].set_ylabel(unit)
    axes[0, -1].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    plt.close(fig)
    return fig


def _mb(value: int) -> str:
    return f"{value / 2**20:.3f}"


def _span(layers: range) -> str:
    return f"{layers.start}-{layers.stop - 1}" if len(layers) > 1 else str(layers.start)


def predict(
    profile: Profile,
    schedule: str | Schedule,
    *,
    pp: int,
    microbatches: int,
    stages: Sequence[Sequence[int] | range] | None = None,
    hop: float = 0.0,
    overhead: float = 0.0,
    wire: Wire | None = None,
    timing: str = "median",
    **options,
) -> Prediction:
    """Predict `schedule` (a name of `zbkit.schedules.SCHEDULES`, with its `options`, or a
    built `Schedule`) on `pp` ranks with `microbatches`, from `profile` (module docstring).

    `stages`: the layers of each stage, in order, covering every layer once (`None`: balanced
    by F + I + W, `balanced`). `hop`: seconds a transfer between ranks adds to a wait;
    `overhead`: the runtime's own seconds per action (both measured, e.g. from a run's
    trace with `zbkit.schedules.measure`). `wire`: both as `planner.wire()` measured them,
    a stage's hop then by the bytes it receives or sends, and the compute slowed by its
    `crowding` where ranks compute at once (`_crowded`: ranks sharing a host's cores).
    `timing`: which of the profile's seconds to use, "median" or "fastest" (on a noisy host
    the fastest of each, against a run's fastest step, compares what the work costs)."""
    if not isinstance(profile, Profile):
        raise TypeError(f"predict takes a planner.Profile, got {type(profile).__name__}")
    for what, value in (("hop", hop), ("overhead", overhead)):
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            raise ValueError(f"predict: {what} must be seconds >= 0, got {value!r}")
    if timing not in ("median", "fastest"):
        raise ValueError(f"predict: timing is 'median' or 'fastest', got {timing!r}")
    count = _stage_count(schedule, pp, options)
    parts = stage_ranges(len(profile), stages, count, "predict") if stages is not None else None
    parts = parts or balanced(profile, count)
    if wire is not None and (hop or overhead):
        raise ValueError("predict: give hop and overhead, or a measured wire, not both")
    costs = [_stage_costs(profile, layers, hop, overhead, wire, timing, microbatches)
             for layers in parts]  # fmt: skip
    built = _built(schedule, pp, microbatches, costs, options)
    crowding = wire.crowding if wire is not None else 1.0
    costs, sim = _crowded(built, costs, crowding)
    ranks = _ranks(profile, built, parts, costs, sim, crowding, timing)
    return Prediction(built, parts, costs, sim, ranks, max(r.seconds for r in ranks), profile)


# ---- stages -------------------------------------------------------------------------------


def _stage_count(schedule: str | Schedule, pp: int, options: dict) -> int:
    if isinstance(schedule, Schedule):
        if options:
            raise ValueError(f"predict: options {sorted(options)} go with a name, not a Schedule")
        return schedule.num_stages
    if not isinstance(schedule, str):
        raise TypeError(f"predict: schedule is a name or a Schedule, got {schedule!r}")
    if not isinstance(pp, int) or isinstance(pp, bool) or pp < 1:
        raise ValueError(f"predict: pp must be an int >= 1, got {pp!r}")
    return len(record(schedule).stage_to_rank(pp, **options))


def stage_ranges(n: int, stages, count: int, who: str) -> list[range]:
    """`stages` (each a run of layer indices) as ranges, checked: each contiguous, together
    the `n` layers once each in order, `count` of them. `who` starts each error."""
    parts = []
    for i, layers in enumerate(stages):
        found = list(layers)
        if not found or found != list(range(found[0], found[0] + len(found))):
            raise ValueError(f"{who}: stage {i}'s layers {found} are not a contiguous run")
        parts.append(range(found[0], found[-1] + 1))
    flat = [i for part in parts for i in part]
    if flat != list(range(n)):
        raise ValueError(
            f"{who}: stages {[_span(p) for p in parts]} do not cover the {n} layers "
            f"0-{n - 1} once each, in order"
        )
    if len(parts) != count:
        raise ValueError(f"{who}: {len(parts)} stages given, the schedule has {count}")
    return parts


def balanced(profile: Profile, stages: int) -> list[range]:
    """Contiguous layers per stage, the slowest stage's F + I + W as short as can be (a
    dynamic program over the cut points; ties keep earlier cuts)."""
    n = len(profile)
    if not isinstance(stages, int) or stages < 1:
        raise ValueError(f"balanced: stages must be an int >= 1, got {stages!r}")
    if stages > n:
        raise ValueError(
            f"predict: {stages} stages but {n} layers: each stage needs a layer at least; "
            "use fewer ranks or stages, or cut the model into more layers"
        )
    work = [0.0, *accumulate(_work(layer) for layer in profile.layers)]
    inf = float("inf")
    # best[k][j]: the least slowest stage putting layers 0..j-1 on k stages
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for j in range(k, n - (stages - k) + 1):
            for i in range(k - 1, j):
                slowest = max(best[k - 1][i], work[j] - work[i])
                if slowest < best[k][j]:
                    best[k][j], cut[k][j] = slowest, i
    parts, j = [], n
    for k in range(stages, 0, -1):
        parts.append(range(cut[k][j], j))
        j = cut[k][j]
    return parts[::-1]


def _work(layer) -> float:
    return layer.forward.median + layer.input_grad.median + layer.weight_grad.median


def _stage_costs(
    profile: Profile, layers: range, hop: float, overhead: float, wire: Wire | None,
    timing: str, m: int = 1,
) -> Costs:  # fmt: skip
    """One stage's `Costs`. Stage 0 has no input gradient, so the runtime runs its whole
    backward at W: its I is the runtime's own cost alone, its W both halves, and what F
    saved is held until W. A step's first W makes the gradients and its other m - 1 add
    into them: W is their mean (the simulator gives a stage one W)."""
    mine = [profile.layers[i] for i in layers]
    received = profile.layers[layers.start - 1].output_bytes if layers.start > 0 else 0
    if wire is not None:  # what it waits for: activations in, or its outputs' gradients
        hop, overhead = wire.hop(max(received, mine[-1].output_bytes)), wire.overhead
    f, i, first = (sum(getattr(getattr(x, k), timing) for x in mine) for k in _COMPUTE)
    adding = sum(getattr(x.weight_grad_accumulate or x.weight_grad, timing) for x in mine)
    w = (first + (m - 1) * adding) / m
    activations = float(sum(x.activation_bytes for x in mine))
    weight_state = float(sum(x.weight_state_bytes for x in mine))
    if layers.start == 0:
        i, w, weight_state = 0.0, i + w, activations
    return Costs(F=f + overhead, I=i + overhead, W=w + overhead, comm=hop,
                 mem_activation=activations, mem_weight=weight_state)  # fmt: skip


_COMPUTE = ("forward", "input_grad", "weight_grad")


def _crowded(built: Schedule, costs: list[Costs], crowding: float, rounds: int = 3):
    """The stages' costs as ranks sharing a host run them, and their simulation.

    `crowding` is the slowdown with every rank computing at once (`Wire.crowding`); with k
    of the p ranks computing, an action runs `max(1, crowding * k / p)` times slower (the
    cores shared out). Each round simulates, reads how many ranks compute during each
    action on average, and slows each stage's F, I and W by its actions' mean."""
    sim = simulate(built, costs)
    if crowding <= 1.0:
        return costs, sim
    scaled = costs
    for _ in range(rounds):
        slow = _slowdowns(sim, crowding, built.pp)
        scaled = []
        for s, c in enumerate(costs):
            f, i, w = (slow.get((s, k), slow.get((s, "B"), 1.0)) for k in "FIW")
            scaled.append(replace(c, F=c.F * f, I=c.I * i, W=c.W * w))
        sim = simulate(built, scaled)
    return scaled, sim


def _slowdowns(sim: Simulation, crowding: float, pp: int) -> dict[tuple[int, str], float]:
    """Per (stage, kind): the mean over its actions of `max(1, crowding * k / pp)`, k the
    ranks computing during the action (time-averaged, itself included)."""
    edges = sorted({t for e in sim.events for t in (e.start, e.end)})
    busy = [0] * len(edges)  # ranks computing from edges[i] to edges[i + 1]
    for e in sim.events:
        for i in range(bisect_left(edges, e.start), bisect_left(edges, e.end)):
            busy[i] += 1
    found: dict[tuple[int, str], list[float]] = {}
    for e in sim.events:
        if e.end <= e.start:
            continue
        lo, hi = bisect_left(edges, e.start), bisect_left(edges, e.end)
        k = sum(busy[i] * (edges[i + 1] - edges[i]) for i in range(lo, hi)) / (e.end - e.start)
        found.setdefault((e.stage, e.kind), []).append(max(1.0, crowding * k / pp))
    return {key: sum(v) / len(v) for key, v in found.items()}


def _built(schedule, pp: int, m: int, costs: list[Costs], options: dict) -> Schedule:
    if isinstance(schedule, Schedule):
        if (schedule.pp, schedule.microbatches) != (pp, m):
            raise ValueError(
                f"predict: the schedule is for pp={schedule.pp}, m={schedule.microbatches}, "
                f"not pp={pp}, microbatches={m}"
            )
        return schedule
    # a search (zb-auto, zb-opt) is built for these costs, in seconds and bytes; a named
    # schedule is its own program (zb-v the paper's, as `measure` builds it by name)
    if record(schedule).searches == "always":
        return build_schedule(schedule, pp=pp, microbatches=m, costs=costs, **options)
    return build_schedule(schedule, pp=pp, microbatches=m, **options)


# ---- per rank -----------------------------------------------------------------------------


def _ranks(
    profile: Profile,
    schedule: Schedule,
    parts: list[range],
    costs: list[Costs],
    sim: Simulation,
    crowding: float,
    timing: str,
):
    where = schedule.stage_to_rank
    layers = profile.layers
    per_stage: dict[str, list[int]] = {
        "parameters": [sum(layers[i].param_bytes for i in p) for p in parts],
        "gradients": [sum(layers[i].grad_bytes for i in p) for p in parts],
        "optimizer": [sum(layers[i].optimizer_bytes for i in p) for p in parts],
        # the step's transient bytes are the largest layer's, not their sum (measured: Adam
        # over an embedding and a block allocates what it does over the embedding alone)
        "step_bytes": [max(layers[i].step_bytes for i in p) for p in parts],
        # as the simulator holds them (`_stage_costs`: stage 0's F bytes held until W)
        "activations": [int(c.mem_activation) for c in costs],
        "weight_state": [int(c.mem_weight) for c in costs],
        **_wire_bytes(profile, schedule, parts),
    }
    extra = _extras(profile, parts)
    # stage 0 has no input gradient: the runtime runs its whole backward at W, which goes
    # as far as a full backward
    extra |= {"I": [0, *extra["I"][1:]], "W": [extra["B"][0], *extra["W"][1:]],
              "W+": [extra["B+"][0], *extra["W+"][1:]]}  # fmt: skip
    step_seconds = [crowding * sum(getattr(layers[i].step, timing) for i in p) for p in parts]
    _count_shared_once(profile, parts, where, per_stage)
    held = _held_at_peak(sim, per_stage, extra, schedule.pp)
    out = []
    for r in range(schedule.pp):
        mine = [s for s, rank in enumerate(where) if rank == r]

        def total(key: str, stages: list[int] = mine) -> int:
            return sum(per_stage[key][s] for s in stages)

        static = total("parameters") + total("optimizer") + total("received")
        compute = static + sum(held[r][k] for k in (*_PARTS, "transient"))
        step = static + total("gradients") + max(per_stage["step_bytes"][s] for s in mine)
        ends = [end for (_, end) in sim.times.get(r, [])]
        seconds = (max(ends) if ends else 0.0) + sum(step_seconds[s] for s in mine)
        out.append(
            RankPrediction(
                max(compute, step), total("parameters"), held[r]["gradients"], total("optimizer"),
                held[r]["activations"], held[r]["weight_state"], total("received"),
                held[r]["sent"], held[r]["transient"], seconds, step > compute,
            )
        )  # fmt: skip
    return out


def _extras(profile: Profile, parts: list[range]) -> dict[str, list[int]]:
    """Per kind and stage, the most its actions hold beyond the rule while they run: a
    layer's own bytes beyond it (`LayerProfile.*_extra_bytes`; "W+" and "B+" once the
    gradients exist), less what the layers after it in the stage let go before its turn
    (a backward walks the stage from its last layer to its first). A stage's first W or B
    also makes the gradients as it goes: counted here, held by the rule from its end."""
    fields = {
        "F": "forward_extra_bytes",
        "I": "input_grad_extra_bytes",
        "W": "weight_grad_extra_bytes",
        "B": "backward_extra_bytes",
        "W+": "weight_grad_accumulate_extra_bytes",
        "B+": "backward_accumulate_extra_bytes",
    }
    out: dict[str, list[int]] = {}
    for kind, name in fields.items():
        per_stage = []
        for part in parts:
            mine = [profile.layers[i] for i in part]
            if kind == "F":  # a forward frees nothing on its way
                per_stage.append(max(getattr(x, name) for x in mine))
                continue
            # a stage's first weight pass makes its gradients on the way, layer by layer
            first = kind in ("W", "B")
            freed, most = 0, 0
            for x in reversed(mine):
                made = x.grad_bytes if first else 0
                most = max(most, getattr(x, name) + made - freed)
                freed += _let_go(x, kind) - made
            per_stage.append(most)
        out[kind] = per_stage
    return out


def _let_go(layer, kind: str) -> int:
    """What a layer's backward of `kind` lets go of by its end."""
    if kind.startswith("W"):
        return layer.weight_state_bytes
    if kind.startswith("B"):
        return layer.activation_bytes
    return max(0, layer.activation_bytes - layer.weight_state_bytes)


def _wire_bytes(profile: Profile, schedule: Schedule, parts: list[range]) -> dict[str, list[int]]:
    """Per stage, what the runtime keeps for the wire: its receive buffers (one per
    microbatch, for its inputs from a stage on another rank and for its outputs' gradients
    from one) and what one backward leaves sent (its outputs to, and its input gradients
    for, a stage on another rank; held on the CPU only, see the module docstring)."""
    where, m = schedule.stage_to_rank, schedule.microbatches
    last = len(parts) - 1
    held = profile.device.startswith("cpu")
    received, sent = [], []
    for s, part in enumerate(parts):
        inputs = profile.layers[part.start - 1].output_bytes if s > 0 else 0
        outputs = profile.layers[part.stop - 1].output_bytes if s < last else 0
        prev_remote = s > 0 and where[s - 1] != where[s]
        next_remote = s < last and where[s + 1] != where[s]
        both = inputs * prev_remote + outputs * next_remote
        received.append(m * both)
        sent.append(both if held else 0)
    return {"received": received, "sent": sent}


def _count_shared_once(profile: Profile, parts: list[range], where: list[int], per_stage) -> None:
    """A parameter two layers share (a tied head's weight) is one tensor on a rank holding
    both: its bytes, its gradient's and its optimizer state leave the later layer's stage."""
    stage_of = {i: s for s, part in enumerate(parts) for i in part}
    for j, layer in enumerate(profile.layers):
        for i, param_bytes, optimizer_bytes in layer.shared:
            s = stage_of[j]
            if where[stage_of[i]] == where[s]:
                per_stage["parameters"][s] -= param_bytes
                per_stage["gradients"][s] -= param_bytes
                per_stage["optimizer"][s] -= optimizer_bytes


def _held_at_peak(sim: Simulation, per_stage: dict, extra: dict, pp: int) -> list[dict[str, int]]:
    """Per rank, what is held of each part at the rank's compute peak: the memory rule
    replayed with each part's bytes (growth at an action's start and shrinking at its end,
    as `memory_steps` does, but an input pass's change all at its end), a stage's
    gradients from the end of its first weight pass, what a backward sent from its end
    to the step's, and while an action runs, its own bytes beyond the rule (`extra`, by
    kind and stage; "W+" and "B+" once its gradients exist)."""
    changes: list[list[tuple[float, int, dict[str, int], int]]] = [[] for _ in range(pp)]
    weighted: set[int] = set()
    for order, e in enumerate(sorted(sim.events, key=lambda e: (e.rank, e.start))):
        kind = KINDS[e.kind]
        delta = {
            "activations": kind.act * per_stage["activations"][e.stage],
            "weight_state": kind.weight * per_stage["weight_state"][e.stage],
            "gradients": 0,
        }
        later = kind.does_weight and e.stage in weighted
        if kind.does_weight and not later:
            weighted.add(e.stage)
            delta["gradients"] = per_stage["gradients"][e.stage]
        # a forward's new bytes are held from its start; an input pass turns what F saved
        # into what W needs, at its end; the first weight pass's gradients are held from its
        # end (made on the way: its extra)
        grow = {k: v for k, v in delta.items() if v > 0 and k != "gradients" and kind.act >= 0}
        after = {k: v for k, v in delta.items() if k not in grow and v}
        # what was sent stays once the action that lets its activations go has run (stage
        # 0 keeps them until W: `_ranks`)
        if (kind.weight < 0 or kind.act < 0) if e.stage == 0 else kind.act < 0:
            after["sent"] = per_stage["sent"][e.stage]
        running = extra[e.kind + "+" * later][e.stage]
        changes[e.rank].append((e.start, order, grow, running))  # its extra while it runs
        if after:
            changes[e.rank].append((e.end, order, after, 0))
    out = []
    for per_rank in changes:
        level = dict.fromkeys(_PARTS, 0)
        best, most = {**level, "transient": 0}, 0
        for _, _, delta, running in sorted(per_rank, key=lambda c: (c[0], c[1])):
            for k, v in delta.items():
                level[k] += v
            if sum(level.values()) + running > most:
                most = sum(level.values()) + running
                best = {**level, "transient": running}
        out.append(best)
    return out
