"""What notebook 05 says beside its numbers is true to the numbers it printed.

Read from the stored outputs (a real run's, which nbval re-checks): the text's claims against
the table printed next to it, one simulation's numbers wherever it is shown, and the machine
reading beside every measured table (issue 22).
"""

from __future__ import annotations

import re

from notebook_cells import cell_stdout, find_cell, read_notebook

WIDGETS = "application/vnd.jupyter.widget-state+json"


# ---------------------------------------------------------------------- 05: one simulation
def _table_05(nb: dict) -> dict[str, list[str]]:
    cell = find_cell(nb["cells"], "speed-up over 1f1b, measured (run) and simulated")
    rows = {}
    for line in cell_stdout(cell).splitlines():
        words = line.removeprefix("[rank 0] ").split()
        if words and words[0] in ("1f1b", "zb-h1", "zb-h2", "zb-v"):
            rows[words[0]] = words  # name, run ms, sim ms, run x, sim x, ratio, bubbles
    return rows


def test_05_run_viewer_shows_the_tables_simulation():
    nb = read_notebook("05_running_pipelines")
    zbv = _table_05(nb)["zb-v"]
    states = nb["metadata"]["widgets"][WIDGETS]["state"].values()
    numbers = [
        s["state"]["value"]
        for s in states
        if isinstance(s["state"].get("value"), str) and "sim: makespan" in s["state"]["value"]
    ]
    assert len(numbers) == 1, "one RunViewer, its numbers stored with the widget state"
    found = re.search(
        r"run: makespan ([\d.]+), bubble ([\d.]+%); sim: makespan ([\d.]+), bubble ([\d.]+%) "
        # one Costs(T, T, T) for every schedule, a rank's share (zb-v's chunks take half)
        r"\(simulated with F 0.02, I 0.02, W 0.02, hop ([\d.e-]+)\)",
        numbers[0],
    )
    assert found, numbers[0]
    run_span, run_bubble, sim_span, sim_bubble, _ = found.groups()
    assert (run_bubble, sim_bubble) == (zbv[6], zbv[7])  # the table's zb-v bubbles
    # the viewer shows 4 significant digits in s, the table whole ms: equal to within one ms
    assert abs(float(sim_span) * 1e3 - int(zbv[2])) <= 1, (sim_span, zbv)
    assert abs(float(run_span) * 1e3 - int(zbv[1])) <= 1, (run_span, zbv)


def test_05_first_drawing_is_simulated_with_the_tables_costs():
    nb = read_notebook("05_running_pipelines")
    zbh1 = _table_05(nb)["zb-h1"]
    cell = find_cell(nb["cells"], 'viz.plot_schedule(trace, simulation=sims["zb-h1"]')
    plain = "".join("".join(o["data"]["text/plain"]) for o in cell["outputs"] if "data" in o)
    found = re.search(r"run: makespan [\d.]+, bubble ([\d.]+%) \| sim: makespan [\d.]+, "
                      r"bubble ([\d.]+%)", plain)  # fmt: skip
    assert found and found.groups() == (zbh1[6], zbh1[7]), (plain, zbh1)


def test_05_measured_numbers_say_how_busy_the_machine_was():
    nb = read_notebook("05_running_pipelines")
    note = re.compile(
        r"(machine busy|machine quiet|ranks share cores): load [\d.]+ on \d+ cores, 4 ranks"
    )
    for marker, sleeping in [
        ("speed-up over 1f1b, measured (run) and simulated", True),
        ("measured_costs(merged.events", False),
    ]:
        cell = find_cell(nb["cells"], marker)
        text = cell_stdout(cell)
        found = note.search(text)
        assert found, f"no machine reading beside the numbers of the cell with {marker!r}"
        if found.group(1) != "machine quiet":
            assert ("the stages sleep" in text) == sleeping
            assert "measured bubble" in text
