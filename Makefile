PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two stamps: `run` needs only the runtime dependencies (ready in seconds from a warm package
# cache); `test`, `lint` and `bench` add the dev tool chain on top, in the same .venv.
RUNTIME := $(VENV)/.installed-runtime
DEV := $(VENV)/.installed-dev
# The host's pip installs into .venv (`pip --python`, pip >= 22.3), so the venv is created
# without a pip of its own: ensurepip alone costs several seconds of a fresh `make run`. Where
# the host has no such pip, .venv gets its own and that one is used.
pip_install = if [ -x $(BIN)/pip ]; then $(BIN)/pip install -q $(1); \
	else $(PYTHON) -m pip --python $(BIN)/python install -q $(1); fi

.PHONY: run test lint bench clean

$(RUNTIME): pyproject.toml
	$(PYTHON) -m venv --without-pip $(VENV)
	$(PYTHON) -m pip --python $(BIN)/python --version >/dev/null 2>&1 || $(PYTHON) -m venv $(VENV)
	$(call pip_install,--disable-pip-version-check -e .)
	touch $(RUNTIME)

$(DEV): $(RUNTIME)
	$(call pip_install,--disable-pip-version-check -e '.[dev]')
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
	$(BIN)/python bench/run.py $(if $(BASELINE),--baseline $(BASELINE))

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
