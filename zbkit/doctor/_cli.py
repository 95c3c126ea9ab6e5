"""`zbkit doctor module:function`: the doctor's report on a setup that a function of yours builds.

The function takes no arguments and returns `zbkit.doctor.check`'s keyword arguments as a
dict (at least "stages" and "schedule"), or a `Report` it made itself::

    # my_setup.py
    def pipeline():
        stages = [Embed(), Blocks(), Head()]
        schedule = build_schedule("zb-h1", pp=3, microbatches=6)
        return dict(stages=stages, schedule=schedule, inputs=x, target=y, loss_fn=loss_fn)

    zbkit doctor my_setup:pipeline            # importable from here: cwd is on the path,
    zbkit doctor pkg.my_setup:pipeline        #   as with `python -m`
    zbkit doctor path/to/my_setup.py:pipeline # a file: its folder is on the path, as with
                                              #   `python path/to/my_setup.py`

Exit status: 0 no findings, 1 findings (the report says which traps and their fixes), 2 the
setup could not be read or checked (stderr says what was wrong and what to do).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import inspect
import json
import os
import reprlib
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import zbkit.doctor

RETURNS = (
    "a dict of zbkit.doctor.check's keyword arguments (at least 'stages' and 'schedule'), "
    "or a zbkit.doctor.Report"
)


class BadSetup(Exception):
    """The setup could not be read or checked; the message says what to do (exit status 2)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print the findings as a JSON list of their fields"
    )
    parser.add_argument(
        "target",
        metavar="module:function",
        help="package.module:function (importable from the current directory) or "
        f"path/to/file.py:function; the function takes no arguments and returns {RETURNS}",
    )


def main(args: argparse.Namespace) -> int:
    try:
        report = _report(args.target)
    except BadSetup as err:
        print(f"zbkit doctor: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([dataclasses.asdict(f) for f in report], indent=2))
    else:
        print(report)
    return 0 if report.ok else 1


def _report(target: str) -> zbkit.doctor.Report:
    where, sep, name = target.rpartition(":")  # rpartition: a Windows path keeps its "C:"
    if not sep or not where or not name:
        raise BadSetup(
            f"{target!r} is not module:function: give the function after a colon, as in "
            "my_setup:pipeline or path/to/my_setup.py:pipeline"
        )
    fn = _function(_module(where), target, name)
    try:
        value = fn()
    except Exception as exc:  # the user's code: say where it failed, not ours
        raise BadSetup(f"{target}() raised {_raised(exc)}") from exc
    return _checked(value, target)


def _module(where: str) -> ModuleType:
    """The module named `where`, or the file at `where`, imported."""
    if where.endswith(".py") or "/" in where or os.sep in where:
        return _file(Path(where))
    if not all(part.isidentifier() for part in where.split(".")):
        raise BadSetup(
            f"{where!r} is neither a module name (package.module) nor a path to a .py file"
        )
    here = os.getcwd()
    if here not in sys.path:  # as `python -m` does: modules next to you are importable
        sys.path.insert(0, here)
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (where == exc.name or where.startswith(exc.name + ".")):
            raise BadSetup(
                f"no module named {exc.name!r} importable from {here}: run zbkit doctor in the "
                "folder that holds it, or give its path, path/to/file.py:function"
            ) from exc
        raise BadSetup(f"importing {where} raised {_raised(exc)}") from exc
    except Exception as exc:  # the user's module ran and failed
        raise BadSetup(f"importing {where} raised {_raised(exc)}") from exc


def _file(path: Path) -> ModuleType:
    if path.suffix != ".py":
        raise BadSetup(f"{path} is not a .py file: give path/to/file.py:function")
    if not path.is_file():
        raise BadSetup(f"no file {path} (looked from {os.getcwd()})")
    folder = str(path.resolve().parent)
    if folder not in sys.path:  # as `python path/to/file.py` does: its siblings import
        sys.path.insert(0, folder)
    known = sys.modules.get(path.stem)  # a file named json.py must not replace json
    mine = known is None or getattr(known, "__file__", None) == str(path.resolve())
    spec = importlib.util.spec_from_file_location(
        path.stem if mine else f"_doctor_{path.stem}", path
    )
    assert spec is not None and spec.loader is not None  # a .py file always has both
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import would: dataclasses and pickle look here
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[spec.name]
        raise BadSetup(f"importing {path} raised {_raised(exc)}") from exc
    return module


def _function(module: ModuleType, target: str, name: str) -> Callable[[], Any]:
    fn = getattr(module, name, None)
    if fn is None:
        own = sorted(
            n for n, v in vars(module).items()
            if inspect.isfunction(v) and v.__module__ == module.__name__ and not n.startswith("_")
        )  # fmt: skip
        have = f"its functions: {', '.join(own)}" if own else "it defines no function"
        raise BadSetup(f"{module.__name__} has no function {name!r} ({have})")
    if not callable(fn):
        raise BadSetup(f"{target} is {_shown(fn)}, not a function that returns {RETURNS}")
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: calling it will say
        params = []  # type: ignore[assignment]
    needed = [p.name for p in params if p.default is p.empty
              and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]  # fmt: skip
    if needed:
        raise BadSetup(
            f"{target} takes arguments ({', '.join(needed)}): zbkit doctor calls it with none; "
            f"give it defaults, or a function without arguments that returns {RETURNS}"
        )
    return fn


def _checked(value: Any, target: str) -> zbkit.doctor.Report:
    """The report: the one `value` is, or `check(**value)`."""
    if isinstance(value, zbkit.doctor.Report):
        return value
    if not isinstance(value, Mapping):
        raise BadSetup(f"{target}() returned {_shown(value)}; it must return {RETURNS}")
    accepted = list(inspect.signature(zbkit.doctor.check).parameters)
    missing = [k for k in ("stages", "schedule") if k not in value]
    unknown = [repr(k) for k in value if k not in accepted]
    if missing or unknown:
        wrong = [f"no {' or '.join(map(repr, missing))}"] if missing else []
        wrong += [f"unknown key(s) {', '.join(unknown)}"] if unknown else []
        raise BadSetup(
            f"{target}() returned a dict with {'; '.join(wrong)}: check takes "
            f"{', '.join(accepted)} (stages and schedule are needed)"
        )
    try:
        return zbkit.doctor.check(**value)
    except (TypeError, ValueError) as exc:  # check's refusals: they name the argument
        raise BadSetup(f"check refused what {target}() returned: {exc}") from exc
    except Exception as exc:  # tracing ran the user's modules; show the whole traceback
        traceback.print_exc()
        raise BadSetup(
            f"check raised {_raised(exc)}\n(the traceback above; if the setup's own step "
            "runs, this is a doctor bug: please report it with that traceback)"
        ) from exc


def _shown(value: Any) -> str:
    if value is None:
        return "None"
    kind = type(value).__name__
    return f"{'an' if kind[0] in 'aeiouAEIOU' else 'a'} {kind}: {reprlib.repr(value)}"


def _raised(exc: BaseException) -> str:
    """'ValueError: boom (at file.py, line 3, in setup)': the traceback's last line and place."""
    last = traceback.format_exception_only(exc)[-1].strip()
    if isinstance(exc, SyntaxError):
        return f"{last} (at {exc.filename}, line {exc.lineno})"
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return last
    return f"{last} (at {frames[-1].filename}, line {frames[-1].lineno}, in {frames[-1].name})"
