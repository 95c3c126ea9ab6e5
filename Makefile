# Everything bootstraps from nothing: `make test` on a fresh clone creates .venv, installs torch
# first (from PyTorch's CPU wheel index when it answers, else pip's default index: a bare `torch`
# from PyPI is a multi-GB CUDA build; tools/install_torch.py says which it used), then zbkit with
# its dev extras, then Graphviz's `dot`; `make test` also needs Chromium for the browser test.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.zbkit-installed
TORCH ?= torch==2.13.0

.PHONY: setup system-deps browser-deps test test-notebooks test-fast lint format demo lab dist docs clean

setup: $(STAMP) system-deps

# Minutes on a fresh clone: pip prints what it downloads and installs (no -q).
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	@echo "== setup 1/2: $(TORCH) into $(VENV)"
	$(PY) tools/install_torch.py '$(TORCH)'
	@echo "== setup 2/2: zbkit and its [dev] extras (notebook stack, CP-SAT, test and lint tools)"
	$(PY) -m pip install -e '.[dev]'
	touch $(STAMP)

# $(call need_command,COMMAND,PACKAGE,HINT): apt-get installs PACKAGE when COMMAND is missing
# (as root), else one line says what to install.
define need_command
@if ! command -v $(1) >/dev/null 2>&1; then \
  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
    echo "installing $(2) with apt-get"; \
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2) >/dev/null; \
  else \
    echo "missing \`$(1)\`: install $(2) ($(3))"; exit 1; \
  fi; \
fi
endef

# Graphviz's `dot` renders the graph drawings: all that setup, demo and lab need.
system-deps:
	$(call need_command,dot,graphviz,apt-get install graphviz; brew install graphviz; conda install graphviz)

# Chromium drives the widget browser test (tests/viz/test_browser_widgets.py): only `make test`.
browser-deps:
	$(call need_command,chromium,chromium,apt-get install chromium: the test runs /usr/bin/chromium)

NBVAL := -p no:cacheprovider --nbval --nbval-sanitize-with notebooks/sanitize.cfg

test: setup browser-deps
	$(PY) -m pytest -q
	$(PY) -m pytest -q $(NBVAL) notebooks

test-notebooks: setup
	$(PY) -m pytest -q $(NBVAL) notebooks

test-fast: setup
	$(PY) -m pytest -q -m "not multiprocess and not browser"

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

demo: setup
	$(VENV)/bin/zbkit demo

# Jupyter refuses to start as root unless told; `make` is meant to run as root in containers.
LAB_FLAGS = $(if $(filter 0,$(shell id -u)),--allow-root)

lab: setup
	$(VENV)/bin/jupyter lab notebooks/ $(LAB_FLAGS)

# An sdist and a wheel in dist/, built in an isolated environment as a release would be, then
# their metadata checked (twine: well-formed fields, a README that renders on an index).
DIST ?= dist

dist: setup
	rm -rf $(DIST)
	$(PY) -m build --outdir $(DIST) .
	$(VENV)/bin/twine check --strict $(DIST)/*

# The docs site in docs/_build/html (Sphinx and MyST-NB; docs/conf.py says why): the API from
# the docstrings, the tutorials with their stored outputs (never re-executed). Warnings are
# errors (-W; --keep-going reports them all) and every internal reference is checked (-n).
# tests/docs/test_docs_site.py runs this recipe's command, with these options, into a tmp dir.
SPHINXOPTS := -b html -W --keep-going -n -q

docs: setup
	$(PY) -m sphinx $(SPHINXOPTS) docs docs/_build/html

clean:
	rm -rf $(VENV) .pytest_cache build dist docs/_build *.egg-info
