"""`profile(layers, sample)`: each layer's F, I and W in seconds and its memory in bytes.

The layers are run as a pipeline runs them: each fed the previous one's output (a tensor, a
tuple or a dict), its input received detached, its backward split by zbkit's own
`stage_backward_input` / `stage_backward_weight`. Per layer:

- times: the median of `repeats` runs of F, I and W after one untimed run, and their
  spread (fastest, slowest), the layers taking turns as in a pipeline (round by round); and
  W's where its gradients exist already (a step's later microbatches add into them);
- bytes, read from torch's own allocator (`allocator.watch`): what F leaves held until I (the
  saved activations and the output, which a runtime keeps for the backward), what I leaves
  held until W, and the weight gradients W makes;
- bytes counted from the tensors themselves: parameters, the optimizer's state for the
  optimizer named (built on copies and stepped once, so its state has its real dtype) and the
  output (what goes over the wire to the next stage).

The profile keeps the device, dtype, sample shape and optimizer, and saves and loads as JSON.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from os import PathLike
from typing import Any

import torch
from torch import nn
from torch.profiler import record_function

from zbkit.planner.allocator import settle, watch
from zbkit.splitgrad import stage_backward_full, stage_backward_input, stage_backward_weight

__all__ = ["OPTIMIZERS", "LayerProfile", "Profile", "Timing", "profile"]

# the optimizers named by a string; a callable `params -> torch.optim.Optimizer` also works
OPTIMIZERS: dict[str, Callable[[list[torch.Tensor]], torch.optim.Optimizer]] = {
    "adam": lambda params: torch.optim.Adam(params),
    "adamw": lambda params: torch.optim.AdamW(params),
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1),
    "sgd-momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
}


@dataclass(frozen=True)
class Timing:
    """Seconds of one action: the median of the runs, the fastest and the slowest."""

    median: float
    fastest: float
    slowest: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Timing:
        return cls(statistics.median(samples), min(samples), max(samples))


@dataclass(frozen=True)
class LayerProfile:
    """One layer of the model, measured on one microbatch (see the module docstring)."""

    name: str
    forward: Timing
    input_grad: Timing
    weight_grad: Timing
    activation_bytes: int  # held from F until I: saved tensors and the output
    weight_state_bytes: int  # held from I until W
    param_bytes: int
    grad_bytes: int  # what W leaves in `.grad`
    optimizer_bytes: int  # the optimizer's state for these parameters
    output_bytes: int  # what the next layer receives
    params: int  # number of parameter elements
    # held for a while inside F, I and W beyond what they leave held (the counts above):
    # an I's gradients in flight, a loss's softmax, a W's partial sums
    forward_extra_bytes: int
    input_grad_extra_bytes: int
    weight_grad_extra_bytes: int
    step: Timing  # the optimizer's step on these parameters
    step_bytes: int  # what the step allocates for a while above the state it keeps
    # parameters this layer shares with an earlier one (a tied head's weight is the
    # embedding's): (that layer, parameter bytes, optimizer bytes), counted once on a rank
    # that holds both
    shared: tuple[tuple[int, int, int], ...] = ()
    # a full backward's (B: I and W in one pass) bytes beyond the rule, its gradients new;
    # and W's and B's when the gradients exist already (a later microbatch's weight pass
    # adds a fresh gradient into `.grad`: for a while both are held)
    backward_extra_bytes: int = 0
    weight_grad_accumulate_extra_bytes: int = 0
    backward_accumulate_extra_bytes: int = 0
    # W's seconds where the gradients exist already (a step's later microbatches add into
    # `.grad`, reading and writing it: on a CPU a heavy layer's W takes longer); None: as
    # `weight_grad`
    weight_grad_accumulate: Timing | None = None


_TIMINGS = ("forward", "input_grad", "weight_grad", "step")


@dataclass(frozen=True)
class Profile:
    """Every layer's `LayerProfile`, and what they were measured on."""

    layers: tuple[LayerProfile, ...]
    device: str
    dtype: str
    sample: dict[str, Any] = field(default_factory=dict)  # the microbatch's shapes and dtypes
    optimizer: str = "adam"
    repeats: int = 5
    # bytes/s between data-parallel replicas, for `plan`'s all-reduce (profile_transformer's)
    bandwidth: float | None = None

    def __len__(self) -> int:
        return len(self.layers)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Profile:
        data = json.loads(text)
        layers = []
        for layer in data.pop("layers"):
            for k in _TIMINGS:
                layer[k] = Timing(**layer[k])
            if layer.get("weight_grad_accumulate") is not None:
                layer["weight_grad_accumulate"] = Timing(**layer["weight_grad_accumulate"])
            layer["shared"] = tuple(tuple(s) for s in layer.get("shared", ()))
            layers.append(LayerProfile(**layer))
        return cls(layers=tuple(layers), **data)

    def save(self, path: str | PathLike) -> None:
        with open(path, "w") as f:
            f.write(self.to_json())

    @classmethod
    def load(cls, path: str | PathLike) -> Profile:
        with open(path) as f:
            return cls.from_json(f.read())


def profile(
    layers: nn.Sequential | Sequence[nn.Module],
    sample: Any,
    *,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    optimizer: str | Callable[[list[torch.Tensor]], torch.optim.Optimizer] = "adam",
    repeats: int = 5,
) -> Profile:
    """Measure each of `layers` on one microbatch `sample` (module docstring).

    `sample` is the first layer's input (a tensor, a tuple of positional inputs or a dict of
    keyword inputs); with `loss_fn`, it is `(inputs, target)` and the last layer's output
    and the target go to `loss_fn(output, target)`. Without one, the last layer's output is
    backpropagated with ones (its sum)."""
    mods = _check_layers(layers)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"profile: repeats must be an int >= 1, got {repeats!r}")
    make_optimizer, optimizer_name = _optimizer(optimizer)
    device = _device(mods)
    inputs, target = _split_sample(sample, loss_fn)
    _check_device("the sample", inputs, device)
    feeds = _feeds(mods, inputs)
    dtype = _dtype(mods)
    losses: list[Callable[[Any], torch.Tensor] | None] = [None] * len(mods)
    if loss_fn is not None:
        losses[-1] = lambda out: loss_fn(out, target)
    settle(device)  # a fresh process's allocator as a long run's (`allocator.settle`)
    held = [_layer_bytes(mod, x, i > 0, losses[i], make_optimizer, repeats, device)
            for i, (mod, x) in enumerate(zip(mods, feeds, strict=True))]  # fmt: skip
    times = _timings(mods, feeds, losses, repeats, device)
    measured = []
    for i, (mod, found, spans) in enumerate(zip(mods, held, times, strict=True)):
        layer = LayerProfile(
            name=f"{i}: {type(mod).__name__}",
            forward=Timing.of([t[0] for t in spans]),
            input_grad=Timing.of([t[1] for t in spans]),
            weight_grad=Timing.of([t[2] for t in spans]),
            weight_grad_accumulate=Timing.of([t[3] for t in spans]),
            shared=_shared(mods, i, make_optimizer, device),
            **found,
        )
        measured.append(layer)
    return Profile(tuple(measured), str(device), str(dtype).removeprefix("torch."),
                   _describe(inputs), optimizer_name, repeats)  # fmt: skip


# ---- checks and plumbing ------------------------------------------------------------------


def _check_layers(layers: Any) -> list[nn.Module]:
    if isinstance(layers, nn.Module) and not isinstance(layers, nn.Sequential):
        raise TypeError(
            f"profile takes an nn.Sequential or a list of modules, got one {type(layers).__name__}"
            ": pass its parts in order, e.g. [model.embed, *model.blocks, model.head]"
        )
    mods = list(layers)
    if not mods:
        raise ValueError("profile: no layers given")
    for i, mod in enumerate(mods):
        if not isinstance(mod, nn.Module):
            raise TypeError(f"profile: layer {i} is a {type(mod).__name__}, not an nn.Module")
    return mods


def _optimizer(optimizer: Any) -> tuple[Callable, str]:
    if isinstance(optimizer, str):
        if optimizer not in OPTIMIZERS:
            raise ValueError(
                f"profile: unknown optimizer {optimizer!r}: name one of {', '.join(OPTIMIZERS)}"
                " or pass a callable params -> torch.optim.Optimizer"
            )
        return OPTIMIZERS[optimizer], optimizer
    if callable(optimizer):
        return optimizer, getattr(optimizer, "__name__", type(optimizer).__name__)
    raise TypeError(f"profile: optimizer must be a name or a callable, got {optimizer!r}")


def _device(mods: list[nn.Module]) -> torch.device:
    where: dict[torch.device, int] = {}
    for i, mod in enumerate(mods):
        for t in [*mod.parameters(), *mod.buffers()]:
            where.setdefault(t.device, i)
    if len(where) > 1:
        listed = ", ".join(f"{d} (layer {i} first)" for d, i in where.items())
        raise ValueError(f"profile: the layers are on several devices: {listed}; move them to one")
    return next(iter(where), torch.device("cpu"))


def _dtype(mods: list[nn.Module]) -> torch.dtype:
    found = [p.dtype for m in mods for p in m.parameters() if p.is_floating_point()]
    return max(set(found), key=found.count) if found else torch.get_default_dtype()


def _split_sample(sample: Any, loss_fn: Any) -> tuple[Any, Any]:
    if loss_fn is None:
        return sample, None
    if not callable(loss_fn):
        raise TypeError(f"profile: loss_fn must be callable, got {loss_fn!r}")
    if not isinstance(sample, tuple | list) or len(sample) != 2:
        raise ValueError("profile: with a loss_fn, sample is (inputs, target)")
    return sample[0], sample[1]


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, tuple | list):
        return [t for v in value for t in _tensors(v)]
    return []


def map_tensors(fn: Callable[[torch.Tensor], Any], value: Any) -> Any:
    """`value` (a tensor, or a dict, tuple or list of them, nested) with `fn` applied to
    each tensor; anything else kept as it is."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, Mapping):
        return {k: map_tensors(fn, v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return type(value)(map_tensors(fn, v) for v in value)
    return value


def _check_device(what: str, value: Any, device: torch.device) -> None:
    for t in _tensors(value):
        if t.device != device:
            raise ValueError(f"profile: {what} is on {t.device}, the layers on {device}")


def feed(mod: nn.Module, x: Any) -> Any:
    """`mod` fed `x`: a tensor as is, a tuple as positional inputs, a dict as keyword ones."""
    if isinstance(x, Mapping):
        return mod(**x)
    if isinstance(x, tuple):
        return mod(*x)
    return mod(x)


def _describe(value: Any) -> Any:
    """The shapes and dtypes of a value's tensors, as JSON takes them."""
    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, Mapping):
        return {str(k): _describe(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_describe(v) for v in value]
    return repr(value)


def _feeds(mods: list[nn.Module], inputs: Any) -> list[Any]:
    """Each layer's input: the previous layer's output on `inputs`, without autograd."""
    feeds, x = [], inputs
    with torch.no_grad():
        for i, mod in enumerate(mods):
            feeds.append(x)
            try:
                x = feed(mod, x)
            except Exception as err:  # the pair that does not fit, and what was passed
                came = "the sample" if i == 0 else f"layer {i - 1}'s output"
                raise ValueError(
                    f"profile: layer {i} ({type(mod).__name__}) cannot take {came} "
                    f"({_describe(x)}): {type(err).__name__}: {err}"
                ) from err
    return feeds


def _received(x: Any, grads: bool) -> Any:
    """`x` as a stage receives it: detached, its floating tensors asking for gradients
    (not the first layer's: its inputs are data)."""
    if isinstance(x, torch.Tensor):
        out = x.detach().clone()
        return out.requires_grad_() if grads and out.is_floating_point() else out
    if isinstance(x, Mapping):
        return {k: _received(v, grads) for k, v in x.items()}
    if isinstance(x, tuple | list):
        return type(x)(_received(v, grads) for v in x)
    return x


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- one layer ----------------------------------------------------------------------------


def _timings(mods, feeds, losses, repeats: int, device) -> list[list[tuple[float, ...]]]:
    """Each layer's F, I and W seconds, and W's again with its gradients there to add into
    (a second step right after): `repeats` rounds over all the layers in turn, after one
    untimed round (the split backward's analysis is made on the first). Round by round, as
    a pipeline runs the other layers between two runs of one: a layer timed on its own
    again and again finds its weights still in the cache, and the run does not."""
    params = [[p for p in mod.parameters() if p.requires_grad] for mod in mods]
    times: list[list[tuple[float, ...]]] = [[] for _ in mods]
    with _grads_put_back([p for ps in params for p in ps]):
        for round_ in range(-1, repeats):  # one untimed round first
            for i, (mod, given) in enumerate(zip(mods, feeds, strict=True)):
                for p in params[i]:
                    p.grad = None
                spans = _timed_step(mod, _received(given, i > 0), params[i], losses[i], device,
                                    keep=True)  # fmt: skip
                again = _timed_step(mod, _received(given, i > 0), params[i], losses[i], device)
                if round_ >= 0:
                    times[i].append((*spans, again[2]))
    return times


@contextmanager
def _grads_put_back(params: list[torch.Tensor]) -> Iterator[None]:
    """Inside, `params` start with no gradient; after, each has the one it had before:
    profiling leaves no gradients."""
    held = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        yield
    finally:
        for p, g in zip(params, held, strict=True):
            p.grad = g


def _layer_bytes(mod, given, grads, loss, make_optimizer, repeats, device) -> dict[str, Any]:
    """One layer's bytes and its optimizer's step (`LayerProfile`'s fields but the times)."""
    params = [p for p in mod.parameters() if p.requires_grad]
    with _grads_put_back(params):
        watched = _watched_step(mod, _received(given, grads), params, loss, device)
        later = _accumulating(mod, lambda: _received(given, grads), params, loss, device)
    with torch.no_grad():
        out = feed(mod, _received(given, False))
    state, step, step_bytes = _optimizer_step(params, make_optimizer, repeats, device)
    return {
        "activation_bytes": watched[0],
        "weight_state_bytes": watched[1],
        "forward_extra_bytes": watched[3],
        "input_grad_extra_bytes": watched[4],
        "weight_grad_extra_bytes": watched[5],
        "param_bytes": tensor_bytes(params),
        "grad_bytes": watched[2],
        "optimizer_bytes": state,
        "step": step,
        "step_bytes": step_bytes,
        "output_bytes": tensor_bytes(_tensors(out)),
        "params": sum(p.numel() for p in params),
        "backward_extra_bytes": later[0],
        "weight_grad_accumulate_extra_bytes": later[1],
        "backward_accumulate_extra_bytes": later[2],
    }


def _backward_roots(out: Any, loss) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """Where I starts: the loss (computed in F, as the last stage of a runtime does: what it
    saves is held until I), or each output that has a graph, with ones as its gradient."""
    if loss is not None:
        value = loss(out)
        if not isinstance(value, torch.Tensor) or value.grad_fn is None:
            raise ValueError(
                "profile: loss_fn returned no graph (a tensor computed from the last layer's "
                f"output, with a grad_fn), got {_describe(value)}"
            )
        return [value], None
    roots = [t for t in _tensors(out) if t.grad_fn is not None]
    return roots, [torch.ones_like(t) for t in roots]


def _step(mod, x, params, loss, mark: Callable[[str], Any], full: bool = False) -> None:
    """F, I then W of one microbatch (`full`: F then B), each inside `mark(name)`;
    nothing kept after the backward."""
    inputs = [t for t in _tensors(x) if t.requires_grad]
    with mark("zbkit.F"):
        out = feed(mod, x)
        if loss is not None or full:
            roots, seeds = _backward_roots(out, loss)
    if full:
        with mark("zbkit.B"):
            stage_backward_full(roots, seeds, inputs)
            del out, roots, seeds
        return
    with mark("zbkit.I"):
        if loss is None:  # the gradient the next stage would send
            roots, seeds = _backward_roots(out, loss)
        result = stage_backward_input(roots, seeds, inputs, params)
        pending = result.pending_weight
        del out, roots, seeds, result  # sent upstream and let go, as a runtime does
        for t in inputs:
            t.grad = None
    with mark("zbkit.W"):
        stage_backward_weight(params, pending)
        del pending


def _timed_step(mod, x, params, loss, device, keep: bool = False) -> tuple[float, float, float]:
    spans: dict[str, float] = {}

    class Clock:
        def __init__(self, name: str) -> None:
            self.name = name

        def __enter__(self) -> None:
            _sync(device)
            self.start = time.perf_counter()

        def __exit__(self, *exc) -> None:
            _sync(device)
            spans[self.name] = time.perf_counter() - self.start

    _step(mod, x, params, loss, Clock)
    if not keep:  # kept: the next step's W adds into them
        for p in params:
            p.grad = None
    return spans["zbkit.F"], spans["zbkit.I"], spans["zbkit.W"]


def _watched_step(mod, x, params, loss, device) -> tuple[int, ...]:
    """Bytes held after F, after I and after W, by the allocator, and how far each action
    went beyond what the planner's memory rule holds while it runs (F: what F leaves;
    I: what F left, turned into what I leaves at its end; W: what I left and the
    gradients W makes)."""
    watched = watch(lambda: _step(mod, x, params, loss, record_function), device)
    f, i, w = (watched.after(f"zbkit.{k}") for k in "FIW")
    ruled = {"F": f, "I": f, "W": i + w}
    extra = [max(0, watched.peak_within(f"zbkit.{k}") - ruled[k]) for k in "FIW"]
    for p in params:
        p.grad = None
    return (f, i, w, *extra)


def _accumulating(mod, given: Callable[[], Any], params, loss, device) -> tuple[int, int, int]:
    """How far B (its gradients new), then W and B adding into existing gradients, go
    beyond what the memory rule holds while they run (what was held at their start, and a
    new B's gradients)."""
    fresh = watch(lambda: _step(mod, given(), params, loss, record_function, True), device)
    grads = tensor_bytes(p.grad for p in params if p.grad is not None)
    b = _beyond(fresh, "zbkit.B", grads)
    split = watch(lambda: _step(mod, given(), params, loss, record_function), device)
    full = watch(lambda: _step(mod, given(), params, loss, record_function, True), device)
    for p in params:
        p.grad = None
    return b, _beyond(split, "zbkit.W", 0), _beyond(full, "zbkit.B", 0)


def _beyond(watched, mark: str, new: int) -> int:
    """The most `mark` held above what was held at its start and `new` bytes it keeps."""
    start = watched.live_at(watched.marks[mark][0])
    return max(0, watched.peak_within(mark) - start - new)


def _shared(mods: list[nn.Module], j: int, make_optimizer: Callable, device) -> tuple:
    """What layer `j` shares with earlier layers: per earlier layer (the first holding it),
    the shared parameters' bytes and their optimizer state's."""
    seen: dict[int, int] = {}  # id of a parameter -> the first layer holding it
    for i, mod in enumerate(mods[:j]):
        for p in mod.parameters():
            seen.setdefault(id(p), i)
    by_layer: dict[int, list[torch.Tensor]] = {}
    for p in mods[j].parameters():
        if p.requires_grad and id(p) in seen:
            by_layer.setdefault(seen[id(p)], []).append(p)
    return tuple(
        (i, tensor_bytes(ps),
         _optimizer_step(ps, make_optimizer, 1, device)[0])
        for i, ps in sorted(by_layer.items())
    )  # fmt: skip


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """The bytes of `tensors`' own elements."""
    return sum(t.numel() * t.element_size() for t in tensors)


def state_bytes(opt: torch.optim.Optimizer) -> int:
    """The bytes of the tensors `opt` keeps per parameter (moments, step counters)."""
    return tensor_bytes(
        v for kept in opt.state.values() for v in kept.values() if isinstance(v, torch.Tensor)
    )


def _optimizer_step(
    params: list[torch.Tensor], make_optimizer: Callable, repeats: int, device: torch.device
) -> tuple[int, Timing, int]:
    """The state `make_optimizer` keeps for `params`, the time of its step and what a step
    allocates for a while above that state, on copies of `params` (the model is left as it
    was): the first step makes the state, the later ones are timed and watched."""
    if not params:
        return 0, Timing(0.0, 0.0, 0.0), 0
    copies = [p.detach().clone().requires_grad_() for p in params]
    for c in copies:
        c.grad = torch.zeros_like(c)
    opt = make_optimizer(copies)
    opt.step()  # the state appears here
    state = state_bytes(opt)
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        opt.step()
        _sync(device)
        times.append(time.perf_counter() - start)
    return state, Timing.of(times), watch(opt.step, device).peak()
