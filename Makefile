# Quick start: `make check` (proofs + CPU fuzz campaign, ends in a verdict) and `make test` (the test suite).
# Both create .venv when it is missing and are idempotent: the second run skips the install.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

#: sglang releases whose engine environments the test suite drives (cached under ~/.cache/fa3verify/engines).
ENGINE_RELEASES ?= 0.5.13 0.5.23
#: vLLM releases likewise (tests/test_engine_vllm.py).
VLLM_RELEASES ?= 0.33.0

.PHONY: check test setup clean bench engines

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "torch==2.13.0"
	@$(PY) -m pip install -q -e .
	@$(VENV)/bin/fa3verify sanitize install-hook >/dev/null   # FA3VERIFY_SANITIZE start hook (inert unless set)
	@touch $(STAMP)

check: $(STAMP)
	$(VENV)/bin/fa3verify check

# Builds (first time: minutes with uv, which `setup` installs; pip without it) or reuses the engine environments
# the engine tests use.
engines: $(STAMP)
	$(PY) -m gpu_impl.engines.envs $(ENGINE_RELEASES) $(addprefix vllm==,$(VLLM_RELEASES))

test: $(STAMP) engines
	$(PY) -m pytest -q

bench: $(STAMP)
	$(VENV)/bin/fa3verify bench

clean:
	rm -rf $(VENV) build *.egg-info
