"""Store notebooks as JupyterLab itself would write them, so that opening one does not mark
it modified (issue 36).

JupyterLab rewrites two things of a notebook nbconvert executed: the kernelspec's display
name, to the running kernel's ("Python 3 (ipykernel)", not "Python 3"), and a cell's
``collapsed`` flag, which it keeps equal to ``jupyter.outputs_hidden``. Either change on
opening sets the document's dirty flag. Run after executing a notebook:

    .venv/bin/python tools/lab_format.py notebooks/*.ipynb
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def kernel_display_name(name: str = "python3") -> str:
    """The display name of the installed kernel `name`, as JupyterLab reads it."""
    from jupyter_client.kernelspec import KernelSpecManager  # only when run: a dev tool

    return KernelSpecManager().get_kernel_spec(name).display_name


def lab_form(nb: dict, display_name: str) -> dict:
    """`nb` with the kernelspec's display name and each cell's ``collapsed`` as JupyterLab
    sets them (a new dict; `nb` is left as it was)."""
    nb = json.loads(json.dumps(nb))
    nb["metadata"].setdefault("kernelspec", {})["display_name"] = display_name
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        if cell["metadata"].get("jupyter", {}).get("outputs_hidden"):
            cell["metadata"]["collapsed"] = True
        else:
            cell["metadata"].pop("collapsed", None)
    return nb


def main(paths: list[str]) -> int:
    if not paths:
        print("usage: python tools/lab_format.py NOTEBOOK.ipynb ...", file=sys.stderr)
        return 2
    name = kernel_display_name()
    for path in map(Path, paths):
        nb = json.loads(path.read_text())
        formed = lab_form(nb, name)
        if formed != nb:
            path.write_text(json.dumps(formed, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
            print(f"{path}: rewritten in JupyterLab's form")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
