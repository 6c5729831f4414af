# Rewind: one command for the demo, one for the tests. Both create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
UI_INDEX := src/rewind/static/index.html
UI_SOURCES := web/package.json web/package-lock.json web/index.html web/vite.config.ts web/eslint.config.js \
	web/tailwind.config.js $(shell find web/src web/public -type f 2>/dev/null)

.PHONY: demo test lint verify bench serve ui chromium postgresql redis clean

# llama.cpp compiles for the CPU it is built on (-march=native). Some virtual machines advertise
# AMX without enabling its register state: a native build then dies on the model's first request
# (a general protection fault at ldtilecfg in libggml-cpu.so). On x86-64 AMX is left out; AVX2 and
# AVX-512 stay. A wheel pip cached from an earlier native build is reused as it is: remove it with
# `pip cache remove llama_cpp_python` to rebuild.
ifeq ($(shell uname -m),x86_64)
LLAMA_ISA_FLAGS := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
endif

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# llama-cpp-python compiles from source (~5-10 min on 2 cores) the first time; pip caches the wheel.
	CFLAGS="$(LLAMA_ISA_FLAGS) $$CFLAGS" CXXFLAGS="$(LLAMA_ISA_FLAGS) $$CXXFLAGS" \
		$(BIN)/python -m pip install --quiet -e '.[local,dev]'
	touch $(STAMP)

# The browser UI (Vite + React), built into the package's static folder.
$(UI_INDEX): $(UI_SOURCES)
	cd web && npm ci --no-audit --no-fund && npm run build

ui: $(UI_INDEX)

# Debian's Chromium for the UI's end-to-end tests (Playwright drives it; it never downloads one).
chromium:
	test -x /usr/bin/chromium || (apt-get update && apt-get install -y --no-install-recommends chromium)

# Debian's PostgreSQL server binaries (/usr/lib/postgresql/*/bin) for the store conformance suite:
# the tests start a throwaway cluster on 127.0.0.1 at a free port themselves (tests/services.py,
# as the 'postgres' user when run as root) and stop it; they never use the package's own cluster.
postgresql:
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || (apt-get update && apt-get install -y --no-install-recommends postgresql)

# Debian's Redis server for the task-queue tests: they start their own on 127.0.0.1 at a free port
# without persistence (tests/services.py) and stop it; the package's own service is never used.
redis:
	command -v redis-server >/dev/null 2>&1 || (apt-get update && apt-get install -y --no-install-recommends redis-server)

demo: $(STAMP)
	$(BIN)/rewind demo

# Three pytest workers on the 2-core CI machine: the tests wait on subprocesses, servers and the
# browser, so two workers left the cores idle 12% of the run (vmstat). Whole suite, same hour:
# quiet, -n 2 4:26 and -n 3 4:10 (6% idle); beside another session's work, -n 2 5:08 and -n 3
# 4:43; -n 4 no faster than -n 2. Every test file still runs whole on one worker
# (tests/schedule.py orders them longest first).
TEST_WORKERS ?= 3

test: $(STAMP) $(UI_INDEX) chromium postgresql redis
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

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
