"""Exercises a learner can check: ``check("03.1", answer)`` says right or wrong, and why.

Every tutorial's exercises are registered here, one module per notebook (``_nb01`` ..
``_nb09``). A checker never holds a stored answer: it works the answer out with zbkit itself
(simulates the schedule, analyses the graph, reads the closed form) and compares, so the
check stays true when the library changes. In the notebooks each exercise has a check cell
(``answer = None`` until the learner fills it in) and a worked solution, hidden by default,
that ends in the same ``check``, run under the ``%%solution`` cell magic
(``%load_ext zbkit.exercises``) so that its output stays folded after Run All too.
"""

from __future__ import annotations

from zbkit._public import public_dir
from zbkit.exercises._core import EXERCISES, Exercise, Verdict, all_exercises, check, exercise
from zbkit.exercises._fold import load_ipython_extension

__all__ = [
    "EXERCISES",
    "Exercise",
    "Verdict",
    "all_exercises",
    "check",
    "exercise",
    "load_ipython_extension",
]


def __dir__() -> list[str]:  # dir() and tab completion: __all__ and the loaded submodules
    return public_dir(globals(), __all__)
