"""plot_schedule / plot_memory: boxes = actions, numbers = the simulation's, closed forms agree.

Oracles: the schedule's own program (one box per action, by kind), closed forms (1F1B holds
min(p - r, m) activations on rank r; a hand-made trace's bubble rate), byte equality of
two renders, and the figure's own legend for what each colour means (`palette.py`).
"""

from __future__ import annotations

import re
from collections import Counter

import matplotlib
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from palette import graph_colours, kind_swatches, legend_swatches

from zbkit.schedules import Costs, build_schedule, simulate
from zbkit.viz import plot_memory, plot_schedule


def _collection(fig, gid):
    return next(c for c in fig.axes[0].collections if c.get_gid() == gid)


def _legend_fill(fig):
    """(kind, chunk) -> the colour the figure's legend gives it: the chunk's swatch for the
    kind where the legend lists chunks (their swatches in the kinds' order), else the kind's."""
    kinds = kind_swatches(fig)
    chunks = {
        int(re.match(r"chunk (\d+):", text)[1]): colours
        for text, colours in legend_swatches(fig).items()
        if text.startswith("chunk ")
    }

    def fill(kind: str, chunk: int) -> str:
        if not chunks:
            assert chunk == 0, "several chunks drawn, none in the legend"
            return kinds[kind]
        return chunks[chunk][list(kinds).index(kind)]

    return fill


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "interleaved-1f1b"])
def test_one_box_per_action_coloured_by_kind_and_numbers_in_title(name):
    schedule = build_schedule(name, pp=4, microbatches=8)
    sim = simulate(schedule, Costs(1.0, 1.0, 1.0, comm=0.1))
    fig = plot_schedule(sim)
    actions = [a for rank in range(4) for a in schedule.program[rank]]
    boxes = _collection(fig, "actions")
    assert len(boxes.get_paths()) == len(actions)
    colours = Counter(to_hex(c) for c in boxes.get_facecolors())
    # interleaved: rank r holds stages r and r + 4, the second chunk in a colour of its own;
    # each box in the colour the legend gives its kind (and chunk), each pair its own colour
    fill = _legend_fill(fig)
    assert colours == Counter(fill(a.kind, a.stage // 4) for a in actions)
    drawn = {(a.kind, a.stage // 4) for a in actions}
    assert len({fill(*pair) for pair in drawn}) == len(drawn)
    # each box spans exactly its event's time (rank order, then time order)
    xs = sorted((min(p.vertices[:, 0]), max(p.vertices[:, 0])) for p in boxes.get_paths())
    want = sorted((e.start, e.end) for e in sim.events)
    assert [x for pair in xs for x in pair] == pytest.approx([x for pair in want for x in pair])
    title = fig.axes[0].get_title(loc="left")
    assert f"bubble {sim.bubble_rate:.1%}" in title and f"makespan {sim.makespan:.4g}" in title
    assert name in title and "pp=4" in title and "m=8" in title
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == [f"rank {r}" for r in range(4)]


def test_renders_are_reproducible_and_nothing_leaks_into_pyplot():
    import matplotlib.pyplot as plt

    backend = matplotlib.get_backend()

    def draw():
        sim = simulate(build_schedule("zb-h1", pp=3, microbatches=4), Costs(1, 1, 1))
        return plot_schedule(sim), plot_memory(sim, limit=3)

    (a, am), (b, bm) = draw(), draw()
    assert a.to_svg() == b.to_svg() and am.to_svg() == bm.to_svg()
    assert a.to_png() == b.to_png()
    bundle = a._repr_mimebundle_()
    assert bundle["image/png"].startswith(b"\x89PNG") and "text/plain" in bundle
    assert plt.get_fignums() == []  # made without pyplot: nothing to close, nothing leaks
    assert matplotlib.get_backend() == backend  # still whatever the user had


def test_measured_trace_beside_and_over_its_simulation():
    sim = simulate(build_schedule("1f1b", pp=2, microbatches=3), Costs(1, 1, 1))
    # a "measured" run: wall-clock times (offset), every action 10% slower
    trace = [
        {
            "rank": e.rank,
            "stage": e.stage,
            "kind": e.kind,
            "microbatch": e.microbatch,
            "start": 1000 + 1.1 * e.start,
            "end": 1000 + 1.1 * e.end,
        }
        for e in sim.events
    ]
    rows = plot_schedule(trace, simulation=sim)
    labels = [t.get_text() for t in rows.axes[0].get_yticklabels()]
    assert labels == ["rank 0 run", "rank 0 sim", "rank 1 run", "rank 1 sim"]
    assert len(_collection(rows, "actions").get_paths()) == 2 * len(sim.events)
    # the trace is drawn from 0, scaled by 1.1 exactly
    title = rows.axes[0].get_title(loc="left")
    assert f"run: makespan {1.1 * sim.makespan:.4g}" in title
    over = plot_schedule(trace, simulation=sim, compare="overlay")
    assert len(_collection(over, "simulated").get_paths()) == len(sim.events)
    assert len(over.axes[0].get_yticklabels()) == 2
    one = plot_schedule(trace, ranks=[1])
    assert len(_collection(one, "actions").get_paths()) == sum(e.rank == 1 for e in sim.events)


@pytest.mark.parametrize("width", [8.5, 9.0, 12.0])
def test_the_title_stays_in_the_figure_and_clear_of_the_legend(width):
    """A run beside its simulation at JupyterLab's width (issue 36): the name, the run's and
    the simulation's numbers on lines of their own, none cut off at the top or under the
    legend."""
    sch = build_schedule("zb-v", pp=4, microbatches=8)
    sim, run = simulate(sch, Costs(1, 1, 1)), simulate(sch, Costs(1.1, 1.2, 0.9))
    fig = plot_schedule(run, simulation=sim, comm=True, width=width)
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # to measure drawn text
    from matplotlib.text import Text  # the same reason

    renderer = FigureCanvasAgg(fig).get_renderer()
    ax = fig.axes[0]
    (title,) = [
        t for t in ax.get_children() if isinstance(t, Text) and t.get_text() == ax.get_title("left")
    ]
    box = title.get_window_extent(renderer)
    legend = ax.get_legend().get_window_extent(renderer)
    assert box.y1 <= fig.bbox.y1 and not box.overlaps(legend), title.get_text()
    assert title.get_text().count("\n") >= 1 and f"sim: makespan {sim.makespan:.4g}" in (
        title.get_text()
    )


def test_bubble_rate_of_a_hand_made_trace_matches_the_closed_form():
    # rank 0 busy 0-2 and 3-4 (span 4, busy 3); rank 1 busy 1-3 (span 2, busy 2)
    # cost = longest span = 4; work = the busiest rank's busy time = 3; bubble = (4 - 3) / 4
    events = [(0, 0, "F", 0, 0, 2), (0, 0, "B", 0, 3, 4), (1, 1, "F", 0, 1, 3)]
    title = plot_schedule(events).axes[0].get_title(loc="left")
    assert "makespan 4, bubble 25.0%" in title


def test_memory_follows_the_1f1b_closed_form_and_draws_the_limit():
    p, m = 4, 6
    sim = simulate(build_schedule("1f1b", pp=p, microbatches=m), Costs(1, 2, 0, comm=0.5))
    fig = plot_memory(sim, limit=3)
    for r, ax in enumerate(fig.axes):
        line = next(ln for ln in ax.get_lines() if ln.get_gid() == f"memory{r}")
        assert max(line.get_ydata()) == min(p - r, m) == sim.peak_memory[r]
        texts = [t.get_text() for t in ax.texts]
        assert any(t.startswith(f"peak {min(p - r, m)}") for t in texts)
        assert any(ln.get_ydata()[0] == 3 for ln in ax.get_lines() if ln.get_gid() is None)
    assert "> limit" in fig.axes[0].texts[0].get_text()  # rank 0 holds 4 > 3
    assert "> limit" not in fig.axes[3].texts[0].get_text()
    # the same memory from bare events and the costs (the one memory rule, schedules.events)
    bare = plot_memory(list(sim.events), costs=Costs(1, 2, 0))
    for r, ax in enumerate(bare.axes):
        assert max(ax.get_lines()[0].get_ydata()) == sim.peak_memory[r]


def test_bad_inputs_say_what_is_wrong():
    with pytest.raises(TypeError, match="fields rank, stage, kind"):
        plot_schedule([object()])
    with pytest.raises(TypeError, match="no field 'end'"):
        plot_schedule([{"rank": 0, "stage": 0, "kind": "F", "microbatch": 0, "start": 0}])
    with pytest.raises(ValueError, match="kind 'X'"):
        plot_schedule([(0, 0, "X", 0, 0, 1)])
    with pytest.raises(ValueError, match="empty"):
        plot_schedule([])
    with pytest.raises(ValueError, match="ranks \\[5\\]"):
        plot_schedule([(0, 0, "F", 0, 0, 1)], ranks=[5])
    with pytest.raises(ValueError, match="compare"):
        plot_schedule([(0, 0, "F", 0, 0, 1)], compare="side")


def test_comm_waits_are_drawn_from_the_plan():
    sim = simulate(build_schedule("zb-h1", pp=4, microbatches=6), Costs(comm=0.3))
    fig = plot_schedule(sim, comm=True)
    bars = next(c for c in fig.axes[0].collections if c.get_gid() == "comm")
    assert len(bars.get_paths()) == len(sim.comm) > 0
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "waiting on a receive" in labels
    plain = plot_schedule(sim)  # off by default
    assert not any(c.get_gid() == "comm" for c in plain.axes[0].collections)


def _per_row(collection):
    """row index -> total width of the collection's boxes on that row."""
    out: dict[int, float] = {}
    for path in collection.get_paths():
        xs, ys = path.vertices[:, 0], path.vertices[:, 1]
        row = round(float(ys.mean()))
        out[row] = out.get(row, 0.0) + float(xs.max() - xs.min())
    return out


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "zb-h2", "zb-v"])
def test_hatched_idle_is_what_the_bubble_rate_counts(name):
    sim = simulate(build_schedule(name, pp=4, microbatches=8), Costs(1, 1, 1))
    fig = plot_schedule(sim)
    hatched = _per_row(_collection(fig, "idle"))
    edges = _per_row(_collection(fig, "edges"))
    for r in range(4):
        # hatched = idle inside the rank's span (sim.idle); the rest of the row is the edges
        assert hatched.get(r, 0.0) == pytest.approx(sim.idle[r], abs=1e-9)
        assert edges.get(r, 0.0) == pytest.approx(sim.makespan - sim.span[r], abs=1e-9)
    if name in ("zb-h2", "zb-v"):  # bubble 0.0%: nothing hatched, the edges still shaded
        assert sim.bubble_rate == 0.0 and not _collection(fig, "idle").get_paths()
        assert sum(edges.values()) > 0
    assert _collection(fig, "idle").get_hatch() == "//"
    assert not _collection(fig, "edges").get_hatch()
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "idle (bubble)" in labels and "before first / after last action" in labels


def _lab(colour):
    """CIELAB (D65) of an sRGB colour: distances in it are what an eye tells apart."""

    def linear(c):
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in matplotlib.colors.to_rgb(colour))
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883
    fx, fy, fz = (t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116 for t in (x, y, z))
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def _distance(a, b):
    return sum((p - q) ** 2 for p, q in zip(_lab(a), _lab(b), strict=True)) ** 0.5


def test_zb_v_boxes_show_their_chunk_and_kind():
    """Issue 22: the second chunk's F, I, W were near-identical dark shades (blue, teal and
    green scaled towards black) and narrow boxes said only the microbatch."""
    p = 4
    sim = simulate(build_schedule("zb-v", pp=p, microbatches=8), Costs(0.5, 0.5, 0.5))
    fig = plot_schedule(sim, width=12)
    boxes = _collection(fig, "actions")
    # rank r holds stages r (chunk 0, the kind's colour) and 2p-1-r (chunk 1, its dark colour)
    order = sorted(sim.events, key=lambda e: (e.rank, e.start, e.end, e.stage, e.kind))
    drawn: dict[tuple[int, str], set[str]] = {}
    for e, colour in zip(order, boxes.get_facecolors(), strict=True):
        chunk = 0 if e.stage < p else 1
        assert e.stage in (e.rank, 2 * p - 1 - e.rank)
        drawn.setdefault((chunk, e.kind), set()).add(to_hex(colour))
    # one colour per (chunk, kind), the legend's: chunk 0 in the kinds' own colours
    swatches = legend_swatches(fig)
    chunk0, chunk1 = swatches["chunk 0: stages 0-3"], swatches["chunk 1: stages 4-7"]
    kinds = kind_swatches(fig)
    assert list(kinds) == list("FIW") and chunk0 == [kinds[k] for k in "FIW"]
    assert drawn == {(0, k): {chunk0[i]} for i, k in enumerate("FIW")} | {
        (1, k): {chunk1[i]} for i, k in enumerate("FIW")
    }
    # every two of the six colours are far apart (CIELAB distance; ~2.3 is just noticeable):
    # the old dark teal and dark blue were 28 apart, dark blue and the light one 24
    six = [c for (colours) in drawn.values() for c in colours]
    assert min(_distance(a, b) for i, a in enumerate(six) for b in six[i + 1 :]) > 29
    # the legend: one entry per chunk, with its stages, and none other
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    chunks = [t for t in labels if t.startswith("chunk")]
    assert chunks == ["chunk 0: stages 0-3", "chunk 1: stages 4-7"]
    # dark boxes get white text
    on_dark = {t.get_color() for t in fig.axes[0].texts}
    assert on_dark == {"black", "white"}

    def said(fig):
        """(row, stage or '', kind, microbatch) of each box's label: 5F3, 5F over 3, F over 3."""
        found = (re.fullmatch(r"(\d*)([FIWB])\n?(\d+)", t.get_text()) for t in fig.axes[0].texts)
        rows = (round(t.get_position()[1]) for t in fig.axes[0].texts)
        return Counter((r, m[1], m[2], int(m[3])) for r, m in zip(rows, found, strict=True))

    # the notebook's width: every box names its stage, kind and microbatch (5F over 3)
    wide = plot_schedule(sim, width=14)
    assert said(wide) == Counter((e.rank, str(e.stage), e.kind, e.microbatch) for e in sim.events)
    # 12 in: every box still names its kind and microbatch; its colour the chunk
    assert said(fig) == Counter((e.rank, "", e.kind, e.microbatch) for e in sim.events)
    # the default 9 in (shown unscaled in JupyterLab's column): the microbatch, the colour
    # saying kind and chunk
    narrow = Counter(t.get_text() for t in plot_schedule(sim).axes[0].texts)
    assert narrow == Counter(str(e.microbatch) for e in sim.events)
    # and no label is wider than its box, nor runs into its neighbour's
    for f in (fig, wide):
        renderer = FigureCanvasAgg(f).get_renderer()
        ax = f.axes[0]
        for rank in range(p):
            box = {(e.start + e.end) / 2: e for e in sim.events if e.rank == rank}
            texts = [t for t in ax.texts if round(t.get_position()[1]) == rank]
            spans = sorted(
                ((t.get_window_extent(renderer), t) for t in texts), key=lambda s: s[0].x0
            )
            for (left, _), (right, _) in zip(spans, spans[1:], strict=False):
                assert left.x1 < right.x0
            for extent, t in spans:
                e = box[t.get_position()[0]]
                x0, x1 = ax.transData.transform([(e.start, 0), (e.end, 0)])[:, 0]
                assert x0 < extent.x0 and extent.x1 < x1, (t.get_text(), e)
    # one stage per rank: plain colours, no chunk legend
    one = plot_schedule(simulate(build_schedule("zb-h1", pp=p, microbatches=8), Costs()))
    assert not any("chunk" in t.get_text() for t in one.axes[0].get_legend().get_texts())


def test_an_overlapped_pair_is_one_box_around_its_two_halves():
    """Issue 13: DualPipeV's OVERLAP_F_B pairs drawn as one action: an outline around the two
    halves (each still coloured by its kind), named in the legend."""
    from zbkit.schedules import Costs, Overlap, build_schedule, simulate

    schedule = build_schedule("dualpipev", pp=2, microbatches=4)
    sim = simulate(schedule, Costs(F=1, I=1, W=1, overlap=0.5))
    fig = plot_schedule(sim)
    ax = fig.axes[0]
    outlines = next(c for c in ax.collections if c.get_gid() == "pairs")
    pairs = sum(isinstance(item, Overlap) for row in schedule.program.values() for item in row)
    assert len(outlines.get_paths()) == pairs > 0
    # each outline spans exactly its pair's two halves, as simulated
    spans = sorted(
        (round(p.vertices[:, 0].min(), 9), round(p.vertices[:, 0].max(), 9))
        for p in outlines.get_paths()
    )
    halves = [e for e in sim.events if e.paired]
    want = sorted(
        (round(f.start, 9), round(b.end, 9)) for f, b in zip(halves[::2], halves[1::2], strict=True)
    )
    assert spans == want
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "overlapped F+B pair" in labels
    # a schedule without pairs has no outline and no legend entry
    plain = plot_schedule(simulate(build_schedule("zb-v", pp=2, microbatches=4), Costs()))
    assert all(c.get_gid() != "pairs" for c in plain.axes[0].collections)


def test_iterations_tile_and_the_title_says_how_they_were_run():
    sch = build_schedule("zb-h2", pp=4, microbatches=8)
    for sync, rate in ((True, 8 / 27), (False, 8 / 24)):
        sim = simulate(sch, Costs(1, 1, 1), iterations=2, optimizer_sync=sync)
        fig = plot_schedule(sim)
        boxes = _collection(fig, "actions").get_paths()
        assert len(boxes) == 2 * len(sch) == len(sim.events)
        title = fig.axes[0].get_title(loc="left")
        assert "pp=4, m=8, x 2 iterations" in title, title
        assert ("optimizer synced" if sync else "no optimizer sync") in title, title
        assert f"throughput {rate:.4g}" in title and f"makespan {sim.makespan:.4g}" in title
        # the second iteration's boxes start where the steady state puts them: one period on
        first = min(e.start for e in sim.events if e.rank == 0 and e.microbatch >= 8)
        assert first == pytest.approx(27 if sync else 24)


def test_a_middle_chunk_lies_between_light_and_dark():
    # three stages per rank: chunk 1 halfway from the kind's colour to the last chunk's
    sch = build_schedule("interleaved-1f1b", pp=2, microbatches=4, stages_per_rank=3)
    fig = plot_schedule(simulate(sch, Costs()))
    fill = _legend_fill(fig)
    light, middle, dark = (matplotlib.colors.to_rgb(fill("F", c)) for c in range(3))
    assert middle == pytest.approx(
        [(a + b) / 2 for a, b in zip(light, dark, strict=True)], abs=1 / 255
    )
    assert fill("F", 0) == kind_swatches(fig)["F"] and _distance(light, dark) > 29
    # the boxes of stages 2 and 3 (rank 0's and 1's middle chunk) in the middle colour
    boxes = _collection(fig, "actions")
    order = sorted(simulate(sch, Costs()).events, key=lambda e: (e.rank, e.start, e.end))
    drawn = zip(order, boxes.get_facecolors(), strict=True)
    assert {to_hex(c) for e, c in drawn if e.kind == "F" and e.stage in (2, 3)} == {fill("F", 1)}


def test_one_palette_for_graphs_grids_and_plots():
    # F, I, W mean the same colour in draw_graph's legend, the HTML grid and the plot's legend
    sim = simulate(build_schedule("zb-v", pp=2, microbatches=4), Costs())
    plotted = kind_swatches(plot_schedule(sim))
    graph = graph_colours()
    assert plotted == {k: graph[k] for k in "FIW"}
    cell = r"<td style='[^']*background:(#[0-9a-f]{6})'>\d+([FIWB])\d+</td>"
    cells = re.findall(cell, sim._repr_html_())  # (colour, kind) of every action's cell
    assert set(cells) == {(c, k) for k, c in plotted.items()} and len(cells) == len(sim.events)
    assert len(set(plotted.values())) == 3  # three kinds, three colours
    # 1F1B's unsplit B: a colour of its own, the same in the plot and the grid
    one = simulate(build_schedule("1f1b", pp=2, microbatches=4), Costs())
    b = kind_swatches(plot_schedule(one))["B"]
    assert b not in plotted.values() and f"background:{b}'>0B0<" in one._repr_html_()
