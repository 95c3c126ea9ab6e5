"""Did a run's ranks have the machine to themselves? The load next to the cores.

A pipeline measured on CPU times more than its schedule when its ranks wait for a core: when
there are more ranks than cores, or when other work keeps the cores busy. The load average
(processes running or ready to run, averaged over the last minute) says the second; the
cores this process may run on say the first. `machine_load` reads both, and its `note` says
what they mean for the measured numbers, to print beside them. For four ranks on two busy
cores, ``machine_load(4, load=3.2, cores=2).note()`` reads "machine busy: load 3.2 on 2 cores,
4 ranks (more ranks than cores; the load fills every core): the measured bubble includes
waiting for a core, which the simulation does not model".
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["MachineLoad", "machine_load", "usable_cores"]


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity: a container or `taskset` may
    give it fewer than the machine has), which every rank it starts inherits."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _load_average() -> float | None:
    """Runnable processes, averaged over the last minute; None where the OS has no such
    number (Windows)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


@dataclass(frozen=True, slots=True)
class MachineLoad:
    """One reading: the load, the cores the ranks share, and how many ranks there were."""

    load: float | None  # os.getloadavg()[0]: running or ready to run, last minute (None: unknown)
    cores: int  # the cores the ranks may run on (affinity), not the machine's count
    ranks: int  # the run's processes, each wanting a core while it computes

    @property
    def crowded(self) -> bool:
        """More ranks than cores: some rank always waits while the others compute."""
        return self.ranks > self.cores

    @property
    def busy(self) -> bool:
        """On average every core had a process running or waiting for it (our ranks count
        too while they compute: the load cannot tell whose processes they were)."""
        return self.load is not None and self.load >= self.cores

    @property
    def shared(self) -> bool:
        """Ranks may have waited for a core: crowded or busy."""
        return self.crowded or self.busy

    def note(self, *, sleeping: bool = False) -> str:
        """One sentence for beside the measured numbers. `sleeping`: the stages sleep through
        their compute (`SyntheticStage`), so a rank needs a core only to wake up and talk."""
        load = f"load {self.load:.1f}" if self.load is not None else "load unknown"
        where = f"{load} on {self.cores} cores, {self.ranks} ranks"
        if not self.shared:
            return (
                f"machine quiet: {where}: a core for every rank, so the measured times are the "
                "schedule's and the hops', not waits for a core"
            )
        why = "; ".join(
            reason
            for reason, holds in (
                ("more ranks than cores", self.crowded),
                ("the load fills every core", self.busy),
            )
            if holds
        )
        if sleeping:
            effect = (
                "the stages sleep, so a rank needs a core only to wake up, send and receive; "
                "those waits still lengthen its actions and add to the measured bubble"
            )
        else:
            effect = (
                "the measured bubble includes waiting for a core, which the simulation does "
                "not model"
            )
        head = "machine busy" if self.busy else "ranks share cores"
        return f"{head}: {where} ({why}): {effect}"


def machine_load(ranks: int, *, load: float | None = None, cores: int | None = None) -> MachineLoad:
    """Read the machine now (the last minute's load, this process's cores) for a run of
    `ranks` processes; `load` and `cores` replace the readings (tests, or another machine's)."""
    if ranks < 1:
        raise ValueError(f"ranks={ranks}: a run has at least one process")
    return MachineLoad(
        load=_load_average() if load is None else float(load),
        cores=usable_cores() if cores is None else int(cores),
        ranks=ranks,
    )
