"""A real JupyterLab server for the browser tests (tests/viz/test_browser_widgets.py and
tests/test_course_browser.py): on 127.0.0.1 with a token, its config, settings and kernels'
state in a fresh folder, every cell rendered (no virtual scrolling), `window.jupyterapp`
exposed so a test can run commands and read the notebook's model.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TOKEN = "zbkit-browser-test"

# JavaScript run in the page: the notebook panel, its kernel, its cells.
JS_READY = """() => {
  const p = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = p && p.sessionContext && p.sessionContext.session && p.sessionContext.session.kernel;
  return !!(k && k.status === 'idle' && p.content && p.content.widgets.length > 0);
}"""
JS_DONE = """() => {
  const p = window.jupyterapp.shell.currentWidget;
  const cells = p.content.widgets.filter(c => c.model.type === 'code');
  return p.sessionContext.session.kernel.status === 'idle'
      && cells.every(c => c.model.executionCount !== null);
}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(port: int, path: str, method: str = "GET") -> object:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        method=method,
        headers={"Authorization": f"token {TOKEN}"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:  # a busy server answers late
        body = resp.read()
    return json.loads(body) if body else None


def _settings(home: Path) -> None:
    settings = home / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    # render every cell (no virtual scrolling), so the DOM holds every output
    (settings / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    # no "get notified about Jupyter news?" toast over the outputs (and no network call)
    toast = home / "settings" / "@jupyterlab" / "apputils-extension"
    toast.mkdir(parents=True)
    (toast / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')


def start_lab(root: Path, port: int) -> subprocess.Popen:
    """JupyterLab serving `root` on 127.0.0.1:`port`, answering its API (or an error)."""
    home = root / ".jupyter-home"  # config, runtime, settings: all fresh, nothing shared
    _settings(home)
    env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        JUPYTER_DATA_DIR=str(home / "data"),
        IPYTHONDIR=str(home / "ipython"),
        OMP_NUM_THREADS="1",
    )
    cmd = [
        sys.executable, "-m", "jupyterlab",
        "--no-browser",
        "--allow-root",  # the test machine runs as root
        "--ip=127.0.0.1",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={TOKEN}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.expose_app_in_browser=True",  # window.jupyterapp: run commands by id
        f"--LabApp.user_settings_dir={home / 'settings'}",
        f"--LabApp.workspaces_dir={home / 'workspaces'}",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]  # fmt: skip
    log = open(root / "jupyter.log", "w")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    deadline = time.monotonic() + 120  # a loaded machine: JupyterLab's server starts slowly
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited: {(root / 'jupyter.log').read_text()[-2000:]}")
        try:
            api(port, "/api/status")
            return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise TimeoutError(f"jupyter lab did not answer in 120 s: {(root / 'jupyter.log').read_text()}")


@contextmanager
def lab(root: Path) -> Iterator[int]:
    """A JupyterLab serving `root`, with no kernel kept from before; yields its port and
    stops the server (and its kernels) on the way out."""
    port = free_port()
    proc = start_lab(root, port)
    try:
        for session in api(port, "/api/sessions"):  # a kept kernel would skew the run
            api(port, f"/api/sessions/{session['id']}", method="DELETE")
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
