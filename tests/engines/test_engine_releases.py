"""tests/engine_releases.py: the real-release tests run on the Makefile's ENGINE_RELEASES (sglang) and VLLM_RELEASES,
which ``make test`` exports; every release only when FA3VERIFY_ALL_RELEASES=1."""

import re
from pathlib import Path

import pytest

import engine_releases as E

ROOT = Path(__file__).resolve().parents[2]


def _skipped(param) -> bool:
    return any(m.name == "skip" for m in param.marks)


def test_make_test_exports_the_makefiles_engine_releases():
    text = (ROOT / "Makefile").read_text()
    [recipe] = re.findall(r"^test:.*\n((?:\t.*\n)+)", text, re.M)
    assert 'FA3VERIFY_ENGINE_RELEASES="$(ENGINE_RELEASES)"' in recipe and "pytest" in recipe
    assert E.makefile_releases() == ("0.5.13", "0.5.23")  # what `make engines` builds, CI's two


def test_a_sweep_runs_the_selected_releases_and_skips_the_rest_naming_how_to_run_them():
    releases = ("0.5.11", "0.5.13", "0.5.17", "0.5.23")
    params = E.sweep(releases, {"FA3VERIFY_ENGINE_RELEASES": "0.5.13 0.5.23"})
    assert [p.values[0] for p in params] == list(releases)  # ids stay the same on every machine
    assert [p.values[0] for p in params if not _skipped(p)] == ["0.5.13", "0.5.23"]
    [reason] = {m.kwargs["reason"] for p in params if _skipped(p) for m in p.marks if p.values[0] == "0.5.17"}
    assert "FA3VERIFY_ALL_RELEASES=1" in reason and 'ENGINE_RELEASES="0.5.17"' in reason
    assert not any(_skipped(p) for p in E.sweep(releases, {"FA3VERIFY_ALL_RELEASES": "1"}))
    # FA3VERIFY_ALL_RELEASES=0 is off, and a bare pytest (no variable) gets the Makefile's default
    off = E.sweep(releases, {"FA3VERIFY_ALL_RELEASES": "0"})
    assert [p.values[0] for p in off if not _skipped(p)] == list(E.makefile_releases())


def test_need_skips_a_release_outside_the_selection():
    E.need("0.5.13", {"FA3VERIFY_ENGINE_RELEASES": "0.5.13,0.5.23"})  # comma or space separated
    with pytest.raises(pytest.skip.Exception, match="0.5.17 is not in FA3VERIFY_ENGINE_RELEASES"):
        E.need("0.5.17", {"FA3VERIFY_ENGINE_RELEASES": "0.5.13 0.5.23"})
    E.need("0.5.17", {"FA3VERIFY_ALL_RELEASES": "1"})


def test_make_test_exports_the_makefiles_vllm_releases():
    text = (ROOT / "Makefile").read_text()
    [recipe] = re.findall(r"^test:.*\n((?:\t.*\n)+)", text, re.M)
    assert 'FA3VERIFY_VLLM_RELEASES="$(VLLM_RELEASES)"' in recipe
    assert E.makefile_releases(variable="VLLM_RELEASES") == ("0.33.0", "0.34.0")  # one per runner generation


def test_a_vllm_release_outside_the_selection_skips_even_where_its_environment_is_built(monkeypatch):
    """An engine home holding every release runs what a fresh clone runs: the selection decides before the
    environment does (0.33.0's is built wherever the engine tests run; a release outside the selection skips)."""
    with pytest.raises(pytest.skip.Exception, match=r"vllm 0\.33\.0 is not in FA3VERIFY_VLLM_RELEASES .*"
                                                    r'VLLM_RELEASES="0\.33\.0"'):
        E.need_vllm("0.33.0", {"FA3VERIFY_VLLM_RELEASES": "0.34.0"})
    from gpu_impl.engines import envs

    monkeypatch.setattr(envs, "env_ready", lambda release, root=None, engine="sglang": False)
    with pytest.raises(pytest.skip.Exception, match=r"no environment for vllm 0\.28\.0 .*engine setup vllm==0\.28\.0"):
        E.need_vllm("0.28.0", {"FA3VERIFY_ALL_RELEASES": "1"})
    monkeypatch.setattr(envs, "env_ready", lambda release, root=None, engine="sglang": True)
    E.need_vllm("0.28.0", {"FA3VERIFY_VLLM_RELEASES": "0.28.0,0.34.0"})  # selected and built: runs


def test_a_makefile_without_the_line_is_an_error(tmp_path):
    (tmp_path / "Makefile").write_text("ENGINES = 0.5.13\n")
    with pytest.raises(RuntimeError, match="ENGINE_RELEASES"):
        E.makefile_releases(tmp_path / "Makefile")


def test_make_test_compiles_the_venvs_bytecode_before_the_suite():
    # with PYTHONDONTWRITEBYTECODE=1 in the environment nothing installed without bytecode (torch by uv) is ever
    # cached, and each child process of the suite compiled torch again (docs/performance.md)
    text = (ROOT / "Makefile").read_text()
    [deps] = re.findall(r"^test:(.*)$", text, re.M)
    assert "$(BYTECODE)" in deps.split() and deps.split().index("$(BYTECODE)") < deps.split().index("engines")
    [rule] = re.findall(r"^\$\(BYTECODE\):.*\n((?:\t.*\n)+)", text, re.M)
    assert "compileall" in rule and "purelib" in rule
