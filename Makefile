# Quick start: `make check` (proofs + CPU fuzz campaign, ends in a verdict) and `make test` (the test suite).
# Both create .venv when it is missing and are idempotent: the second run skips the install.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
BYTECODE := $(VENV)/.bytecode

#: sglang releases whose engine environments the test suite drives (cached under ~/.cache/fa3verify/engines).
ENGINE_RELEASES ?= 0.5.13 0.5.23
#: vLLM releases likewise, one per driver generation: 0.33.0 (V1 model runner; tests/engines/test_engine_vllm.py) and 0.34.0
#: (V2; tests/engines/test_engine_vllm_v2.py, tests/engines/test_vllm_release_copies.py).
VLLM_RELEASES ?= 0.33.0 0.34.0
#: engine environments built side by side on a first run: all four the suite drives at once (measured into an empty
#: home, uv's cache warm, 2 cores: 38.6 s with 4, 53.3 s with 3; docs/performance.md).
ENV_JOBS ?= 4
#: test processes (pytest-xdist): one per core (a third process on 2 cores measured no faster: pytest 514.8 s and
#: 559.6 s with 3, 521.9 s and 543.6 s with 2, and about 100 s more CPU, which a loaded machine pays); each test
#: file runs whole in one process, so a module's engine worker or multi-rank launch is started once. Files are handed out longest first (tests/file_seconds.json,
#: ordered by tests/conftest.py; --no-loadscope-reorder keeps xdist from reordering them by test count). TEST_JOBS=0 runs the suite in this process.
TEST_JOBS ?= auto
#: more pytest arguments for `make test`, e.g. PYTEST_ARGS=--junitxml=run.xml for scripts/file_seconds.py --from run.xml
PYTEST_ARGS ?=

.PHONY: check test setup clean bench engines mutation

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q "uv>=0.13"   # torch_build may need uv's --torch-backend cpu
	@# torch's CPU build: from the configured package indexes when they offer it, else through uv's CPU backend
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m gpu_impl.engines.torch_build --python $(PY)
	@$(PY) -m pip install -q -e ".[test]"
	@$(VENV)/bin/fa3verify sanitize install-hook >/dev/null   # FA3VERIFY_SANITIZE start hook (inert unless set)
	@touch $(STAMP)

# Bytecode for everything installed in .venv: torch's CPU wheel comes without it when uv installs it, and where the
# environment sets PYTHONDONTWRITEBYTECODE=1 nothing is ever cached, so every child process the suite starts (CLI
# runs, guard sandboxes, ranks) compiled torch's sources again: 14 s of CPU in a 28 s replay (docs/performance.md).
$(BYTECODE): $(STAMP)
	@$(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 || true
	@touch $(BYTECODE)

check: $(STAMP)
	$(VENV)/bin/fa3verify check

# Builds (first time: minutes with uv, which `setup` installs; pip without it) or reuses the engine environments
# the engine tests use.
engines: $(STAMP)
	FA3VERIFY_ENV_JOBS=$(ENV_JOBS) $(PY) -m gpu_impl.engines.envs $(ENGINE_RELEASES) $(addprefix vllm==,$(VLLM_RELEASES))

# The suite's real-release tests run on ENGINE_RELEASES and VLLM_RELEASES (tests/engine_releases.py), whatever else the
# engine home holds, so a machine with every release built runs what a fresh clone runs; FA3VERIFY_ALL_RELEASES=1
# runs them on every release whose environment exists.
# The project's own modules are compiled first and the suite runs with bytecode writing on: where the environment
# sets PYTHONDONTWRITEBYTECODE=1, every CLI run, guard sandbox and rank the suite starts compiled the project's 200
# modules again (0.25 s each), and each test process rewrote and compiled every test file (collection 13.1 s,
# 5.7 s with the cache). Only __pycache__ folders (ignored by git) are written. -rs lists every skipped test with
# its reason in the summary.
test: $(STAMP) $(BYTECODE) engines
	@$(PY) -m compileall -q -j 0 refmodel spec gpu_impl fa3verify >/dev/null
	FA3VERIFY_ENGINE_RELEASES="$(ENGINE_RELEASES)" FA3VERIFY_VLLM_RELEASES="$(VLLM_RELEASES)" PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -rs -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder --durations=15 $(PYTEST_ARGS)

bench: $(STAMP)
	$(VENV)/bin/fa3verify bench

# Mutation testing of refmodel/, spec/ and fa3verify's verdict modules (docs/reliability.md); not part of `make test`.
# Options: MUTATION_MODULES=refmodel/prepare.py,... MUTATION_SAMPLE=N MUTATION_ONLY=glob MUTATION_JOBS=2
# MUTATION_FAIL_UNDER=95. Report: build/mutation/report.json.
mutation: $(STAMP)
	@$(PY) -c "import mutmut" 2>/dev/null || $(PY) -m pip install -q -e ".[mutation]"
	nice -n 15 $(PY) scripts/mutation.py

clean:
	rm -rf $(VENV) build *.egg-info
