# Rewind: one command for the demo, one for the tests. Both create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
UI_INDEX := src/rewind/static/index.html
UI_SOURCES := web/package.json web/package-lock.json web/index.html web/vite.config.ts \
	web/tailwind.config.js $(shell find web/src web/public -type f 2>/dev/null)

.PHONY: demo test lint verify bench serve ui chromium clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# llama-cpp-python compiles from source (~5-10 min on 2 cores) the first time; pip caches the wheel.
	$(BIN)/python -m pip install --quiet -e '.[local,dev]'
	touch $(STAMP)

# The browser UI (Vite + React), built into the package's static folder.
$(UI_INDEX): $(UI_SOURCES)
	cd web && npm ci --no-audit --no-fund && npm run build

ui: $(UI_INDEX)

# Debian's Chromium for the UI's end-to-end tests (Playwright drives it; it never downloads one).
chromium:
	test -x /usr/bin/chromium || (apt-get update && apt-get install -y --no-install-recommends chromium)

demo: $(STAMP)
	$(BIN)/rewind demo

test: $(STAMP) $(UI_INDEX) chromium
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/python -m pytest -q

verify: $(STAMP)
	$(BIN)/rewind verify

serve: $(STAMP) $(UI_INDEX)
	$(BIN)/rewind serve

bench: $(STAMP)
	$(BIN)/python benchmarks/replay_overhead.py
	$(BIN)/python benchmarks/record_overhead.py
	$(BIN)/python benchmarks/storage.py
	$(BIN)/python benchmarks/grid.py

clean:
	rm -rf $(VENV) .rewind .pytest_cache .ruff_cache web/node_modules src/rewind/static test-artifacts
