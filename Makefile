PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install -q --disable-pip-version-check
# Two stamps: `run` needs only the runtime dependencies (ready in seconds from a warm package
# cache); `test`, `lint` and `bench` add the dev tool chain on top, in the same .venv.
RUNTIME := $(VENV)/.installed-runtime
DEV := $(VENV)/.installed-dev

.PHONY: run test lint bench clean

$(RUNTIME): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) -e .
	touch $(RUNTIME)

$(DEV): $(RUNTIME)
	$(PIP) -e '.[dev]'
	touch $(DEV)

# With CITEWARDEN_UPSTREAM set, serve in front of it (CITEWARDEN_POLICY, default
# policies/default.yaml); otherwise start the embedded demo upstream behind the gateway.
run: $(RUNTIME)
	@if [ -n "$$CITEWARDEN_UPSTREAM" ]; then \
		CITEWARDEN_POLICY="$${CITEWARDEN_POLICY:-policies/default.yaml}" $(BIN)/citewarden serve; \
	else \
		$(BIN)/citewarden demo; \
	fi

lint: $(DEV)
	$(BIN)/ruff check gateway tests bench
	$(BIN)/mypy

test: $(DEV) lint
	$(BIN)/python -m pytest

bench: $(DEV)
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
