PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

# With CITEWARDEN_UPSTREAM set, serve in front of it (CITEWARDEN_POLICY, default
# policies/default.yaml); otherwise start the embedded demo upstream behind the gateway.
run: $(STAMP)
	@if [ -n "$$CITEWARDEN_UPSTREAM" ]; then \
		CITEWARDEN_POLICY="$${CITEWARDEN_POLICY:-policies/default.yaml}" $(BIN)/citewarden serve; \
	else \
		$(BIN)/citewarden demo; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check gateway tests bench
	$(BIN)/mypy

test: $(STAMP) lint
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
