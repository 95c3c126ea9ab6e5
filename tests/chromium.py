"""Debian's Chromium driven by Playwright, as the browser tests start it (imported by
tests/viz/test_browser_widgets.py and tests/docs/test_docs_site.py).

Needs `apt-get install -y chromium` (`make test` installs it) and Playwright for Python (dev
extras). Never `playwright install`: it downloads a browser, which fails here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",  # root in a container
    "--disable-gpu",
    "--disable-dev-shm-usage",  # small /dev/shm in containers
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def require_chromium() -> None:
    """Fail (not skip) without Chromium: `make test` installs it, so its absence is a bug."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install it with `apt-get install -y chromium`")


@contextmanager
def chromium(profile: Path, **options: Any) -> Iterator[Any]:
    """A headless Chromium context with its profile in `profile`, closed on the way out;
    `options` go to Playwright's `launch_persistent_context` (a viewport, say)."""
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS, **options
        )
        try:
            yield browser
        finally:
            browser.close()
