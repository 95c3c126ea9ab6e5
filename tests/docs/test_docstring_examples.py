"""Every ``Example::`` block in a public docstring runs, and its asserts hold: the docs site
and ``help()`` show these examples, so they must not go stale."""

from __future__ import annotations

import importlib
import inspect
import re
import textwrap

import pytest
from public_modules import public_modules, public_names


def _examples() -> dict[str, str]:
    found = {}
    for module in public_modules():
        mod = importlib.import_module(module)
        for name in public_names(module):
            obj = getattr(mod, name)
            doc = inspect.getdoc(obj) if callable(obj) else None
            block = re.search(r"^( *)Example::\n\n((?:\1 +.*\n|\n)+)", (doc or "") + "\n", re.M)
            if block and f"{obj.__module__}.{obj.__qualname__}" not in found:
                found[f"{obj.__module__}.{obj.__qualname__}"] = textwrap.dedent(block.group(2))
    return found


EXAMPLES = _examples()


def test_the_key_entries_have_examples() -> None:
    names = {key.rsplit(".", 1)[1] for key in EXAMPLES}
    assert {"LocalPipeline", "analyze", "Costs"} <= names, sorted(names)


@pytest.mark.parametrize("key", sorted(EXAMPLES))
def test_example_runs(key: str) -> None:
    exec(compile(EXAMPLES[key], f"<example of {key}>", "exec"), {})
