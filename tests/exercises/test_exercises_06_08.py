"""The exercises of notebooks 06, 07 and 08: each checker against an answer worked out here.

The oracles: real DDP on a world of one in this process, with a comm hook of our own that only
counts (06.1, 06.4); the windows' arithmetic (06.2, 06.3); the validator's own message (07.1);
the timeout report a real two-rank Cluster raises on the hang the exercise asks for (07.2); the
notebook's own buggy `FusedLinear` and `compare_with_autograd`, taken from its cells (07.3);
the 1F1B grid walked by hand (07.4); torch's program against zbkit's, action by action (08.1);
the simulator (08.2); torch's lowered SEND ops (08.3); torch's two split calls (08.4). (What
every exercise shares, its check cell and folded solution, is tested in test_exercises_all.py.)
"""

from __future__ import annotations

import ast
import contextlib
import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.pipelining.schedules as torch_schedules
from notebook_cells import cell_python, cell_source, read_cells
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from zbkit.exercises import check
from zbkit.launch import Cluster, LaunchError
from zbkit.schedules import (
    Action,
    Costs,
    Schedule,
    ScheduleError,
    build_schedule,
    simulate,
    validate,
)

NAMES = {"06": "06_ddp_and_accumulation", "07": "07_debugging", "08": "08_torch_pipelining"}
KEYS = [f"{nb}.{k}" for nb in NAMES for k in range(1, 5)]


def _judged(key: str, answer: Any) -> tuple[bool | None, str]:
    verdict = check(key, answer)
    return verdict.right, verdict.why


# ----------------------------------------------------------------- notebook 06


@contextlib.contextmanager
def _world_of_one() -> Iterator[None]:
    """A real gloo group of one rank in this process (its store in memory)."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def _ddp_buckets(micro_batches: int, k: int, **ddp_options: Any) -> list[list[int]]:
    """The bytes of each bucket real DDP all-reduced, per synchronising backward, training
    notebook 06's model with windows of k (no_sync inside a window, as the backend does)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    per_backward: list[list[int]] = [[]]

    def count(state, bucket):  # no annotations: DDP checks them against its own classes
        buffer = bucket.buffer()
        per_backward[-1].append(buffer.numel() * buffer.element_size())
        if bucket.is_last():
            per_backward.append([])
        done = torch.futures.Future()
        done.set_result(buffer)  # a world of one: the mean is the buffer itself
        return done

    with _world_of_one():
        ddp = DDP(model, **ddp_options)
        ddp.register_comm_hook(None, count)
        for b in range(micro_batches):
            syncs = b % k == k - 1 or b == micro_batches - 1
            with contextlib.nullcontext() if syncs else ddp.no_sync():
                ddp(torch.randn(4, 3)).pow(2).mean().backward()
    return per_backward[:-1]


def test_06_1_small_buckets_after_the_first_backward():
    buckets = _ddp_buckets(3, 1, bucket_cap_mb=0.0001)
    assert len(buckets[0]) == 1 and len(buckets[1]) == len(buckets[2]) > 1  # what the why says
    right, why = _judged("06.1", len(buckets[1]))
    assert right is True and f"{len(buckets[1])} per backward" in why and "first" in why
    right, why = _judged("06.1", 1)
    assert right is False and "first backward only" in why
    right, why = _judged("06.1", 4)  # one per parameter
    assert right is False and "not one per parameter" in why
    right, why = _judged("06.1", len(buckets[1]) + 5)
    assert right is False and "one all-reduce per bucket" in why


def test_06_2_the_windows_that_leave_rank_0_alone_in_an_all_reduce():
    hang = {k for k in range(1, 11) if math.ceil(10 / k) != math.ceil(9 / k)}
    right, why = _judged("06.2", hang)
    assert right is True and str(sorted(hang)) in why
    right, why = _judged("06.2", sorted(hang))  # a list is a reasonable form
    assert right is True
    right, why = _judged("06.2", {1})
    assert right is False and f"k={min(hang - {1})} hangs too" in why and "no partner" in why
    right, why = _judged("06.2", hang | {4})
    assert right is False and "k=4 does not hang" in why
    right, why = _judged("06.2", "1, 3")
    assert right is False and "set of ints" in why


def test_06_3_the_scheduler_steps_once_per_window():
    steps = len(range(0, 10, 4))  # one per window, the short last one included
    right, why = _judged("06.3", steps)
    assert right is True and why.startswith(f"{steps}:")
    right, why = _judged("06.3", 10)
    assert right is False and "sync_gradients" in why
    right, why = _judged("06.3", 2)
    assert right is False and "short last window" in why and "synchronises" in why
    right, why = _judged("06.3", steps + 3)
    assert right is False and "once per window" in why


def test_06_4_bytes_per_rank_do_not_depend_on_the_ranks():
    reduced = sum(map(sum, _ddp_buckets(10, 3)))
    right, why = _judged("06.4", reduced)
    assert right is True and str(reduced) in why and "No number in the table changes" in why
    right, why = _judged("06.4", 2 * reduced)
    assert right is False and "does not double" in why
    right, why = _judged("06.4", reduced // 2)
    assert right is False and "reduce-scatter" in why


# ----------------------------------------------------------------- notebook 07


def _zb_h1_rows() -> dict[int, list[str]]:
    zb = build_schedule("zb-h1", pp=3, microbatches=3)
    return {r: [str(a) for a in zb.actions(r)] for r in range(3)}


def _moved(rows: dict[int, list[str]], w: str) -> dict[int, list[str]]:
    """`rows` with action `w` moved to just before its I."""
    out = {r: list(row) for r, row in rows.items()}
    a = Action.parse(w)
    row = out[a.stage]  # zb-h1: stage s on rank s
    row.insert(row.index(str(Action(a.stage, "I", a.microbatch))), row.pop(row.index(w)))
    return out


def test_07_1_a_program_whose_one_fault_is_a_w_before_its_i():
    rows = _zb_h1_rows()
    validate(Schedule.from_program(rows))  # the start is valid
    for w in ("2W1", "0W0"):
        program = _moved(rows, w)
        with pytest.raises(ScheduleError) as caught:
            validate(Schedule.from_program(program))
        said = str(caught.value).splitlines()[0]
        assert w in said and "before" in said
        right, why = _judged("07.1", program)
        assert right is True and said in why
    right, _ = _judged("07.1", Schedule.from_program(_moved(rows, "1W2")))  # a Schedule too
    assert right is True
    right, why = _judged("07.1", rows)
    assert right is False and "validate accepts it" in why and "output gradient" in why
    right, why = _judged("07.1", _moved(_moved(rows, "0W0"), "2W1"))
    assert right is False and "2 Ws" in why
    early_i = {r: list(row) for r, row in rows.items()}
    early_i[1].insert(0, early_i[1].pop(early_i[1].index("1I0")))  # an I before its F
    right, why = _judged("07.1", early_i)
    assert right is False and "not for a W" in why
    right, why = _judged("07.1", {0: ["0F0", "0I0", "0W0"]})
    assert right is False and "3 ranks" in why


# the exercise's hang and the notebook's own: each rank stuck in the call its stack ends in
BARRIER_AGAINST_RECV = """
t = torch.zeros(3)
if rank == 0:
    dist.barrier()
else:
    dist.recv(t, src=0)
"""
BOTH_RECEIVE = """
t = torch.zeros(3)
dist.recv(t, src=1 - rank)
"""


def _raised(cluster: Cluster, code: str, timeout: float | None = None) -> LaunchError:
    """The LaunchError `cluster.exec(code)` raises, caught as the notebook catches it."""
    with pytest.raises(LaunchError) as caught:
        cluster.exec(code, timeout=timeout)
    return caught.value


@pytest.mark.multiprocess
def test_07_2_the_stacks_of_a_barrier_against_a_recv():
    # the expected timeouts: 10 s, as each rank must first reach its call on a busy machine
    with Cluster(2) as cluster:
        failed = _raised(cluster, "if rank == 0:\n    raise ValueError('x')")
        right, why = _judged("07.2", failed)  # a failure, the cluster still usable
        assert right is False and "not a timeout report" in why
        right, why = _judged("07.2", _raised(cluster, BARRIER_AGAINST_RECV, timeout=10))
        assert right is True and "rank 0 in barrier, rank 1 in recv" in why
    with Cluster(2) as cluster:  # the timeout stopped the first one
        right, why = _judged("07.2", _raised(cluster, BOTH_RECEIVE, timeout=10))
        assert right is False and "notebook's hang" in why


def test_07_2_wants_the_error_itself():
    right, why = _judged("07.2", RuntimeError("timed out"))
    assert right is False and "give the error itself" in why
    right, why = _judged("07.2", LaunchError("launch failed on rank 0"))
    assert right is False and "not a timeout report" in why


@pytest.fixture(scope="module")
def nb07() -> dict[str, Any]:
    """The definitions (imports, functions, classes) of notebook 07's lesson cells: its
    FusedLinear with the bug (the fix is an assignment, left out) and compare_with_autograd."""
    namespace: dict[str, Any] = {}
    for cell in read_cells(NAMES["07"]):
        if "## Exercises" in cell_source(cell):
            break
        if cell["cell_type"] != "code" or cell_source(cell).startswith("%"):
            continue
        kept = [
            node
            for node in ast.parse(cell_python(cell)).body
            if isinstance(node, ast.Import | ast.ImportFrom | ast.FunctionDef | ast.ClassDef)
        ]
        exec(compile(ast.Module(kept, []), "07_debugging", "exec"), namespace)
    return namespace


def test_07_3_a_plain_backward_hides_the_bug(nb07, capsys):
    torch.manual_seed(0)
    stage = nb07["FusedMLP"]()
    reference = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4))
    reference[0].load_state_dict(stage.fc1.state_dict())
    reference[2].load_state_dict(stage.fc2.state_dict())
    x, grad_out = torch.randn(5, 4), torch.randn(5, 4)
    x_plain, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    stage(x_plain).backward(grad_out)
    reference(x_ref).backward(grad_out)
    got = [x_plain.grad] + [p.grad for p in stage.parameters()]
    want = [x_ref.grad] + [p.grad for p in reference.parameters()]
    assert all(torch.allclose(g, w, atol=1e-6) for g, w in zip(got, want, strict=True))
    right, why = _judged("07.3", set())
    assert right is True and "none" in why
    # the notebook's own split comparison: the weights are missing, as the hint says
    stage.zero_grad(set_to_none=True)
    reference.zero_grad(set_to_none=True)
    nb07["compare_with_autograd"](stage, reference, x, grad_out)
    split_wrong = {line.split()[0] for line in capsys.readouterr().out.splitlines()
                   if "ok" not in line}  # fmt: skip
    assert split_wrong == {"fc1.weight", "fc2.weight"}
    right, why = _judged("07.3", split_wrong)
    assert right is False and "split backward" in why and "WEIGHT alone" in why
    right, why = _judged("07.3", ["x"])
    assert right is False and "five rows" in why and "one direction alone" in why


def test_07_4_where_a_crash_on_rank_0_leaves_rank_1():
    sch = build_schedule("1f1b", pp=2, microbatches=4)
    row0 = sch.actions(0)
    third = [a for a in row0 if a.kind == "F"][2]
    forwarded = {a.microbatch for a in row0[: row0.index(third)] if a.kind == "F"}
    # rank 1 holds the last stage: its B needs only its own F, its F needs rank 0's
    waits = next(a for a in sch.actions(1) if a.kind == "F" and a.microbatch not in forwarded)
    right, why = _judged("07.4", str(waits))
    assert right is True and f"{waits} needs" in why and "receiving the activations" in why
    right, _ = _judged("07.4", waits)  # an Action too
    assert right is True
    right, why = _judged("07.4", "1B1")
    assert right is False and "does not wait for its receiver" in why
    earlier = next(a for a in sch.actions(1) if a.kind == "F" and a.microbatch in forwarded)
    right, why = _judged("07.4", str(earlier))
    assert right is False and f"{earlier} ran" in why
    later = Action(1, "F", max(a.microbatch for a in sch.actions(1)))
    assert later != waits
    right, why = _judged("07.4", str(later))
    assert right is False and "in order" in why and str(third) in why
    right, why = _judged("07.4", str(third))
    assert right is False and "rank 0's program" in why
    right, why = _judged("07.4", "rank 1")
    assert right is False and "such as '1B0'" in why


# ----------------------------------------------------------------- notebook 08


def test_08_1_where_torchs_interleaved_program_parts_from_zbkits():
    theirs = Schedule.from_torch(torch_schedules.ScheduleInterleaved1F1B, pp=2, microbatches=2)
    ours = build_schedule("interleaved-1f1b", pp=2, microbatches=2)
    first = next(
        (a, b)
        for r in range(2)
        for a, b in zip(theirs.program[r], ours.program[r], strict=True)
        if a != b
    )
    validate(theirs)
    validate(ours)
    right, why = _judged("08.1", str(first[0]))
    assert right is True and "both validate" in why
    right, why = _judged("08.1", str(first[1]))
    assert right is False and "zbkit's action" in why and "torch's side" in why
    right, why = _judged("08.1", "0F0")
    assert right is False and "first position" in why


def test_08_2_what_overlap_saves_dualpipev():
    dualpipe = Schedule.from_torch(torch_schedules.ScheduleDualPipeV, pp=2, microbatches=4)
    apart = simulate(dualpipe, Costs(overlap=0)).makespan
    overlapped = simulate(dualpipe, Costs(overlap=0.5)).makespan
    assert overlapped < apart
    right, why = _judged("08.2", apart - overlapped)
    assert right is True and f"from {apart:g} to {overlapped:g}" in why
    right, why = _judged("08.2", (apart - overlapped) / apart)
    assert right is False and "fraction" in why
    right, why = _judged("08.2", apart)
    assert right is False and "subtract" in why and "OVERLAP_F_B" in why


def test_08_3_the_messages_of_one_zbv_step():
    zbv = Schedule.from_torch(torch_schedules.ScheduleZBVZeroBubble, pp=2, microbatches=4)
    sends = sum("SEND" in op for r in range(2) for op in zbv.row(r))
    assert sends == sum("RECV" in op for r in range(2) for op in zbv.row(r))
    right, why = _judged("08.3", sends)
    assert right is True and why.startswith(f"{sends}:")
    right, why = _judged("08.3", 2 * sends)
    assert right is False and "one side only" in why
    right, why = _judged("08.3", sends + 1)
    assert right is False and "one RECV on the other" in why


def test_08_4_the_call_that_fails_on_a_view_output():
    from torch.distributed.pipelining import stage as torch_stage

    torch.manual_seed(0)
    lin, mid = nn.Linear(6, 6), nn.Linear(6, 6)
    x = torch.randn(4, 6, requires_grad=True)
    out = lin(torch.tanh(mid(lin(x))))[:, :4]  # the notebook's TiedStage, output a view
    params = [*lin.parameters(), *mid.parameters()]
    with pytest.raises(RuntimeError) as caught:
        torch_stage.stage_backward_input([out], [torch.ones_like(out)], [x], params)
    assert "view" in str(caught.value.__cause__)
    right, why = _judged("08.4", "stage_backward_input")
    assert right is True and "still equals plain backward" in why
    right, why = _judged("08.4", "torch_stage.stage_backward_input()")
    assert right is True
    right, why = _judged("08.4", "stage_backward_weight")
    assert right is False and "tied weights" in why
    right, why = _judged("08.4", "backward")
    assert right is False and "detaching" in why


# ----------------------------------------------------------------- every exercise
