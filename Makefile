# Everything bootstraps from nothing: `make test` on a fresh clone creates .venv,
# installs the CPU torch wheel first (a bare `torch` would pull a multi-GB CUDA build),
# then zbkit with its dev extras, then Graphviz's `dot`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.zbkit-installed
TORCH ?= torch==2.13.0

.PHONY: setup system-deps test test-fast lint format demo lab clean

setup: $(STAMP) system-deps

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

system-deps:
	@command -v dot >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null; \
	  else \
	    echo "Graphviz's 'dot' is missing: install it (apt-get install graphviz, brew install graphviz, conda install graphviz)"; exit 1; \
	  fi; }

test: setup
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not multiprocess and not browser"

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

demo: setup
	$(VENV)/bin/zbkit demo

lab: setup
	$(VENV)/bin/jupyter lab notebooks/

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
