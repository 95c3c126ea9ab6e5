"""Lower bounds on the longest rank span: no schedule under the memory limit does better.

zb-auto times its hand-written candidates first; when one of them reaches `lower_bound`
it is optimal for these costs and this limit, so the search stops there (the other rows
of `explain_auto` say "not run: ... reaches the lower bound").

Bounds on some rank's span (first start to last end), so on the longest one:
  - busy: a rank cannot finish before it has done all its work (any costs, any placement);
  - one round trip (`one_trip`, any costs, any placement): the last forward of a stage
    starts after its other m - 1, then goes down and back up and leaves a W; the first input
    gradient of a stage ends a round trip after its rank starts, and the stage's m Is and m
    Ws all come after it;
  - round trips (`round_trips`, any costs, any placement): a stage's microbatch holds its
    activation from its F's start to its I's end, at least the round trip down the pipeline
    and back; with room for only k activations, those intervals overlap k at a time, so some
    ceil(m / k) of them follow one another (any k + 1 that overlap would not fit);
  - rank 0, one stage per rank (`rank0`): idle time rank 0 cannot avoid at the start
    (waiting for microbatch 0's input gradient with at most `limit // M_B` forwards to run)
    and at the end (a round trip for the last input gradient, filled only with what it owes),
    both if it has more forwards than fit before the first I, else the longer one;
  - the last stage (`last_stage`): rank 0 starts, the last rank gets its first input
    (p-1)(F + comm) later, runs m F and m I, and its last I goes back up to rank 0, which
    still owes that microbatch's W;
  - rank 0 of the V (`v_start`): before the first forward of its second stage arrives,
    (2p-1) F and (2p-2) comm after its first F, rank 0 can only run first-stage forwards.
The last three assume every stage costs the same and one of the two placements.
And for any costs and placement, up to `CHAINS_MAX_ACTIONS`, the walk over every action
(`walk.chains`, for schedules that run each stage's microbatches in order): the orders memory
forces between forwards, each action's earliest start (what it depends on, its rank's work
that must come first, the input gradients a forward waits for to make room), up to
`PROBE_MAX_ACTIONS` both orders of each pair of a rank's forwards on different stages, then
per rank those starts against what each action leaves to do. It is what sees the V's two
chunks sharing a rank's memory, and how one rank's choice delays another: under 0.75 p the
closed forms fell to 78% of the optimum, the walk keeps 92.5% (`benchmarks/exact.py`).
"""

from __future__ import annotations

from zbkit.schedules.core.costs import TOL, Costs, beyond
from zbkit.schedules.optimum.walk import CHAINS_MAX_ACTIONS, chains


def busy(stage_to_rank: list[int], m: int, costs: list[Costs]) -> float:
    """The busiest rank's work: m times F + I + W of each of its stages."""
    work = [0.0] * (max(stage_to_rank) + 1)
    for s, r in enumerate(stage_to_rank):
        work[r] += m * (costs[s].F + costs[s].I + costs[s].W)
    return max(work)


def _forwards_held(limit: float, c: Costs, m: int) -> int:
    """How many activations fit under `limit` (all of them if an F holds nothing)."""
    if c.mem_activation <= 0:
        return m
    return max(0, min(m, int((limit + TOL) // c.mem_activation)))


def _trips(stage_to_rank: list[int], costs: list[Costs]) -> list[float]:
    """Per stage s: the shortest time from F(s, j)'s start to I(s, j)'s end, every later
    stage's F and I in between (and a hop each way where the rank changes)."""
    trips, trip = [0.0] * len(costs), 0.0
    for s in reversed(range(len(stage_to_rank))):
        trip += costs[s].F + costs[s].I
        if s + 1 < len(stage_to_rank) and stage_to_rank[s + 1] != stage_to_rank[s]:
            trip += costs[s + 1].comm + costs[s].comm  # down to s + 1, and its I back up
        trips[s] = trip
    return trips


def one_trip(stage_to_rank: list[int], m: int, costs: list[Costs]) -> float:
    """A stage's rank around one round trip (any costs and placement): the last of its m
    forwards starts after the other m - 1, then its round trip and W; or the first of its
    input gradients ends a round trip after the rank's start at the earliest, and all m
    Is and Ws of the stage come from then on, one after another."""
    best = 0.0
    for s, trip in enumerate(_trips(stage_to_rank, costs)):
        c = costs[s]
        last_forward = (m - 1) * c.F + trip + c.W
        first_backward = trip - c.I + m * (c.I + c.W)
        best = max(best, last_forward, first_backward)
    return best


def round_trips(stage_to_rank: list[int], m: int, costs: list[Costs], limit: float) -> float:
    """The longest chain of round trips some stage's rank must run one after another, and the
    last one's W: F(s, j) starts, every later stage's F and I runs (a hop where the rank
    changes), I(s, j) ends; at most `_forwards_held` of them overlap."""
    best = 0.0
    for s, trip in enumerate(_trips(stage_to_rank, costs)):
        c = costs[s]
        k = _forwards_held(limit, c, m)
        if k == 0:  # not one activation fits: no schedule at all; the other bounds say so
            continue
        best = max(best, -(-m // k) * trip + c.W)
    return best


def rank0(p: int, m: int, c: Costs, limit: float) -> float:
    """Rank 0's span, one stage per rank: its work plus the idle time it cannot avoid."""
    k0 = _forwards_held(limit, c, m)
    first_i = p * c.F + (p - 1) * (c.I + 2 * c.comm)  # microbatch 0 down and back
    start_idle = max(0.0, first_i - k0 * c.F)
    # after its last F (holding r activations), rank 0 waits a round trip for the last
    # input gradient and fills it with r - 1 I's and the Ws still owed (`owed` deferred)
    trip = (p - 1) * (c.F + c.I + 2 * c.comm)
    fill = 0.0
    for r in range(1, k0 + 1):
        room = limit + TOL - r * c.mem_activation
        owed = m - r if c.mem_weight <= 0 else min(m - r, int(room // c.mem_weight))
        fill = max(fill, (r - 1) * c.I + (r - 1 + owed) * c.W)
    end_idle = max(0.0, trip - fill)
    if m <= k0:  # all forwards may run before the first I: the two waits may be one
        return m * (c.F + c.I + c.W) + max(start_idle, end_idle)
    return m * (c.F + c.I + c.W) + start_idle + end_idle


def last_stage(p: int, m: int, c: Costs) -> float:
    """Rank 0's span, one stage per rank, through the last stage's m F and m I."""
    return (p - 1) * (c.F + c.comm) + m * (c.F + c.I) + (p - 1) * (c.comm + c.I) + c.W


def v_start(p: int, m: int, c: Costs, limit: float) -> float:
    """Rank 0's span in the V: its work plus the wait for its second stage's first input."""
    arrives = (2 * p - 1) * c.F + (2 * p - 2) * c.comm
    # the second stage's forward needs room for one more activation
    ahead = _forwards_held(limit - c.mem_activation, c, m)
    return 2 * m * (c.F + c.I + c.W) + max(0.0, arrives - ahead * c.F)


def lower_bound(
    stage_to_rank: list[int],
    m: int,
    costs: list[Costs],
    limit: float,
    placement: str | None,
    walk: bool = True,
) -> float:
    """The best of the bounds above that apply to this placement (None: another one) and
    these costs; `walk=False`: the closed forms only, not `chains` (for many limits at once)."""
    bound = max(
        busy(stage_to_rank, m, costs),
        round_trips(stage_to_rank, m, costs, limit),
        one_trip(stage_to_rank, m, costs),
    )
    if walk and 3 * len(stage_to_rank) * m <= CHAINS_MAX_ACTIONS:
        bound = max(bound, chains(stage_to_rank, m, costs, limit))
    if placement not in ("linear", "v") or any(c != costs[0] for c in costs):
        return bound
    p, c = max(stage_to_rank) + 1, costs[0]
    if placement == "v":
        return max(bound, v_start(p, m, c, limit))
    return max(bound, rank0(p, m, c, limit), last_stage(p, m, c))


def gap_line(span: float, bound: float | None) -> str:
    """'optimal' or '<= 3.1% above optimal' for a longest rank span against its bound."""
    if bound is None:
        return "no certified bound (overlapped pairs save time the bounds do not count)"
    if span <= beyond(bound):
        return f"optimal (it reaches the lower bound {bound:.6g})"
    return f"<= {(span - bound) / span:.1%} above optimal (lower bound {bound:.6g})"
