# clef-quant: `make demo` runs the whole flow on the tiny checkpoint; `make test` runs the suite.
# Both build the environment first when needed (`make setup`, idempotent).

VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
# Rebuilt when any file that decides the environment changes.
SETUP_STAMP := $(VENV)/.clef-setup
SETUP_INPUTS := scripts/setup_env.sh scripts/patch_torchvision.py scripts/check_env.py \
	constraints/serve.txt constraints/quantize.txt pyproject.toml vllm_plugin/pyproject.toml

.PHONY: setup test lint demo readme-examples clean

setup: $(SETUP_STAMP)

$(SETUP_STAMP): $(SETUP_INPUTS)
	VENV=$(VENV) PYTHON=$(PYTHON) bash scripts/setup_env.sh
	@touch $@

# Two workers (tests/conftest.py hands out one test module at a time, the longest first). Ends with the suite's
# own summary (the 30 slowest steps, engine starts) and the whole target's wall time.
test: setup
	@start=$$(date +%s); $(BIN)/ruff check . && $(BIN)/python -m pytest -q tests -n 2 --no-loadscope-reorder --durations=30; \
	status=$$?; echo "make test: $$(( $$(date +%s) - start )) s (exit $$status)"; exit $$status

# The whole release flow on the tiny checkpoint, offline, into artifacts/demo/ (scripts/demo.sh says what runs).
demo: setup
	VENV=$(VENV) bash scripts/demo.sh

# Only the README check of `make test`: every runnable block, in order, in a scratch folder (the whole flow).
readme-examples: setup
	$(BIN)/python -m pytest -q -s tests/test_readme_examples.py

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
