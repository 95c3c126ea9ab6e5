"""Every stored notebook is in the form JupyterLab writes, so opening it does not mark it
modified (tests/test_course_browser.py opens each one to see; this reads the files, quickly):
the kernelspec names the installed kernel as it calls itself, and each code cell's
``collapsed`` equals its ``jupyter.outputs_hidden``. `tools/lab_format.py` makes it so.
"""

from __future__ import annotations

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from notebook_cells import BOOKS, read_notebook


@pytest.mark.parametrize("book", BOOKS)
def test_the_kernelspec_is_the_installed_kernels(book: str) -> None:
    spec = read_notebook(book)["metadata"]["kernelspec"]
    installed = KernelSpecManager().get_kernel_spec(spec["name"])
    assert spec["display_name"] == installed.display_name, "run tools/lab_format.py"
    assert spec["language"] == installed.language


@pytest.mark.parametrize("book", BOOKS)
def test_collapsed_follows_outputs_hidden(book: str) -> None:
    for cell in read_notebook(book)["cells"]:
        if cell["cell_type"] == "code":
            hidden = cell["metadata"].get("jupyter", {}).get("outputs_hidden", False)
            assert cell["metadata"].get("collapsed", False) == hidden, (cell["id"], hidden)
