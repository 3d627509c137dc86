"""Test-suite settings: torch on one thread (the suite's tensors are small; threads only add contention), and the
memo of theorem parts (spec.theorems.memo): a theorem part run again with the same arguments, while nothing in
refmodel, spec or z3 has been replaced (a monkeypatch, a counterfactual), is answered from the first run
(FA3VERIFY_THEOREM_MEMO=0 turns it off). Test files run longest first, by tests/file_seconds.json (a file missing
from it counts as the table's median; ``scripts/file_seconds.py`` refreshes it, docs/performance.md); a file's own
tests keep their order. ``engine_sut``: engine workers shared by the files of one test process
(tests/engine_pool.py); ``cli_on_engine_pool``: a command run in-process with ``main()`` opens its real engine on those
workers."""

import json
import os
from pathlib import Path

import pytest
import torch

from spec.theorems import memo as theorem_memo

torch.set_num_threads(1)
# the command line's gate keeps an engine's z3 rows across runs (fa3verify/z3_cache.py, keyed by file bytes): tests
# replace functions in-process, which no file hash sees, so the suite computes every row (tests/cli/test_z3_cache.py
# turns it on in a directory of its own)
os.environ.setdefault("FA3VERIFY_Z3_CACHE", "off")
if os.environ.get("FA3VERIFY_THEOREM_MEMO", "1") != "0":
    theorem_memo.enable()


FILE_SECONDS = Path(__file__).with_name("file_seconds.json")


def file_order(paths, table: dict) -> list:
    """``paths`` (tests/cli/test_x.py, each once) longest first by ``table``; unknown ones count as its median; ties
    keep their order."""
    known = sorted(table.values())
    median = known[len(known) // 2] if known else 0.0
    return sorted(paths, key=lambda p: -table.get(p, median))


def pytest_collection_modifyitems(session, config, items):
    try:
        table = json.loads(FILE_SECONDS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    root = Path(str(config.rootpath))
    groups: dict = {}
    for item in items:
        groups.setdefault(Path(str(item.path)).relative_to(root).as_posix(), []).append(item)
    items[:] = [item for path in file_order(list(groups), table) for item in groups[path]]


@pytest.fixture(scope="session")
def engine_pool():
    from engine_pool import EnginePool

    pool = EnginePool()
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def engine_sut(engine_pool):
    """``engine_sut("sglang==V")``: a fresh, started system under test on this process's one worker for it."""
    return engine_pool.sut


@pytest.fixture
def cli_on_engine_pool(monkeypatch, engine_sut):
    """While the test runs, the engine a command opens (``--engine sglang==V`` / ``vllm==V``, or a case's own
    engine on replay: fa3verify.engine_choice.open_engine) is a fresh system under test on this process's shared
    worker for it, so a command run in-process with ``fa3verify.cli.main`` starts no worker of its own. The model,
    source checkouts and releases without an environment open as before."""
    from fa3verify import engine_choice
    from gpu_impl.engines import envs

    real = engine_choice.open_engine

    def pooled(spec_or_text, **options):  # options: the model's policy
        spec = engine_choice.parse_engine_option(spec_or_text) if isinstance(spec_or_text, str) else spec_or_text
        if spec.kind in ("sglang", "vllm") and envs.env_ready(spec.release, engine=spec.kind):
            return engine_sut(str(spec))
        return real(spec_or_text, **options)

    monkeypatch.setattr(engine_choice, "open_engine", pooled)
