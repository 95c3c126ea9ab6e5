"""Checks that read the schedule's own facts: its microbatch count against what it needs and
the batch, and its stage-to-rank map against where the stages are.

What a schedule needs is asked of the schedule: a torch class is built for the sizes given
(its constructor refuses what it cannot run, and is asked again for the fewest it takes); a
torch multi-stage object's `pipeline_order` is walked by zbkit's validator, which names a
program that would hang. (torch's single-stage classes draw a `pipeline_order` they do not
run, so theirs is not walked.) A zbkit `Schedule` was validated when it was built.
"""

from __future__ import annotations

from typing import Any

import torch

from zbkit.doctor._setup import Setup
from zbkit.doctor.findings import Finding
from zbkit.schedules import ScheduleError, validate
from zbkit.schedules.core.placement import stage_to_rank


def check_refused(
    setup: Setup, refused: tuple[str, int] | None, asked: int | None
) -> list[Finding]:
    if refused is None:
        return []
    text, fewest = refused
    return [Finding(
        "too-few-microbatches", f"the schedule at microbatches={asked}",
        f"torch's constructor raises: {text}",
        f"use at least {fewest} microbatches (the fewest this schedule takes for pp="
        f"{setup.schedule.pp}), with a batch that is a multiple of it",
    )]  # fmt: skip


def check_program(setup: Setup) -> list[Finding]:
    if setup.runtime == "zbkit" or not setup.multi:
        return []  # zbkit's were validated when built; see the module docstring for torch's
    try:
        validate(setup.schedule)
    except ScheduleError as exc:
        m = setup.schedule.microbatches
        return [Finding(
            "too-few-microbatches" if m < setup.schedule.num_stages else "invalid-schedule",
            f"torch's pipeline_order at {m} microbatches",
            f"the program cannot finish (a rank would wait forever): {exc}",
            "use more microbatches (at least the number of stages), or a zbkit schedule "
            "(build_schedule) with torch's runtime via its CSV",
        )]  # fmt: skip
    return []


def check_placement(setup: Setup) -> list[Finding]:
    """Each rank whose stages were given holds exactly the stages the map puts there."""
    if setup.whole:
        return []  # every stage given: the runtime places them by the map
    held: dict[int, list[int]] = {}
    for s in setup.stages:
        if s.rank is not None:
            held.setdefault(s.rank, []).append(s.index)
    return [_off(setup, r, sorted(given)) for r, given in sorted(held.items())
            if sorted(given) != setup.schedule.stages_on(r)]  # fmt: skip


def _off(setup: Setup, rank: int, given: list[int]) -> Finding:
    p, want = setup.schedule.pp, setup.schedule.stages_on(rank)
    is_v = setup.schedule.stage_to_rank == stage_to_rank("v", p, 2)
    rule = f"the V puts stages r and {2 * p - 1}-r on rank r" if is_v else "the schedule's map"
    happens = (
        "zbkit's ScheduleRunner refuses it (ValueError)" if setup.runtime == "zbkit" else
        f"torch runs rank {rank}'s pipeline_order, which names stages {want}: the step "
        "fails on a stage it does not hold or hangs waiting for a peer"
    )  # fmt: skip
    return Finding(
        "stage-off-placement",
        f"rank {rank} holds stages {given}; {rule}: rank {rank} must hold stages {want}",
        happens, f"build stages {want} on rank {rank} (Schedule.from_torch(...).stages_on"
        "(rank) says which)", "fails", given[0] if given else None, rank,
    )  # fmt: skip


def rows_of(inputs: Any) -> int | None:
    """The batch's rows: the first dimension of its first tensor."""
    if isinstance(inputs, torch.Tensor):
        return int(inputs.shape[0]) if inputs.dim() else None
    values = inputs.values() if isinstance(inputs, dict) else inputs
    if isinstance(values, tuple | list) or isinstance(inputs, dict):
        for v in values:
            rows = rows_of(v)
            if rows is not None:
                return rows
    return None


def check_batch(setup: Setup, rows: int | None) -> list[Finding]:
    m = setup.schedule.microbatches
    if rows is None or (rows >= m and rows % m == 0):
        return []
    zbkit = setup.runtime == "zbkit"
    if rows < m:
        happens = ("zbkit's step raises ValueError (the rows do not split into m microbatches)"
                   if zbkit else "torch's step raises AssertionError 'Tensor size "
                   f"{rows} is smaller than num_chunks'")  # fmt: skip
        return [Finding(
            "too-few-microbatches", f"a batch of {rows} rows for {m} microbatches", happens,
            f"a batch of at least {m} rows (a multiple of {m}), or fewer microbatches",
        )]  # fmt: skip
    sizes = [len(c) for c in torch.arange(rows).tensor_split(m)]
    happens = (
        "zbkit's step raises ValueError: the rows do not split into equal microbatches"
        if zbkit
        else f"torch runs microbatches of {sizes} rows; each loss is a "
        f"microbatch's mean, averaged over {m}, so rows of the smaller microbatches "
        "weigh more than in the batch's mean: the gradients differ from the batch's"
    )
    return [Finding(
        "batch-indivisible", f"a batch of {rows} rows for {m} microbatches", happens,
        f"a batch size that is a multiple of {m} (e.g. {rows - rows % m} or {rows + (-rows) % m})",
        "fails" if zbkit else "wrong",
    )]  # fmt: skip
