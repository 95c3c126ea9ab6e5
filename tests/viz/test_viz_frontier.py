"""plot_frontier: every point drawn is its schedule's simulation, the frontier is exactly the
non-dominated points, what cannot be built is said, bad input is refused.

Oracles: `simulate(build_schedule(...), costs)` for each point (read back from the artists by
gid), closed forms for two of them (1F1B's busiest rank holds p activations; ZB-V's 2p
half-size chunk activations are p whole-rank ones), and a brute-force Pareto check written here.
"""

from __future__ import annotations

import pytest

from zbkit.schedules import SCHEDULES, Costs, build_schedule, simulate, solve
from zbkit.schedules.catalog import RECORDS
from zbkit.viz import plot_frontier

# drawn by default: every schedule but the proofs (zb-opt), which are drawn when named
DEFAULT = [n for n in SCHEDULES if RECORDS[n].largest is None]

PP, M = 4, 8
COSTS = Costs(F=1, I=1, W=0.5, mem_activation=1.0, mem_weight=0.3)  # notebook 04's
LIMITS = [2, 3, 4, 5, 6, 8]


def _points(fig) -> dict[str, tuple[float, float]]:
    """gid -> (x, y) of every plotted point (one artist per point, gid 'point:...')."""
    out = {}
    for line in fig.axes[0].get_lines():
        gid = line.get_gid() or ""
        if gid.startswith("point:"):
            (x, y), *rest = line.get_xydata()
            assert not rest, f"{gid}: one point per artist"
            out[gid.removeprefix("point:")] = (float(x), float(y))
    return out


def _measured(name: str, **options) -> tuple[float, float]:
    schedule = build_schedule(name, pp=PP, microbatches=M, **options)
    sim = simulate(schedule, COSTS)  # one Costs: a rank's share, so peaks in one unit
    return max(sim.peak_memory), sim.bubble_rate


@pytest.fixture(scope="module")
def fig():
    return plot_frontier(PP, M, COSTS, memory_limits=LIMITS)


def test_each_point_is_its_schedules_simulation(fig):
    drawn = _points(fig)
    want = {name: _measured(name) for name in DEFAULT if name != "zb-auto"}
    for placement in ("linear", "v"):
        for limit in LIMITS:  # the search's limit is in the same unit, whatever the placement
            options = dict(costs=COSTS, memory_limit=limit, placement=placement)
            want[f"zb-auto ({placement})@{limit:g}"] = _measured("zb-auto", **options)
    assert drawn.keys() == want.keys()
    for key, (x, y) in want.items():
        assert drawn[key] == pytest.approx((x, y), abs=1e-12), key
    # closed forms, in whole-rank units: 1F1B's rank 0 holds p; ZB-V 2p chunks = p ranks' worth
    assert drawn["1f1b"][0] == pytest.approx(PP) and drawn["zb-v"][0] == pytest.approx(PP)
    assert drawn["gpipe"][0] == pytest.approx(M)
    # the same numbers in fig.points, for a reader who wants them without the picture
    assert {p.label if p.limit is None else f"{p.label}@{p.limit:g}" for p in fig.points} == set(
        want
    )


def test_frontier_marks_exactly_the_non_dominated_points(fig):
    drawn = list(_points(fig).values())

    def dominated(a):
        return any(b[0] <= a[0] and b[1] <= a[1] and (b[0] < a[0] or b[1] < a[1]) for b in drawn)

    want = sorted({(round(x, 9), round(y, 9)) for x, y in drawn if not dominated((x, y))})
    ring = next(line for line in fig.axes[0].get_lines() if line.get_gid() == "frontier")
    got = sorted((round(float(x), 9), round(float(y), 9)) for x, y in ring.get_xydata())
    assert got == want
    assert len(want) >= 2  # a trade-off, not a single best point
    # gpipe holds m with 1F1B's bubble: 1F1B (p, same bubble) beats it
    assert _points(fig)["gpipe"] not in want
    assert fig.points and all(
        p.on_frontier == ((round(p.memory, 9), round(p.bubble, 9)) in want) for p in fig.points
    )
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "Pareto frontier" in legend[-3]
    assert legend[-2:] == [
        f"certified floor ({p}):\nno {p} schedule below" for p in ("linear", "v")
    ]


def test_points_are_named_beside_them_and_never_under_a_ring(fig):
    # issue 36: 15 legend entries could not be matched to the picture, and markers next to a
    # frontier point hid under its ring
    ax = fig.axes[0]
    fixed = [p for p in fig.points if p.limit is None]
    names = {t.get_gid(): t for t in ax.texts if (t.get_gid() or "").startswith("name:")}
    assert set(names) == {f"name:{p.label}" for p in fixed}
    for p in fixed:
        assert names[f"name:{p.label}"].xy == pytest.approx((p.memory, p.bubble))
    legend = ax.get_legend().get_texts()
    assert len(legend) <= 6, [t.get_text() for t in legend]  # curves, frontier, floors only
    lines = {line.get_gid(): line for line in ax.get_lines()}
    ring = lines["frontier"].get_zorder()
    assert all(lines[f"point:{p.label}"].get_zorder() > ring for p in fixed)
    assert fig.get_size_inches()[0] * fig.dpi <= 900  # JupyterLab's column shows it whole


def test_a_schedule_that_cannot_be_built_is_reported_not_dropped():
    # interleaved-1f1b needs microbatches a multiple of pp; 6 is not one of 4
    fig = plot_frontier(4, 6, COSTS, memory_limits=[0.5, 4])
    assert "interleaved-1f1b" not in _points(fig)
    assert "multiple of pp=4" in fig.skipped["interleaved-1f1b"]
    note = next(t for t in fig.texts if t.get_gid() == "skipped").get_text()
    assert "not drawn: interleaved-1f1b" in note
    assert "interleaved-1f1b" in repr(fig)
    # zb-auto under a limit nothing fits: that point is reported, the rest of the curve drawn
    assert "0.5" in fig.skipped["zb-auto (linear)"]
    assert "zb-auto (linear)@4" in _points(fig) and "zb-auto (linear)@0.5" not in _points(fig)
    # the schedules that can be built are all there
    assert "at least the number of stages" in fig.skipped["dualpipev"]  # m=6 < 2p=8
    built = {k.split("@")[0] for k in _points(fig)}
    left_out = ("interleaved-1f1b", "zb-auto", "dualpipev")
    assert built == {n for n in DEFAULT if n not in left_out} | {
        "zb-auto (linear)",
        "zb-auto (v)",
    }


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(pp=0, microbatches=8), "pp must be an int >= 1, got 0"),
        (dict(pp="4", microbatches=8), "pp must be an int >= 1"),
        (dict(pp=4, microbatches=0), "microbatches must be an int >= 1, got 0"),
        (dict(pp=4, microbatches=8, costs=(1, 1, 1)), "costs must be one Costs.*tuple"),
        (dict(pp=4, microbatches=8, costs=[Costs()] * 4), "costs must be one Costs.*list"),
        (dict(pp=4, microbatches=8, schedules=["zb-h3"]), "unknown schedules.*zb-h3"),
        (dict(pp=4, microbatches=8, memory_limits=[4, 0]), "memory_limits must be numbers > 0"),
        (dict(pp=4, microbatches=8, memory_limits=[]), "memory_limits.*empty"),
    ],
)
def test_bad_input_is_refused_with_the_reason(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plot_frontier(**kwargs)


def test_a_value_that_renders_reproducibly_without_pyplot():
    import matplotlib.pyplot as plt

    def draw():
        return plot_frontier(3, 6, Costs(), schedules=["1f1b", "zb-h1", "zb-auto"])

    a, b = draw(), draw()
    assert a.to_svg() == b.to_svg()
    bundle = a._repr_mimebundle_()
    assert bundle["image/png"].startswith(b"\x89PNG")
    assert "pp=3, m=6" in bundle["text/plain"] and "frontier:" in bundle["text/plain"]
    assert plt.get_fignums() == []


def test_every_schedule_has_its_own_colour_and_marker(fig):
    # two schedules in one colour read as one (dualpipev was zb-auto (linear)'s orange)
    from matplotlib.colors import to_hex

    styles = {}
    for line in fig.axes[0].get_lines():
        gid = line.get_gid() or ""
        if gid.startswith("point:"):
            label = gid.removeprefix("point:").split("@")[0]
            styles[label] = (to_hex(line.get_color()), line.get_marker())
    assert len(styles) == len(DEFAULT) + 1  # zb-auto drawn twice, once per placement
    colours = [c for c, _ in styles.values()]
    assert len(set(colours)) == len(colours), styles
    assert fig.axes[0].get_ylabel() == "bubble rate (simulated)"


def test_each_placements_floor_is_under_every_schedule_and_the_proven_optimum():
    # oracle: the solver's proven optimum under each limit, and every point of that placement
    costs, limits, m = Costs(1, 1.5, 0.5, comm=0.2), [1.5, 2, 3, 4], 3
    fig = plot_frontier(2, m, costs, schedules=["1f1b", "zb-h1", "zb-auto", "zb-opt", "zb-v"],
                        memory_limits=limits)  # fmt: skip
    assert set(fig.floors) == {"linear", "v"}
    ideal = m * (costs.F + costs.I + costs.W)
    drawn = _points(fig)
    for placement, floor in fig.floors.items():
        under = dict(floor)
        assert [x for x, _ in floor] == sorted(under)
        mine = {"linear": ("1f1b", "zb-h1", "zb-auto (linear)", "zb-opt (linear)"),
                "v": ("zb-v", "zb-auto (v)", "zb-opt (v)")}[placement]  # fmt: skip
        for gid, (x, y) in drawn.items():
            if gid.split("@")[0] in mine:
                assert y >= under[x] - 1e-12, (placement, gid)
        for limit in limits:
            try:
                best = solve(pp=2, microbatches=m, costs=costs, memory_limit=limit,
                             placement=placement)  # fmt: skip
            except ValueError:
                continue
            assert best.optimal
            # the optimum holds at most the limit: the floor anywhere from there on is under it
            assert all(v <= 1 - ideal / best.value + 1e-9 for x, v in floor if x >= limit)
    # zb-opt, named: its curve is at or under zb-auto's at every limit, and said
    for label in ("linear", "v"):
        for limit in limits:
            opt, auto = (
                drawn.get(f"zb-opt ({label})@{limit:g}"),
                drawn.get(f"zb-auto ({label})@{limit:g}"),
            )
            if auto is not None:
                assert opt is not None and opt[1] <= auto[1] + 1e-12
    assert "certified floors (fig.floors), dashed: zb-auto (linear) at most" in repr(fig)
    # overlapped pairs save time the bounds do not count: no floor, and the figure says so
    paired = plot_frontier(2, 4, Costs(overlap=0.5), schedules=["dualpipev", "zb-auto"])
    assert paired.floors == {} and "no certified floor" in repr(paired)
