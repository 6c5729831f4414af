# Rewind: one command for the demo, one for the tests. Both create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint verify bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# llama-cpp-python compiles from source (~5-10 min on 2 cores) the first time; pip caches the wheel.
	$(BIN)/python -m pip install --quiet -e '.[local,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/rewind demo

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/python -m pytest -q

verify: $(STAMP)
	$(BIN)/rewind verify

bench: $(STAMP)
	$(BIN)/python benchmarks/replay_overhead.py
	$(BIN)/python benchmarks/record_overhead.py
	$(BIN)/python benchmarks/storage.py

clean:
	rm -rf $(VENV) .rewind .pytest_cache .ruff_cache
