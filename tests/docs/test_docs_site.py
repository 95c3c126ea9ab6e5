"""The docs site builds from this checkout with every warning an error, and holds what it
promises: an API page for every public module with each public name on it, and the tutorials
with the pictures stored in the notebooks.

The build runs the command of the Makefile's `docs` recipe, with its SPHINXOPTS, into a tmp
folder instead of docs/_build/html: once for this module (about 30 s on 2 cores). The
browser test opens a tutorial page in Debian's Chromium, started as
tests/viz/test_browser_widgets.py starts it (never `playwright install`).
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from chromium import chromium, require_chromium
from public_modules import public_modules, public_names

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def make_docs_command(out: Path) -> list[str]:
    """The `docs` recipe's sphinx command from the Makefile, writing into `out`."""
    makefile = (REPO / "Makefile").read_text()
    opts = re.search(r"^SPHINXOPTS\s*:?=(.*)$", makefile, re.M)
    recipe = re.search(r"^docs:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert opts and recipe, "the Makefile has no SPHINXOPTS or no `docs:` recipe"
    (line,) = [x for x in recipe.group(1).splitlines() if "-m sphinx" in x]
    line = line.replace("$(PY)", sys.executable).replace("$(SPHINXOPTS)", opts.group(1))
    *cmd, source, target = shlex.split(line)
    assert (source, target) == ("docs", "docs/_build/html"), line
    return [*cmd, source, str(out)]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "html"
    done = subprocess.run(
        make_docs_command(out), cwd=REPO, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, f"make docs failed:\n{done.stdout[-3000:]}{done.stderr[-6000:]}"
    return out


def test_make_docs_fails_on_warnings_and_checks_references() -> None:
    cmd = make_docs_command(Path("out"))
    assert cmd[1:3] == ["-m", "sphinx"], cmd
    # -W: a warning fails the build; -n: a reference to a missing zbkit name is one
    assert {"-W", "-n", "--keep-going"} <= set(cmd), cmd


# ---- the API reference ----------------------------------------------------------------------
class _Anchors(HTMLParser):
    """The ids of a page and the #fragments it links to."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(str(a["id"]))
        if tag == "a" and "#" in (a.get("href") or ""):
            self.links.add(str(a["href"]).split("#", 1)[1])


def _anchors(page: Path) -> _Anchors:
    parser = _Anchors()
    parser.feed(page.read_text())
    return parser


def test_every_public_module_has_an_api_page_with_each_public_name(site: Path) -> None:
    modules = public_modules()
    assert {"zbkit.splitgrad", "zbkit.schedules", "zbkit.pipeline", "zbkit.viz"} <= set(modules)
    pages = {m: site / "api" / f"{m}.html" for m in modules}
    missing = [m for m, page in pages.items() if not page.exists()]
    assert not missing, f"no API page for {missing}: add docs/api/<module>.md"
    documented = set().union(*(_anchors(p).ids for p in (site / "api").glob("*.html")))
    undocumented = []
    for module, page in pages.items():
        anchors = _anchors(page)
        for name in public_names(module):
            here = f"{module}.{name}" in anchors.ids
            # or a link to where it is documented: a re-export (`zbkit.analyze`), a module
            linked = any(
                target in documented and target.rsplit(".", 1)[-1] == name.rsplit(".", 1)[-1]
                for target in anchors.links
            )
            if not (here or linked):
                undocumented.append(f"{module}.{name}")
    assert not undocumented, f"public names without an entry on their API page: {undocumented}"


def test_api_pages_show_the_docstrings(site: Path) -> None:
    page = (site / "api" / "zbkit.pipeline.html").read_text()
    text = re.sub(r"<[^>]+>", "", page)
    # LocalPipeline's example, as a code block; ScheduleRunner's `Args:` as parameter fields
    assert "losses = pipe.step(x, target=y)" in text
    assert re.search(r"Parameters:.*\bbarrier\b", text, re.S), "Args: not read as fields"


# ---- the tutorials --------------------------------------------------------------------------
def _stored_pictures(notebook: Path) -> tuple[list[bytes], list[str]]:
    """The pictures a notebook's outputs hold, and the model ids of its stored widget views."""
    pictures, widgets = [], []
    for cell in json.loads(notebook.read_text())["cells"]:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if WIDGET_VIEW in data:  # MyST-NB shows the widget, from the stored widget state
                widgets.append(data[WIDGET_VIEW]["model_id"])
            elif "image/png" in data:
                pictures.append(base64.b64decode(data["image/png"]))
            elif "image/svg+xml" in data:
                svg = data["image/svg+xml"]
                pictures.append(("".join(svg) if isinstance(svg, list) else svg).encode())
    return pictures, widgets


def _images(page: Path) -> list[Path]:
    srcs = re.findall(r"<img\b[^>]*\bsrc=\"([^\"]+)\"", page.read_text())
    return [(page.parent / src).resolve() for src in srcs if "://" not in src]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_tutorial_page_holds_its_stored_pictures(site: Path, notebook: Path) -> None:
    page = site / "tutorials" / f"{notebook.stem}.html"
    assert page.exists(), f"{notebook.name} is not in the site: add it to docs/index.md"
    images = _images(page)
    assert all(p.is_file() for p in images), [str(p) for p in images if not p.is_file()]
    shown = {p.read_bytes().strip() for p in images}
    pictures, widgets = _stored_pictures(notebook)
    lost = [i for i, picture in enumerate(pictures) if picture.strip() not in shown]
    assert not lost, f"{notebook.name}: stored pictures {lost} (of {len(pictures)}) not shown"
    html = page.read_text()
    for model_id in widgets:
        assert model_id in html, f"{notebook.name}: widget {model_id} not embedded"
    if widgets:
        assert "application/vnd.jupyter.widget-state+json" in html


@pytest.mark.browser
def test_a_tutorial_page_shows_its_pictures_in_chromium(site: Path, tmp_path: Path) -> None:
    require_chromium()
    page_file = site / "tutorials" / "03_schedules_and_bubbles.html"
    expected = len(_images(page_file))
    assert expected >= 5, f"{page_file.name} has {expected} pictures"
    with chromium(tmp_path / "chromium-profile") as browser:
        page = browser.new_page()
        # the site's own files only: the page must not need the network (the ipywidgets
        # embed script comes from a CDN; the pictures must not)
        page.route(
            "**/*",
            lambda route: (
                route.continue_() if route.request.url.startswith("file://") else route.abort()
            ),
        )
        page.goto(page_file.as_uri(), wait_until="load", timeout=120_000)
        sizes = page.eval_on_selector_all(
            "article img", "imgs => imgs.map(i => [i.getAttribute('src'), i.naturalWidth])"
        )
    assert len(sizes) == expected, sizes
    broken = [src for src, width in sizes if not width > 0]
    assert not broken, f"pictures that did not load: {broken}"
