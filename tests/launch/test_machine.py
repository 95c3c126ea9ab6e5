"""`zbkit.launch.machine`: whether ranks shared their cores, read from fake readings.

The oracle is the rule itself: ranks wait for a core when there are more ranks than cores, or
when the load (runnable processes over the last minute) fills every core; the note says so,
with the numbers, and says what that does to the measured bubble.
"""

from __future__ import annotations

import os

import pytest

from zbkit.launch import machine
from zbkit.launch.machine import machine_load


@pytest.mark.parametrize(
    ("load", "cores", "ranks", "crowded", "busy"),
    [
        (0.3, 8, 4, False, False),  # a quiet machine with a core for every rank
        (3.2, 2, 4, True, True),  # the case: four ranks on two busy cores
        (0.5, 2, 4, True, False),  # quiet, but more ranks than cores
        (9.0, 8, 4, False, True),  # enough cores, taken by other work
        (8.0, 8, 8, False, True),  # the load exactly fills every core
    ],
)
def test_crowded_and_busy_follow_the_readings(load, cores, ranks, crowded, busy):
    m = machine_load(ranks, load=load, cores=cores)
    assert (m.crowded, m.busy, m.shared) == (crowded, busy, crowded or busy)
    note = m.note()
    assert f"load {load:.1f} on {cores} cores, {ranks} ranks" in note
    head = "machine busy:" if busy else "ranks share cores:" if crowded else "machine quiet:"
    assert note.startswith(head), note
    assert ("more ranks than cores" in note) == crowded
    assert ("the load fills every core" in note) == busy
    assert ("the measured bubble includes waiting for a core" in note) == (crowded or busy)


def test_sleeping_stages_say_the_waits_are_only_to_wake_up_and_talk():
    note = machine_load(4, load=3.2, cores=2).note(sleeping=True)
    assert "the stages sleep" in note and "wake up, send and receive" in note
    assert "measured bubble" in note
    # a quiet machine says the same whether the stages sleep or compute
    quiet = machine_load(2, load=0.1, cores=4)
    assert quiet.note(sleeping=True) == quiet.note()


def test_readings_come_from_the_os_and_an_unknown_load_is_said(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (5.0, 4.0, 3.0))  # the last minute's is read
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    m = machine_load(4)
    assert (m.load, m.cores, m.ranks) == (5.0, 3, 4)
    assert machine.usable_cores() == 3

    def no_load() -> tuple[float, float, float]:
        raise OSError("load average unobtainable")

    monkeypatch.setattr(os, "getloadavg", no_load)
    m = machine_load(2, cores=4)
    assert m.load is None and not m.busy and "load unknown on 4 cores" in m.note()
    assert machine_load(8, cores=4).crowded  # an unknown load still counts the ranks
    with pytest.raises(ValueError, match="ranks=0"):
        machine_load(0)
