"""Release hygiene and the install's choices, read from the files users and their tools read:
the changelog, CONTRIBUTING's commands against the Makefile, the issue templates, the classifiers,
the index `make setup` takes torch from (against local servers standing in for the indexes),
which system packages each target asks for, and the sdist and wheel `make dist` builds.
"""

from __future__ import annotations

import functools
import http.server
import io
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
INSTALL_TORCH = ROOT / "tools" / "install_torch.py"
MAKE = shutil.which("make")
needs_make = pytest.mark.skipif(MAKE is None, reason="no make on PATH")


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):(?!=)", (ROOT / "Makefile").read_text(), re.M))


def make(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    assert MAKE is not None
    return subprocess.run(
        [MAKE, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


# --- CHANGELOG.md -------------------------------------------------------------------------------

VERSION_HEADING = re.compile(r"^## \[(?P<version>[^\]]+)\](?: - (?P<date>.+))?$", re.M)
SECTIONS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}  # Keep a Changelog's


def changelog_versions() -> list[tuple[str, str | None, str]]:
    """(version, date, body) per `## [...]` heading, in file order."""
    text = (ROOT / "CHANGELOG.md").read_text()
    heads = list(VERSION_HEADING.finditer(text))
    ends = [h.start() for h in heads[1:]] + [len(text)]
    return [
        (h["version"], h["date"], text[h.end() : end]) for h, end in zip(heads, ends, strict=True)
    ]


def test_changelog_has_pyprojects_version_on_top() -> None:
    versions = changelog_versions()
    assert versions, "CHANGELOG.md: no `## [version] - date` heading"
    released = [v for v, _, _ in versions if v != "Unreleased"]
    assert "0.1.0" in released, released
    # the newest version heading is the one pyproject (and so `zbkit --version`) carries
    assert released[0] == PROJECT["version"], (released[0], PROJECT["version"])
    assert released == sorted(released, key=Version, reverse=True), f"not newest first: {released}"
    unreleased = [i for i, (v, _, _) in enumerate(versions) if v == "Unreleased"]
    assert unreleased in ([], [0]), "at most one [Unreleased] section, and on top"


def test_changelog_sections_are_keep_a_changelogs() -> None:
    for version, date, body in changelog_versions():
        if version != "Unreleased":
            assert date is not None, f"[{version}] has no date (or 'unreleased')"
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}|unreleased", date), f"[{version}] - {date}"
        found = re.findall(r"^### (.+)$", body, re.M)
        assert found, f"[{version}]: no ### Added / Changed / ... section"
        assert set(found) <= SECTIONS, f"[{version}]: {sorted(set(found) - SECTIONS)}"
        assert len(found) == len(set(found)), f"[{version}]: a section twice: {found}"
        for section in re.split(r"^### .+$", body, flags=re.M)[1:]:
            assert re.search(r"^- ", section, re.M), f"[{version}]: an empty section"


# --- CONTRIBUTING.md ----------------------------------------------------------------------------


def test_contributing_names_only_make_targets_that_exist() -> None:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    named = set(re.findall(r"\bmake ([a-z][\w-]*)", text))
    assert {"setup", "test", "test-fast", "lint", "format", "dist"} <= named, named
    missing = named - make_targets()
    assert not missing, f"CONTRIBUTING.md names make targets the Makefile lacks: {missing}"


def test_contributing_checks_notebooks_as_make_does() -> None:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    nbval = re.search(r"^NBVAL := (.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert nbval, "Makefile: no NBVAL line"
    # the one-notebook check is `make test-notebooks`' flags on one file
    assert f"pytest -q {nbval.group(1)} notebooks/NAME.ipynb" in text
    assert "nbconvert --to notebook --execute --inplace" in text
    assert "--ExecutePreprocessor.store_widget_state=True" in text


def built(path: str) -> bool:
    """Whether `path` is a build output (git ignores it), which a fresh clone lacks."""
    done = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT, timeout=60)
    return done.returncode == 0


def test_contributing_points_at_files_that_exist() -> None:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    paths = re.findall(r"`((?:tests|notebooks|docs|tools|zbkit|\.github)/[\w./-]+)`", text)
    assert "docs/architecture.md" in links and "README.md" in links, links
    missing = [p for p in links + paths if not (ROOT / p).exists() and not built(p)]
    assert not missing, f"CONTRIBUTING.md points at missing files: {missing}"
    anchors = re.findall(r"\(README\.md#([\w-]+)\)", text)
    headings = re.findall(r"^#+ (.+)$", (ROOT / "README.md").read_text(), re.M)
    slugs = {re.sub(r"[^\w -]", "", h).strip().lower().replace(" ", "-") for h in headings}
    assert set(anchors) <= slugs, f"README has no section for {set(anchors) - slugs}"


# --- .github/ISSUE_TEMPLATE ---------------------------------------------------------------------

TEMPLATES = ROOT / ".github" / "ISSUE_TEMPLATE"


def front_matter(path: Path) -> tuple[dict, str]:
    text = path.read_text()
    match = re.match(r"---\n(.*?)\n---\n(.*)", text, re.S)
    assert match, f"{path.name}: no YAML front matter between --- lines"
    return yaml.safe_load(match.group(1)), match.group(2)


def test_issue_templates_have_front_matter() -> None:
    templates = sorted(TEMPLATES.glob("*.md"))
    assert {p.name for p in templates} >= {"bug_report.md", "feature_request.md"}, templates
    names = []
    for path in templates:
        meta, body = front_matter(path)
        assert isinstance(meta, dict), path.name
        assert isinstance(meta.get("name"), str) and meta["name"], f"{path.name}: no name"
        assert isinstance(meta.get("about"), str) and meta["about"], f"{path.name}: no about"
        assert body.strip(), f"{path.name}: empty body"
        names.append(meta["name"])
    assert len(names) == len(set(names)), names
    config = yaml.safe_load((TEMPLATES / "config.yml").read_text())
    assert isinstance(config["blank_issues_enabled"], bool), config
    for link in config.get("contact_links", []):
        assert set(link) == {"name", "url", "about"} and link["url"].startswith("https://"), link


def test_bug_report_version_commands_run() -> None:
    _, body = front_matter(TEMPLATES / "bug_report.md")
    (commands,) = re.findall(r"```bash\n(.*?)```", body, re.S)
    assert "python -m zbkit --version" in commands
    venv_bin = str(Path(sys.executable).parent)  # `python` is this interpreter, as in a venv
    env = {**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-ec", commands], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    import torch

    assert f"zbkit {PROJECT['version']}" in done.stdout, done.stdout
    assert f"torch {torch.__version__}" in done.stdout, done.stdout


# --- pyproject's metadata -----------------------------------------------------------------------


def test_classifiers_are_official_and_agree_with_pyproject() -> None:
    from trove_classifiers import classifiers, deprecated_classifiers

    given = PROJECT["classifiers"]
    unknown = [c for c in given if c not in classifiers]
    assert not unknown, f"not trove classifiers: {unknown}"
    assert not [c for c in given if c in deprecated_classifiers]
    assert given == sorted(given) and len(given) == len(set(given))
    # PEP 639: the SPDX `license` replaces licence classifiers (setuptools refuses both)
    assert not [c for c in given if c.startswith("License ::")]
    requires = SpecifierSet(PROJECT["requires-python"])
    pythons = [c.rsplit(" :: ", 1)[1] for c in given if re.fullmatch(r".* :: 3\.\d+", c)]
    assert pythons, "no Python 3.x classifier"
    assert all(Version(v) in requires for v in pythons), (pythons, requires)
    runtime = (ROOT / "binder" / "runtime.txt").read_text().strip().removeprefix("python-")
    assert runtime in pythons, f"binder runs Python {runtime}, the classifiers say {pythons}"


def test_project_urls_are_real_or_absent() -> None:
    # no hosting URL is known yet: a placeholder URL on an index page sends users nowhere
    for name, url in PROJECT.get("urls", {}).items():
        assert url.startswith("https://"), (name, url)
        assert not re.search(r"example\.|<|>|your[-_]?|USER|OWNER|TODO", url), (name, url)


def test_numpy_is_a_core_dependency() -> None:
    core = {Requirement(d).name.lower(): Requirement(d) for d in PROJECT["dependencies"]}
    assert "numpy" in core, "torch warns 'Failed to initialize NumPy' on every import without it"
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", "import torch; torch.zeros(2).numpy()"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "NumPy" not in done.stderr, done.stderr[-2000:]


def test_readme_claims_no_package_index_install() -> None:
    # the commands a reader copies: `pip install zbkit` (or 'zbkit[extra]') alone would ask a
    # package index that serves no zbkit
    text = "\n".join(
        re.findall(r"^```bash\n(.*?)^```$", (ROOT / "README.md").read_text(), re.S | re.M)
    )
    bare = [
        m[0] for m in re.finditer(r"pip install (['\"]?)zbkit(\[[\w,]+\])?\1(?=\s|$)", text, re.M)
    ]
    assert not bare, f"README installs zbkit from a package index: {bare}"
    assert re.search(r'pip install "zbkit(\[[\w,]+\])? @ git\+', text), "no git URL install"
    assert "pip install -e ." in text, "no install from a clone"


# --- which index torch comes from ---------------------------------------------------------------


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def serve(tmp_path: Path) -> Iterator:
    """serve(files) -> the URL of a loopback HTTP server holding {relative path: bytes}."""
    servers = []

    def start(files: dict[str, bytes]) -> str:
        root = tmp_path / f"site{len(servers)}"
        for rel, data in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
        handler = functools.partial(_Quiet, directory=str(root))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def closed_port_url() -> str:
    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def fake_wheel(version: str) -> tuple[str, bytes]:
    """A torch wheel of that version holding only its metadata: enough for pip's --dry-run."""
    info = f"torch-{version}.dist-info"
    wheel = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", wheel)
        z.writestr(f"{info}/RECORD", "")
    return f"torch-{version}-py3-none-any.whl", buf.getvalue()


def simple_index(*versions: str) -> dict[str, bytes]:
    """A PEP 503 index whose torch page links a fake wheel per version."""
    files, links = {}, []
    for version in versions:
        name, data = fake_wheel(version)
        files[f"torch/{name}"] = data
        links.append(f'<a href="{name.replace("+", "%2B")}">{name}</a>')
    files["torch/index.html"] = ("<html><body>" + "\n".join(links) + "</body></html>").encode()
    return files


def install_torch(*args: str, index: str | None, pip_env: dict[str, str] | None = None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    if index is not None:
        env["ZBKIT_TORCH_INDEX"] = index
    env.update(pip_env or {})
    return subprocess.run(
        [sys.executable, str(INSTALL_TORCH), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_torch_comes_from_the_cpu_index_when_it_answers(serve) -> None:
    cpu = serve(simple_index("2.13.0+cpu"))
    done = install_torch("--dry-run", "torch==2.13.0", index=cpu)
    assert done.returncode == 0, done.stderr
    said, command = done.stdout.splitlines()
    assert said == f"install_torch: torch==2.13.0 from PyTorch's wheel index {cpu}"
    assert command.endswith(f"-m pip install torch==2.13.0 --index-url {cpu}"), command


def test_torch_falls_back_to_the_default_index(serve) -> None:
    closed = closed_port_url()
    done = install_torch("--dry-run", "torch==2.13.0", index=closed)
    assert done.returncode == 0, done.stderr
    said, command = done.stdout.splitlines()
    assert said.startswith(f"install_torch: {closed} unreachable: "), said
    assert "torch==2.13.0 from pip's default index" in said, said
    assert command.endswith("-m pip install torch==2.13.0"), command  # no --index-url
    # an index that answers but lacks the pinned version is no better than none
    old = serve(simple_index("2.12.0+cpu"))
    done = install_torch("--dry-run", "torch==2.13.0", index=old)
    assert f"{old} lists no torch 2.13.0; torch==2.13.0 from pip's default index" in done.stdout
    assert "--index-url" not in done.stdout
    done = install_torch("--dry-run", "torch==2.13.0", index="")  # asked for the default
    assert "ZBKIT_TORCH_INDEX is empty; torch==2.13.0 from pip's default index" in done.stdout


def test_pip_installs_from_the_index_chosen(serve) -> None:
    # real pip runs (resolving only: --dry-run through pip's own environment variables), with
    # loopback servers as PyTorch's CPU index and as pip's default index, and no pip config
    cpu = serve(simple_index("2.13.0+cpu"))
    default = serve(simple_index("2.13.0"))
    pip_env = {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": f"{default}/"}
    pip_env |= {"PIP_DRY_RUN": "1", "PIP_NO_DEPS": "1", "PIP_IGNORE_INSTALLED": "1"}
    for index, want in [(cpu, "torch-2.13.0+cpu"), (closed_port_url(), "torch-2.13.0")]:
        done = install_torch("torch==2.13.0", index=index, pip_env=pip_env)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        (line,) = [x for x in done.stdout.splitlines() if x.startswith("Would install")]
        assert line == f"Would install {want}", done.stdout[-3000:]


@needs_make
def test_make_setup_installs_torch_through_the_index_choice(tmp_path: Path) -> None:
    done = make("-n", "setup", f"VENV={tmp_path / 'venv'}")  # a venv that does not exist yet
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    torch_line = next(i for i, x in enumerate(lines) if "tools/install_torch.py" in x)
    zbkit_line = next(i for i, x in enumerate(lines) if "pip install -e '.[dev]'" in x)
    assert torch_line < zbkit_line, "torch first: zbkit's own `torch` requirement is then met"
    assert "'torch==" in lines[torch_line], lines[torch_line]
    # minutes of installing: pip's progress is shown, not silenced
    assert not [x for x in lines if "pip install" in x and re.search(r"\s-q\b", x)], lines


# --- system packages: Graphviz for everyone, Chromium for the browser test ----------------------


@needs_make
def test_demo_and_setup_never_install_chromium() -> None:
    for target in ["demo", "setup", "lab", "test-fast"]:
        done = make("-n", target)
        assert done.returncode == 0, done.stderr
        assert "graphviz" in done.stdout, f"make {target} no longer checks for Graphviz"
        assert "chromium" not in done.stdout.lower(), f"make {target} installs Chromium"
    done = make("-n", "test")
    assert "chromium" in done.stdout, "make test runs the browser test: it needs Chromium"


@needs_make
@pytest.mark.parametrize("target, command, package", [
    ("system-deps", "dot", "graphviz"),
    ("browser-deps", "chromium", "chromium"),
])  # fmt: skip
def test_a_missing_system_package_is_named(
    tmp_path: Path, target: str, command: str, package: str
) -> None:
    # as a user who is not root, on a PATH without the command: make says what to install
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "id").write_text("#!/bin/sh\necho 1000\n")
    (fake / "id").chmod(0o755)
    done = make(target, env={**os.environ, "PATH": str(fake)})
    assert done.returncode != 0
    assert f"missing `{command}`: install {package} (" in done.stdout, done.stdout + done.stderr


# --- make dist ----------------------------------------------------------------------------------


@needs_make
def test_make_dist_builds_a_checked_sdist_and_wheel(tmp_path: Path) -> None:
    out = tmp_path / "dist"
    # -o setup: use this venv as it is (the build itself runs in an isolated environment)
    done = make("-o", "setup", "dist", f"DIST={out}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("PASSED") == 2, done.stdout[-3000:]  # twine check --strict, each
    version = PROJECT["version"]
    (wheel,) = out.glob(f"zbkit-{version}-py3-none-any.whl")
    (sdist,) = out.glob(f"zbkit-{version}.tar.gz")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(f"zbkit-{version}.dist-info/METADATA").decode()
        entry_points = z.read(f"zbkit-{version}.dist-info/entry_points.txt").decode()
    assert {"zbkit/py.typed", "zbkit/cli.py", "zbkit/debug_demo.py"} <= names
    assert not [n for n in names if n.startswith(("tests/", "notebooks/"))]
    assert "zbkit = zbkit.cli:main" in entry_points
    fields = [line.split(": ", 1) for line in meta.split("\n\n", 1)[0].splitlines()]
    assert [v for k, v in fields if k == "Classifier"] == PROJECT["classifiers"]
    required = [Requirement(v) for k, v in fields if k == "Requires-Dist"]
    core = {r.name for r in required if r.marker is None}
    assert core == {Requirement(d).name for d in PROJECT["dependencies"]}, core
    assert ("License-Expression", "Apache-2.0") in [tuple(f) for f in fields]
    assert ("Description-Content-Type", "text/markdown") in [tuple(f) for f in fields]
    with tarfile.open(sdist) as t:
        inside = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    # the source release: what `make test` needs besides the package (MANIFEST.in)
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    lacking = sorted(set(tracked) - inside - {".gitignore"})
    assert not lacking, f"the sdist lacks tracked files: {lacking[:20]}"
    assert not [n for n in inside if n.endswith(".pyc") or n.startswith("docs/_build/")]
