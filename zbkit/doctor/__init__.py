"""`zbkit.doctor.check(stages, schedule, ...)`: what will go wrong, said before the run.

Each finding comes from the real objects: one microbatch traced through the stages and its
autograd graph walked (compiled regions, reentrant checkpoints; torch's own split run on it),
the modules (DDP wrappers, parameters two stages of a rank share), and the schedule's own
facts (its actions, its stage-to-rank map, the microbatches it takes). A correct setup gets
no finding::

    report = zbkit.doctor.check(stages, schedule, inputs=x, target=y, loss_fn=loss_fn)
    print(report)          # or show it in a notebook; report.ok: nothing found

`zbkit doctor module:function` runs it from the shell. See docs/architecture.md.
"""

from zbkit._public import public_dir
from zbkit.doctor._doctor import check
from zbkit.doctor._setup import RUNTIMES
from zbkit.doctor.findings import TRAPS, Finding, Report

__all__ = ["RUNTIMES", "TRAPS", "Finding", "Report", "check"]


def __dir__() -> list[str]:  # dir() and tab completion: __all__ and the loaded submodules
    return public_dir(globals(), __all__)
