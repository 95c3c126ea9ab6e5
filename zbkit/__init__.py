"""zbkit: see, simulate and run zero-bubble pipeline parallelism in PyTorch.

The names users type most are re-exported here and imported lazily, so that
``import zbkit`` stays cheap and a notebook that only draws schedules never
imports torch.distributed machinery.
"""

from __future__ import annotations

import importlib
from typing import Any

from zbkit._public import public_dir

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "Cluster": "zbkit.launch",
    "LaunchError": "zbkit.launch",
    "analyze": "zbkit.splitgrad",
    "build_schedule": "zbkit.schedules",
    "debug": "zbkit.debug",
    "doctor": "zbkit.doctor",
    "launch": "zbkit.launch",
    "simulate": "zbkit.schedules",
    "viz": "zbkit.viz",
    "widgets": "zbkit.widgets",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'zbkit' has no attribute {name!r}")
    module = importlib.import_module(_EXPORTS[name])
    value = module if module.__name__ == f"zbkit.{name}" else getattr(module, name)
    globals()[name] = value  # cache: the next access skips __getattr__
    return value


def __dir__() -> list[str]:  # dir() and tab completion: __all__ and the loaded submodules
    return public_dir(globals(), [*__all__, "__version__"])


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext zbkit`: registers %zb_start, %%zb, %zb_stop and %zb_status."""
    # lazily: at the top, every `import zbkit` would load IPython and the launcher
    from zbkit.launch.magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    # lazily, as in load_ipython_extension: `import zbkit` stays free of IPython
    from zbkit.launch.magics import unload_ipython_extension as unload

    unload(ipython)
