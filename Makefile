# shopping_grpo: `make run` runs the pipeline on the embedded default, `make test` runs every CPU test.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
RUN ?= outputs/smoke
PROFILE ?= smoke
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

.PHONY: setup run test test-slow export clean-nbs

setup: $(STAMP)
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check uv==0.13.8
	$(BIN)/uv pip install -q --python $(BIN)/python -e '.[dev]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	@rm -f $(VENV)/.installed-*; touch $@

run: setup
	$(BIN)/shopping-grpo pipeline --profile $(PROFILE) --run $(RUN)

test: setup
	cd nbs && ../$(BIN)/nbdev-test --n-workers 2
	$(BIN)/pytest -q -m "not slow and not gpu"

test-slow: setup
	$(BIN)/pytest -q -m "slow and not gpu"

export: setup
	$(BIN)/nbdev-export && $(BIN)/nbdev-clean
