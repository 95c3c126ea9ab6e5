"""Run torch.distributed code on several local processes from a notebook cell.

``launch`` for one-shot runs, ``Cluster`` for ranks that keep state between calls, and
the IPython magics (``%load_ext zbkit``; ``%zb_start``, ``%%zb``, ``%zb_stop``,
``%zb_status``) on top of a Cluster.

torchrun: nothing here is needed to run a zbkit script under
``torchrun --nproc-per-node N script.py`` (on one machine or several): torchrun starts
the processes and sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT, and
``zbkit.parallel``'s process-group helpers read them. ``launch`` is the notebook's
stand-in for torchrun; it sets the same variables.
"""

import inspect
import sys
import types
from typing import Any

from zbkit._public import public_dir
from zbkit.launch._errors import LaunchError
from zbkit.launch.cluster import Cluster
from zbkit.launch.launcher import launch

__all__ = ["Cluster", "LaunchError", "launch"]


class _CallableModule(types.ModuleType):
    """`zbkit.launch` is both this package and the function: importing the package makes
    Python set the attribute ``zbkit.launch`` to the package, so ``from zbkit import launch``
    can hand back the package. Calling the package therefore calls the function."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return launch(*args, **kwargs)


__signature__ = inspect.signature(launch)
sys.modules[__name__].__class__ = _CallableModule


def __dir__() -> list[str]:  # dir() and tab completion: __all__ and the loaded submodules
    return public_dir(globals(), __all__)
