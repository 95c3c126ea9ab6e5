"""Sphinx configuration of zbkit's documentation site: ``make docs`` writes docs/_build/html.

Why Sphinx with MyST-NB (and not Jupyter Book): docs/index.md, "How this site is built".
The notebooks are rendered as stored, never executed (``nb_execution_mode = "off"``).

The tutorials are ``docs/tutorials``, a link to ``../notebooks``: Sphinx reads only files under
its source folder, and the notebooks stay where learners open them.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

from sphinx.ext.napoleon import Config
from sphinx.ext.napoleon.docstring import GoogleDocstring
from sphinx.util.docstrings import prepare_docstring
from sphinx.util.inspect import stringify_signature

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's zbkit, whether or not it is installed

import zbkit  # noqa: E402

project = "zbkit"
author = "the zbkit authors"
copyright = "the zbkit authors, Apache-2.0"
release = version = zbkit.__version__

extensions = ["myst_nb", "sphinx.ext.autodoc"]
exclude_patterns = ["_build", "**/.ipynb_checkpoints"]
root_doc = "index"

# the tutorials, as stored: never executed here (see the module docstring)
nb_execution_mode = "off"
myst_heading_anchors = 3  # `[text](#a-heading)` links, as on GitHub

# `name` in a docstring (Markdown's code span, which zbkit's docstrings use) shows as code
default_role = "literal"
autodoc_member_order = "bysource"
autodoc_typehints_format = "short"
# a torch module's `forward` without a docstring of its own is not documented with torch's
autodoc_inherit_docstrings = False

# -n checks every reference. The standard library and the libraries zbkit builds on have no
# pages here (intersphinx would fetch their inventories over the network, and the build must
# work offline), so references into them are not checked; references to zbkit's names are.
_OUTSIDE = "collections|datetime|os|pathlib|torch|matplotlib|ipywidgets|IPython|graphviz|numpy"
nitpick_ignore_regex = [(r"py:.*", rf"({_OUTSIDE})(\..*)?")]
# zb-auto's candidate record (a name, a reason, a builder): `explain_auto` prints its name and
# reason; the builder's types are the search's internals, documented in the source only
nitpick_ignore = [("py:class", "zbkit.schedules.search.candidates.Candidate")]

html_theme = "furo"
html_title = f"zbkit {release}"

_GOOGLE = Config(napoleon_numpy_docstring=False)


def google_sections(app, what, name, obj, options, lines):
    """A function's or a class's `Args:` section as a field list (napoleon's Google style).

    Only there: napoleon reads a property's first line as "type: text", and zbkit's say
    "Per rank: what ..." (a sentence, not a type).
    """
    if what in ("function", "method", "class", "exception"):
        lines[:] = GoogleDocstring(lines, _GOOGLE, app, what, name, obj, options).lines()


def no_type_docstring(app, what, name, obj, options, lines):
    """A table (`KINDS`, a dict) shows the text its page gives it, not `dict`'s docstring."""
    doc = type(obj).__doc__
    if (
        what == "data"
        and doc
        and [x for x in lines if x] == [x for x in prepare_docstring(doc) if x]
    ):
        lines.clear()


def own_signature(app, what, name, obj, options, signature, return_annotation):
    """A class's signature as Python's `inspect.signature` gives it: its own ``__init__``.

    autodoc prefers any ``__new__`` in the class's bases, so a widget (an ipywidgets
    ``VBox``) or an IPython ``Magics`` would show traitlets' ``(*args, **kwargs)``.
    """
    if what == "class" and signature is not None and "*args: t.Any" in signature:
        return stringify_signature(inspect.signature(obj)), return_annotation
    if signature is not None and "<factory>" in signature:  # a dataclass field's default
        return signature.replace("<factory>", "..."), return_annotation
    return None


def readme_sections_as_pages(app, relative_path, parent_docname, content):
    """A README section included as a page (torch-users.md, examples.md): its `## Title` is
    the page's title, so every heading outside a code block goes one level up."""
    if Path(relative_path).name != "README.md":
        return
    lines, fence = content[0].splitlines(keepends=True), ""
    for i, line in enumerate(lines):
        if re.match(r"(```|~~~)", line):  # a code block opens or closes (its lines stay)
            fence = "" if fence and line.startswith(fence) else fence or line[:3]
        elif not fence and line.startswith("##"):
            lines[i] = line[1:]
    content[0] = "".join(lines)


def setup(app):
    app.connect("include-read", readme_sections_as_pages)
    app.connect("autodoc-process-docstring", google_sections)
    app.connect("autodoc-process-docstring", no_type_docstring)
    app.connect("autodoc-process-signature", own_signature)
