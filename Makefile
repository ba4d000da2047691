# Two entry points for a fresh machine:
#   make run   - set up .venv and start the dashboard on the built-in demo
#   make test  - set up .venv (plus headless Chromium), lint with ruff, run the whole test suite
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
PORT ?= 8501

.PHONY: run test lint setup setup-dev browser bench demo clean

# The pinned lists install everything (torch first, in one pip call); then the project itself,
# editable and without dependencies, so `import attribution` and the `attribution` command work
# from any folder.
$(VENV)/.runtime: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q -e . --no-deps
	touch $@

$(VENV)/.dev: $(VENV)/.runtime requirements-dev.txt pyproject.toml
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

setup: $(VENV)/.runtime
setup-dev: $(VENV)/.dev

browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }

run: setup
	$(VENV)/bin/streamlit run app.py --server.port $(PORT)

lint: setup-dev
	$(PY) -m ruff check .

test: setup-dev browser
	$(PY) -m ruff check .
	$(PY) -m pytest -q

bench: setup-dev
	for script in benchmarks/bench_*.py; do $(PY) -m benchmarks.$$(basename $$script .py) || exit 1; done

demo: setup
	$(PY) scripts/make_demo.py

clean:
	rm -rf $(VENV) test-artifacts .pytest_cache .ruff_cache *.egg-info build
