"""The course as a learner meets it: every notebook opened in a real JupyterLab in headless
Chromium at 1400 x 1000, then Run All, then read off the page.

- opening a notebook does not mark it modified (its stored form is JupyterLab's own);
- after Run All no worked solution's verdict is visible until its fold is clicked open, and
  a click does show it;
- no picture is shown below 80% of its natural size (JupyterLab shrinks a PNG wider than
  its column, and a schedule's labels shrink with it);
- no cell fails.

Screenshots of every screen after Run All go to `screenshots/course/` at the repository
root. Needs Debian's `chromium` (see tests/chromium.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from chromium import chromium, require_chromium
from lab_server import JS_DONE, JS_READY, TOKEN, api, lab
from notebook_cells import BOOKS, NOTEBOOKS, read_cells

pytestmark = pytest.mark.browser

REPO = Path(__file__).parent.parent
SHOTS = REPO / "screenshots" / "course"
VIEWPORT = {"width": 1400, "height": 1000}
SMALLEST = 0.8  # the least share of its natural width a picture may be shown at

# Bounds for a loaded 2-core machine: the first page load gets minutes (issue 15), a Run All
# as long as the slowest notebook's real runs take there several times over.
_LOAD_MS, _RUN_MS = 180_000, 600_000

_JS_DIRTY = "() => window.jupyterapp.shell.currentWidget.context.model.dirty"
_JS_COUNTS = """() => window.jupyterapp.shell.currentWidget.content.widgets
  .filter(c => c.model.type === 'code' && c.model.executionCount !== null)
  .map(c => c.model.executionCount)"""
# every error a cell shows (a raised exception, or a traceback printed to stderr), with the
# cell's tags: a cell tagged `raises-exception` fails on purpose (JupyterLab runs on past it)
_JS_ERRORS = r"""() => window.jupyterapp.shell.currentWidget.content.widgets.flatMap((cell, i) => {
  if (cell.model.type !== 'code') return [];
  const meant = (cell.model.getMetadata('tags') || []).includes('raises-exception');
  const outs = cell.model.outputs;
  const all = [...Array(outs.length).keys()].map(j => outs.get(j).toJSON());
  const text = o => o.ename ? `${o.ename}: ${o.evalue}` : [].concat(o.text).join('');
  return all
    .filter(o => o.output_type === 'error' ||
                 (o.name === 'stderr' && /Traceback|Error/.test(text(o))))
    .map(o => ({cell: i, text: text(o).slice(0, 200), expected: meant}));
})"""
# every element whose own text is a solution's verdict, and whether a learner sees it
_JS_VERDICTS = r"""() => {
  const out = [];
  for (const el of document.querySelectorAll('.jp-OutputArea-output *')) {
    if (el.children.length || !/exercise \d\d\.\d+: right\./.test(el.textContent)) continue;
    const folded = !!el.closest('details:not([open])');
    out.push({text: el.textContent.slice(0, 80), shown: !folded && el.checkVisibility()});
  }
  return out;
}"""
# every shown PNG (an output's or a widget's): its shown and natural widths
_JS_PICTURES = """() => [...document.querySelectorAll('.jp-OutputArea-output img')]
  .filter(i => i.naturalWidth > 0 && i.checkVisibility() && !i.closest('details:not([open])'))
  .filter(i => /^(data:image\\/png|blob:)/.test(i.src))
  .map(i => ({shown: i.getBoundingClientRect().width, natural: i.naturalWidth,
              cell: [...document.querySelectorAll('.jp-Cell')].indexOf(i.closest('.jp-Cell'))}))"""


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One JupyterLab over copies of the notebooks (autosave hits the copies) and one page."""
    require_chromium()
    root = tmp_path_factory.mktemp("course")
    for book in BOOKS:
        shutil.copy(NOTEBOOKS / f"{book}.ipynb", root / f"{book}.ipynb")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with lab(root) as port, chromium(root / "chromium-profile", viewport=VIEWPORT) as b:
        tab = b.new_page()
        tab.port = port  # type: ignore[attr-defined]
        yield tab


def _open(page, book: str) -> None:
    url = f"http://127.0.0.1:{page.port}/lab/tree/{book}.ipynb?token={TOKEN}"
    page.goto(url, timeout=_LOAD_MS)
    page.wait_for_function(JS_READY, timeout=_LOAD_MS)


def _run_all(page) -> None:
    """Clear the stored outputs first: what the page shows after is this run's, and the wait
    ends only when every code cell has run (a cell left unrun keeps no count)."""
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs')")
    assert page.evaluate(_JS_COUNTS) == [], "clearing the outputs left execution counts"
    page.evaluate("() => window.jupyterapp.commands.execute('runmenu:run-all')")
    page.wait_for_function(JS_DONE, timeout=_RUN_MS, polling=1000)


def _screens(page, book: str) -> int:
    """Screenshots from top to bottom of the notebook's scrolling panel; how many."""
    panel = ".jp-NotebookPanel .jp-WindowedPanel-outer"
    height = page.evaluate(f"() => document.querySelector('{panel}').scrollHeight")
    step = VIEWPORT["height"] - 200  # a little overlap: no line cut in two unseen
    for n, top in enumerate(range(0, max(height, 1), step)):
        page.evaluate(f"() => document.querySelector('{panel}').scrollTo(0, {top})")
        page.wait_for_timeout(150)
        page.screenshot(path=str(SHOTS / f"{book}-{n:02d}.png"))
    return n + 1


@pytest.mark.parametrize("book", BOOKS)
def test_a_learner_runs_the_notebook(page, book: str) -> None:
    _open(page, book)
    try:
        _learner_runs(page, book)
    finally:  # the next notebook opens on a clean page, whatever failed here
        _close(page)


def _learner_runs(page, book: str) -> None:
    page.wait_for_timeout(2000)  # the kernel's info arrives: a stale kernelspec would show now
    assert page.evaluate(_JS_DIRTY) is False, f"{book} is marked modified on opening"
    _run_all(page)
    errors = page.evaluate(_JS_ERRORS)
    assert not [e for e in errors if not e["expected"]], errors
    # a cell that fails on purpose did fail, as the lesson says it does
    meant = [i for i, c in enumerate(read_cells(book)) if "raises-exception" in _tags(c)]
    assert sorted({e["cell"] for e in errors}) == meant, (meant, errors)

    verdicts = page.evaluate(_JS_VERDICTS)
    shown = [v["text"] for v in verdicts if v["shown"]]
    assert not shown, f"{book}: solution verdicts visible after Run All: {shown}"
    folds = page.locator(".jp-OutputArea-output details > summary")
    solutions = sum("solution" in _tags(c) for c in read_cells(book))
    assert len(verdicts) == folds.count() == solutions, f"{book}: one fold per worked solution"
    if solutions:  # a learner asks for the first solution: now it shows
        folds.first.click()
        assert page.evaluate(_JS_VERDICTS)[0]["shown"], f"{book}: an opened fold shows nothing"
        folds.first.click()

    small = [p for p in page.evaluate(_JS_PICTURES) if p["shown"] < SMALLEST * p["natural"]]
    assert not small, f"{book}: pictures shown below {SMALLEST:.0%} of their size: {small}"
    print(f"{book}: {_screens(page, book)} screenshots in {SHOTS}")


def _tags(cell: dict) -> list[str]:
    return cell["metadata"].get("tags", [])


def _close(page) -> None:
    """Close the notebook unsaved and stop its kernel (its ranks with it)."""
    page.evaluate("() => window.jupyterapp.shell.currentWidget.dispose()")
    for session in api(page.port, "/api/sessions"):
        api(page.port, f"/api/sessions/{session['id']}", method="DELETE")
