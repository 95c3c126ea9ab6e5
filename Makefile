# Everything bootstraps from nothing: `make test` on a fresh clone creates .venv,
# installs the CPU torch wheel first (a bare `torch` would pull a multi-GB CUDA build),
# then zbkit with its dev extras, then Graphviz's `dot`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.zbkit-installed
TORCH ?= torch==2.13.0

.PHONY: setup system-deps test test-notebooks test-fast lint format demo lab clean

setup: $(STAMP) system-deps

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# Graphviz's `dot` renders the graph drawings; Chromium drives the widget browser test.
system-deps:
	@missing=""; \
	command -v dot >/dev/null 2>&1 || missing="$$missing graphviz"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing$$missing with apt-get"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "missing system packages:$$missing. Install them (apt-get install$$missing; brew install graphviz chromium; conda install graphviz)"; exit 1; \
	  fi; \
	fi

NBVAL := -p no:cacheprovider --nbval --nbval-sanitize-with notebooks/sanitize.cfg

test: setup
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

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
