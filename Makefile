# Two entry points for a fresh machine:
#   make run   - set up .venv and start the dashboard on the built-in demo
#   make test  - set up .venv (plus headless Chromium) and run the whole test suite
#   make bench - run every benchmark and write docs/speed.md (long: tens of minutes)
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
PORT ?= 8501
BENCH_RESULTS := benchmarks/results

.PHONY: run test setup setup-dev browser bench demo clean

$(VENV)/.runtime: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $@

$(VENV)/.dev: $(VENV)/.runtime requirements-dev.txt
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

setup: $(VENV)/.runtime
setup-dev: $(VENV)/.dev

browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }

run: setup
	$(VENV)/bin/streamlit run app.py --server.port $(PORT)

test: setup-dev browser
	$(PY) -m pytest -q

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
	rm -rf $(VENV) test-artifacts .pytest_cache
