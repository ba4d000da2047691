# Two entry points for a fresh machine:
#   make run   - set up .venv and start the dashboard on the built-in demo
#   make test  - set up .venv (plus headless Chromium and bubblewrap), lint with ruff, run the
#                whole test suite (in parallel, then the timed tests alone)
#   make bench - run every benchmark and write docs/speed.md (long: tens of minutes), beside
#                the runs kept in benchmarks/kept/ from machines it cannot run on (a GPU's)
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
PORT ?= 8501
BENCH_RESULTS := benchmarks/results

.PHONY: run test lint setup setup-dev browser jail bench demo clean

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

# bubblewrap: the sandbox the jail for untrusted files runs in (without it, a plain child
# process under kernel limits; the tests check both).
jail:
	@command -v bwrap >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; }

# scripts/serve.py is `streamlit run app.py` plus a warm-up of the first page's imports.
run: setup
	$(PY) scripts/serve.py --server.port $(PORT)

lint: setup-dev
	$(PY) -m ruff check .

# The tests that measure no time share the cores (TEST_WORKERS processes of one torch thread
# each); then those that do (marker `serial`: the browser's, time and memory budgets) run
# alone.
TEST_WORKERS ?= 2

test: setup-dev browser jail
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not serial" --durations=15
	$(PY) -m pytest -q -m serial --durations=10

# Every benchmark, one JSON file of figures each, then docs/speed.md written from them.
bench: setup-dev browser
	rm -rf $(BENCH_RESULTS)
	for script in benchmarks/bench_*.py; do \
	  name=$$(basename $$script .py); \
	  $(PY) -m benchmarks.$$name --results $(BENCH_RESULTS)/$$name.json || exit 1; \
	done
	$(PY) -m benchmarks.speed_doc $(BENCH_RESULTS) docs/speed.md

demo: setup
	$(PY) scripts/make_demo.py

clean:
	rm -rf $(VENV) test-artifacts .pytest_cache .ruff_cache *.egg-info build
