"""Every ```python block of README.md runs as written, each in a fresh process.

A block whose first line is ``# continues the previous block`` runs after the blocks before
it (a chain); every other block runs on its own, so a block using a name it does not define
fails here. Blocks that start ranks (``launch(`` or ``Cluster(``) are multiprocess tests.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
CONTINUES = "# continues the previous block"
FENCE = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)
HEADING = re.compile(r"^#{2,4} (.+)$", re.M)


def readme_chains(text: str) -> list[tuple[str, list[str]]]:
    """(the heading above its first block, the blocks) per chain, in README order."""
    chains: list[tuple[str, list[str]]] = []
    for fence in FENCE.finditer(text):
        block = fence.group(1)
        if block.startswith(CONTINUES):
            assert chains, f"README's first python block says {CONTINUES!r}: there is none before"
            chains[-1][1].append(block)
            continue
        headings = HEADING.findall(text, 0, fence.start())
        chains.append((headings[-1] if headings else "top", [block]))
    return chains


def _params() -> list:
    out = []
    for n, (heading, blocks) in enumerate(readme_chains(README.read_text())):
        code = "\n".join(blocks)
        slug = re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")
        marks = [pytest.mark.multiprocess] if ("launch(" in code or "Cluster(" in code) else []
        out.append(pytest.param(code, id=f"{n}-{slug}", marks=marks))
    return out


def test_chains_are_found():
    text = "## A\n```python\nx = 1\n```\n### B\n```python\n# continues the previous block\n" \
        "print(x)\n```\n```python\ny = 2\n```\n"  # fmt: skip
    assert readme_chains(text) == [
        ("A", ["x = 1\n", "# continues the previous block\nprint(x)\n"]),
        ("B", ["y = 2\n"]),
    ]


@pytest.mark.parametrize("code", _params())
def test_readme_block_runs(code, tmp_path):
    script = tmp_path / "readme_block.py"
    script.write_text(code)
    env = {**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    # minutes: a block that starts ranks waits for them on a busy machine
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"README block failed:\n{code}\n--- stderr:\n{done.stderr[-4000:]}"
