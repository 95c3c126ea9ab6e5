"""Words of prose per notebook (its markdown cells), now and at an earlier commit: the measure
issue 36 sets a lesson against ("at most about 1,800 words of prose").

    .venv/bin/python tools/prose_words.py              # the working tree
    .venv/bin/python tools/prose_words.py 4d195a8      # the working tree beside that commit

A word (`WORD`) is a run of letters, digits and ``'.-_`` starting with a letter or digit, so
`zb-h1` and `1.85` are one word each; `tests/test_notebooks_course_form.py` counts with it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
WORD = re.compile(r"[A-Za-z0-9][\w'.-]*")


def prose_words(nb: dict) -> int:
    """How many words the notebook's markdown cells hold."""
    cells = [c for c in nb["cells"] if c["cell_type"] == "markdown"]
    return sum(len(WORD.findall("".join(c["source"]))) for c in cells)


def at_commit(rev: str, path: Path) -> dict | None:
    """The notebook `path` as commit `rev` stored it, or None where it had none."""
    name = path.relative_to(NOTEBOOKS.parent).as_posix()
    shown = subprocess.run(
        ["git", "show", f"{rev}:{name}"], capture_output=True, cwd=NOTEBOOKS.parent
    )
    return json.loads(shown.stdout) if shown.returncode == 0 else None


def main(args: list[str]) -> int:
    if len(args) > 1:
        print("usage: python tools/prose_words.py [COMMIT]", file=sys.stderr)
        return 2
    rev = args[0] if args else None
    known = ["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"]
    if rev and subprocess.run(known, capture_output=True, cwd=NOTEBOOKS.parent).returncode:
        print(
            f"no commit named {rev!r} in this repository (try `git log --oneline`)", file=sys.stderr
        )
        return 2
    print(f"{'notebook':<32}" + (f"{rev:>10}" if rev else "") + f"{'now':>8}")
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        row = f"{path.stem:<32}"
        if rev:
            old = at_commit(rev, path)
            row += f"{'-' if old is None else prose_words(old):>10}"
        print(row + f"{prose_words(json.loads(path.read_text())):>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
