"""The ``%%solution`` cell magic: a worked solution that runs like any cell but shows its
output folded, behind a click, after Run All too.

JupyterLab folds a cell's output only until the cell runs again (``outputs_hidden`` is
reset on execution), so a learner who runs every cell would see each solution's verdict
under the exercise. The magic runs the cell's body, captures what it prints, displays and
draws, and shows all of it inside one closed ``<details>`` element instead.
``%load_ext zbkit.exercises`` registers it.
"""

from __future__ import annotations

import base64
import html
from typing import Any

SUMMARY = "Worked solution's output (click to show)"

_STYLE = "margin:0.3em 0;padding:0.2em 0.6em;border:1px solid #c8c8c8;border-radius:4px"


def _rich(data: dict[str, Any]) -> str:
    """One captured display as HTML: its own HTML, a PNG as an image, else its text."""
    if "text/html" in data:
        return str(data["text/html"])
    if "image/png" in data:
        png = data["image/png"]
        if isinstance(png, bytes):
            png = base64.b64encode(png).decode()
        return f'<img src="data:image/png;base64,{png}" style="max-width:100%">'
    if "image/svg+xml" in data:
        return str(data["image/svg+xml"])
    return f"<pre>{html.escape(str(data.get('text/plain', '')))}</pre>"


def folded(stdout: str, stderr: str, displays: list[dict[str, Any]]) -> dict[str, str]:
    """The display bundle of a folded solution: closed ``<details>`` HTML holding the
    printed text and every rich output in order, and the same as plain text."""
    parts = [f"<pre>{html.escape(text)}</pre>" for text in (stdout, stderr) if text]
    parts += [_rich(data) for data in displays]
    body = "\n".join(parts) or "<pre>(no output)</pre>"
    page = f'<details style="{_STYLE}"><summary>{SUMMARY}</summary>\n{body}\n</details>'
    plain = [text.rstrip("\n") for text in (stdout, stderr) if text]
    plain += [str(data.get("text/plain", "")) for data in displays]
    return {"text/html": page, "text/plain": "\n".join([SUMMARY, *plain])}


def solution(line: str, cell: str) -> None:
    """Run `cell` in the notebook's namespace and show its output folded (see the module)."""
    from IPython import get_ipython  # IPython only inside a kernel: the package stays light
    from IPython.display import display
    from IPython.utils.capture import capture_output  # the same reason

    shell = get_ipython()
    if shell is None:
        raise RuntimeError("%%solution runs in an IPython kernel (a Jupyter notebook)")
    if line.strip():
        raise ValueError(f"%%solution takes no arguments, got {line.strip()!r}")
    with capture_output(stdout=True, stderr=True, display=True) as cap:
        result = shell.run_cell(cell, store_history=False)
    display(folded(cap.stdout, cap.stderr, [out.data for out in cap.outputs]), raw=True)
    result.raise_error()  # a solution that fails fails its cell: nbval sees it


def load_ipython_extension(shell: Any) -> None:
    """``%load_ext zbkit.exercises``: register the ``%%solution`` cell magic."""
    shell.register_magic_function(solution, magic_kind="cell", magic_name="solution")
