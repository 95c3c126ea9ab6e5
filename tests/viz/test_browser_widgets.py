"""Every drawing and widget, rendered by a real JupyterLab in headless Chromium.

Starts JupyterLab on 127.0.0.1 with a token, opens a fresh copy of `browser_widgets.ipynb`,
runs all cells, and checks in the DOM that each widget rendered, that the SVG and PNG outputs
are there, and that clicking the stepper and moving a slider change what is shown. Screenshots
(PNG) go to `screenshots/browser_widgets/` at the repository root; the test prints where.

Needs Debian's `chromium` (`apt-get install -y chromium`; `make` installs it) and Playwright
for Python (dev extras). Never `playwright install`: it downloads a browser, which fails here.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from chromium import chromium, require_chromium
from lab_server import JS_DONE, JS_READY, TOKEN, lab

pytestmark = pytest.mark.browser

HERE = Path(__file__).parent
REPO = HERE.parent.parent
SHOTS = REPO / "screenshots" / "browser_widgets"
WIDGETS = ("zb-stepper", "zb-group-explorer", "zb-schedule-explorer", "zb-run-viewer")


def test_every_drawing_and_widget_renders_and_responds(tmp_path):
    require_chromium()
    shutil.copy(HERE / "browser_widgets.ipynb", tmp_path / "nb.ipynb")  # autosave hits a copy
    SHOTS.mkdir(parents=True, exist_ok=True)
    with lab(tmp_path) as port:
        # tall: each widget fits whole
        with chromium(tmp_path / "chromium-profile", viewport={"width": 1400, "height": 2200}) as b:
            _drive(b.new_page(), port)
    print(f"\nscreenshots in {SHOTS}")


# Bounds that hold on a loaded 2-core machine (issue 15: the first page load once took over
# 30 s there): JupyterLab's first load and a run-all of the notebook get minutes, each step
# of the widgets a minute; a bound that is exceeded says which step it was.
_LOAD_MS, _RUN_MS, _STEP_MS = 180_000, 240_000, 60_000


def _within(what: str, ms: int, wait) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        wait()
    except PlaywrightTimeout as err:
        raise AssertionError(f"{what} took over {ms / 1000:.0f} s (a loaded machine?)") from err


def _drive(page, port: int) -> None:
    page.set_default_timeout(_STEP_MS)
    url = f"http://127.0.0.1:{port}/lab/tree/nb.ipynb?token={TOKEN}"
    _within("JupyterLab's first page load", _LOAD_MS, lambda: page.goto(url, timeout=_LOAD_MS))
    _within(
        "the notebook's kernel start",
        _LOAD_MS,
        lambda: page.wait_for_function(JS_READY, timeout=_LOAD_MS),
    )
    page.evaluate("() => window.jupyterapp.commands.execute('runmenu:run-all')")
    _within(
        "running every cell",
        _RUN_MS,
        lambda: page.wait_for_function(JS_DONE, timeout=_RUN_MS, polling=500),
    )
    for cls in WIDGETS:
        page.locator(f".{cls}").first.wait_for(state="visible")
    page.screenshot(path=str(SHOTS / "01-after-run-all.png"))

    text = page.inner_text(".jp-NotebookPanel")
    assert "Error displaying widget" not in text and "Loading widget" not in text
    assert "Traceback" not in text  # no cell raised
    stderr = page.locator('[data-mime-type="application/vnd.jupyter.stderr"]')
    assert stderr.count() == 0, stderr.all_inner_texts()
    # draw_graph's SVG (JupyterLab shows SVG as an <img> with a data URL) and both figures
    assert page.locator('img[src^="data:image/svg+xml"]').count() >= 2  # cell + explorer
    assert page.locator('.jp-OutputArea-output img[src^="data:image/png"]').count() >= 2
    for cls in ("zb-schedule-explorer", "zb-run-viewer"):  # Image widgets: PNG blobs
        img = page.locator(f".{cls} img").first
        assert img.evaluate("i => i.naturalWidth") > 100
    for n, cls in enumerate(WIDGETS, start=2):
        page.locator(f".{cls}").first.screenshot(path=str(SHOTS / f"0{n}-{cls}.png"))

    # the stepper: F draws the graph, then I lights up the input pass
    stepper = page.locator(".zb-stepper")
    assert stepper.locator("img").count() == 0
    stepper.locator(".zb-step-F").click()
    stepper.get_by_text("Forward done").wait_for()
    stepper.locator('img[src^="data:image/svg+xml"]').wait_for()  # the graph, drawn by F
    assert stepper.locator("img").count() == 1
    stepper.locator(".zb-step-I").click()
    stepper.get_by_text("I done").wait_for()
    assert "filled" in stepper.inner_text() and "empty" in stepper.inner_text()
    stepper.screenshot(path=str(SHOTS / "06-stepper-after-I.png"))
    # W, then W again: the button stays live and the widget says why the library refuses
    stepper.locator(".zb-step-W").click()
    stepper.get_by_text("W done").wait_for()
    assert stepper.locator(".zb-step-W").is_enabled()
    stepper.locator(".zb-step-W").click()
    stepper.get_by_text("W refused").wait_for()
    assert "already ran" in stepper.inner_text()

    # the schedule explorer: one step of the pp slider redraws with other numbers
    explorer = page.locator(".zb-schedule-explorer")
    before = explorer.locator(".zb-table").inner_text()
    src_before = explorer.locator("img").get_attribute("src")
    handle = explorer.locator(".zb-ctl-pp .noUi-handle")
    handle.focus()
    handle.press("ArrowRight")  # pp 4 -> 5
    page.wait_for_function(
        "([el, old]) => el.innerText !== old",
        arg=[explorer.locator(".zb-table").element_handle(), before],
    )
    assert "pp (ranks)" in explorer.inner_text()
    assert explorer.locator(".zb-ctl-pp .widget-readout").inner_text().strip() == "5"
    assert explorer.locator("img").get_attribute("src") != src_before
    explorer.screenshot(path=str(SHOTS / "07-schedule-explorer-pp5.png"))
    # wide tracks (a 64 px one made pp jump from 4 to 16 in one drag), labels not cut
    track = explorer.locator(".zb-ctl-pp .noUi-target").bounding_box()
    assert track is not None and track["width"] >= 150, track  # 174 px measured
    label = explorer.locator(".zb-ctl-limit .widget-label").first
    assert label.inner_text().strip() == "memory limit"
    assert label.evaluate("e => e.scrollWidth <= e.clientWidth + 1")  # nothing cut
    # a combination that cannot be built: one line in the widget, no traceback
    explorer.locator(".zb-ctl-schedule select").select_option("interleaved-1f1b")  # m=8, pp=5
    explorer.get_by_text("cannot build interleaved-1f1b").wait_for()
    shown = explorer.inner_text()
    assert "Traceback" not in shown and "multiple of pp=5" in shown
    explorer.screenshot(path=str(SHOTS / "08-schedule-explorer-cannot-build.png"))
