"""`zbkit demo`: split backward on one block, then real pipelines against their simulations.

Part 1 splits a transformer block's backward into I and W and checks both against autograd.
Part 2 cuts a small transformer into pipeline stages on `--ranks` processes:

1. each block's F, I and W measured once, in one process: the one cost set every schedule's
   simulation uses (its stages' blocks summed);
2. every schedule run on the real transformer: gradients against one plain process, step
   time, activations held (counts and bytes);
3. the timed comparison: speed-up over 1f1b measured and simulated with those same costs.
   Where ranks outnumber cores (or `--timing synthetic`), real ~1 ms stages would measure the
   wait for a core, not the schedule, so the timed runs use `SyntheticStage`s that sleep the
   measured times (scaled up: a hop becomes small next to a stage, as on GPUs).

It prints the tables and writes an HTML report with every run drawn over its simulation.

The parts, one concern each:

- this module: the command's options, each checked before anything runs, and ``main``;
- ``_split``: part 1, one block's backward split into I and W, checked against autograd;
- ``_runs``: what the ranks run (shipped by cloudpickle): the config every rank rebuilds the
  model and data from, the blocks' measurement, one schedule's timed steps, the oracle;
- ``_pipeline``: part 2's driver: starts the ranks, compares, prints, writes the report;
- ``_report``: the comparison's numbers from measured traces, and its text tables;
- ``_html``: the self-contained HTML report.
"""

from __future__ import annotations

import argparse
import sys

import torch

from zbkit._public import public_dir
from zbkit.demo._pipeline import pipeline_demo
from zbkit.demo._runs import Config, make_schedule
from zbkit.demo._split import split_backward_demo
from zbkit.launch.machine import usable_cores
from zbkit.schedules import SCHEDULES, Schedule

__all__ = ["add_arguments", "cores", "main", "use_synthetic"]

DEFAULT_SCHEDULES = "1f1b,zb-h1,zb-h2,zb-v"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", type=int, default=4, help="pipeline ranks (default 4)")
    parser.add_argument(
        "--schedules", default=DEFAULT_SCHEDULES, help=f"comma list (default {DEFAULT_SCHEDULES})"
    )
    parser.add_argument("--microbatches", type=int, default=8, help="per step (default 8)")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    parser.add_argument("--out", default="zbkit-report", help="report folder (zbkit-report)")
    parser.add_argument("--layers", type=int, default=None, help="blocks (default 2 x ranks)")
    parser.add_argument("--rounds", type=int, default=3, help="timed steps per schedule (3)")
    parser.add_argument("--split-only", action="store_true", help="only part 1 (no processes)")
    parser.add_argument("--dim", type=int, default=64, help="model width (default 64)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    parser.add_argument("--tokens", type=int, default=32, help="sequence length (default 32)")
    parser.add_argument("--batch", type=int, default=2, help="rows per microbatch (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tol", type=float, default=1e-5, help="largest allowed gradient difference (1e-5)"
    )
    parser.add_argument(
        "--timing",
        choices=["auto", "synthetic", "real"],
        default="auto",
        help="what the speed-ups are measured on: synthetic stages that sleep the measured "
        "times, the real transformer, or auto: synthetic when ranks outnumber cores",
    )
    parser.add_argument(
        "--stage-ms",
        type=float,
        default=100.0,
        help="synthetic timing: the measured times scaled so that the slowest of --ranks "
        "stages takes this F + I + W per microbatch (default 100)",
    )


def main(args: argparse.Namespace) -> int:
    """Part 1, then part 2 unless ``--split-only``: 0 when every check passes, 1 when one
    fails, 2 for a bad option."""
    try:  # every option checked before anything runs
        if args.dim % args.heads:
            raise ValueError(f"--dim {args.dim} must be divisible by --heads {args.heads}")
        cfg, schedules = (None, {}) if args.split_only else _check(args)
    except ValueError as exc:
        print(f"zbkit demo: {exc}", file=sys.stderr)
        return 2
    ok = split_backward_demo(args)
    if not ok or cfg is None:
        return 0 if ok else 1
    print()
    synthetic = use_synthetic(args.timing, args.ranks, args.backend)
    return pipeline_demo(args, cfg, schedules, synthetic=synthetic, cores=cores())


def _check(args: argparse.Namespace) -> tuple[Config, dict[str, Schedule]]:
    """Every option checked before a process starts; schedules built once here to fail fast."""
    if args.ranks < 2:
        raise ValueError(f"--ranks {args.ranks}: a pipeline needs at least 2 ranks")
    if args.microbatches < 1 or args.rounds < 1 or args.batch < 1:
        raise ValueError("--microbatches, --rounds and --batch must be >= 1")
    if not args.stage_ms > 0:
        raise ValueError(f"--stage-ms {args.stage_ms}: must be > 0")
    names = [n.strip() for n in args.schedules.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCHEDULES]
    if not names or unknown:
        raise ValueError(
            f"--schedules {args.schedules!r}: unknown {unknown}; pick from {SCHEDULES}"
        )
    if args.backend == "nccl" and torch.cuda.device_count() < args.ranks:
        raise ValueError(
            f"--backend nccl needs one GPU per rank: {args.ranks} ranks, "
            f"{torch.cuda.device_count()} GPUs here; use --backend gloo or fewer --ranks"
        )
    schedules = {n: make_schedule(n, args.ranks, args.microbatches) for n in names}
    layers = args.layers or 2 * args.ranks
    most = max(s.num_stages for s in schedules.values())
    if layers < most:
        raise ValueError(f"--layers {layers}: the schedules need {most} stages of >= 1 block each")
    rows = args.batch * args.microbatches
    cfg = Config(layers, args.dim, args.heads, args.tokens, rows, args.microbatches,
                 args.rounds, args.seed, args.backend)  # fmt: skip
    return cfg, schedules


# `cores` and `use_synthetic` live here, and `main` passes their answers to part 2, so that
# patching `zbkit.demo.cores` (as the tests do) reaches every use
def cores() -> int:
    """CPU cores this process may run on (`zbkit.launch.machine.usable_cores`)."""
    return usable_cores()


def use_synthetic(timing: str, ranks: int, backend: str) -> bool:
    """``--timing auto``: synthetic stages when gloo ranks outnumber the cores (each would
    then time its wait for a core, not the schedule)."""
    if timing != "auto":
        return timing == "synthetic"
    return backend == "gloo" and cores() < ranks


def __dir__() -> list[str]:  # dir() and tab completion: __all__ and the loaded submodules
    return public_dir(globals(), __all__)
