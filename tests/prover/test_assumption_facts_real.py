"""spec/model/assumption_facts.json against the releases' own code (marked ``engine``).

For every sglang release the suite's sweeps select (tests/engine_releases.py: the Makefile's ENGINE_RELEASES, 0.5.13
and 0.5.23, which ``make engines`` builds; FA3VERIFY_ALL_RELEASES=1 selects all 13, each run when its environment
exists and skipped, naming the command, otherwise): the release's own validation
(``ServerArgs``, then its model-load head split, ``gpu_impl.engines.sglang.model_load``) rejects the probe configuration
of each fact "enforced" in ServerArgs or at model load (a model-load rejection by the check the fact names) and
accepts that of each "not enforced" one, and every check a fact names is a function in the release's wheel. vLLM
0.33.0's own config validation accepts the probe (its fact's own) of each assumption it does not enforce.
Then the negative controls of the gate's witness stage on source copies (``sglang-src=PATH``) of a failing release:
the copy whose validation is patched to reject the configurations its findings need passes, the unpatched copy
fails."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from engine_releases import need, sweep
from spec.model import assumption_facts as F
from spec.model.engine_profiles import RELEASES

pytestmark = pytest.mark.engine


def _envs():
    try:
        from gpu_impl.engines import envs
    except ModuleNotFoundError as exc:
        pytest.skip(f"no engine runtime in this checkout ({exc.name})")
    return envs


def _need_env(release):
    envs = _envs()
    if not envs.env_ready(release):
        pytest.skip(f"no environment for sglang {release}: run `fa3verify engine setup sglang=={release}`")
    return envs.env_dir(release) / "lib" / "python3.11" / "site-packages" / "sglang"


def _functions(path: Path) -> set:
    """Every ``Class.method`` and function qualname defined in a Python file."""
    names = set()

    def walk(node, prefix):
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(".".join(prefix + [ch.name]))
                walk(ch, prefix + [ch.name])

    walk(ast.parse(path.read_text(encoding="utf-8")), [])
    return names


@pytest.mark.parametrize("release", sweep(RELEASES))
def test_the_release_enforces_exactly_what_its_facts_say(release, engine_sut):
    site = _need_env(release)
    facts = F.facts_for("sglang", release)
    for fact in facts.values():
        for check in fact.checks:
            file, function = check.split(" ", 1)
            assert function in _functions(site / file), f"{release}: {check} is not in the wheel"
    sut = engine_sut(f"sglang=={release}")  # the test process's shared worker (tests/engine_pool.py)
    for probe in F.probes():
        fact = facts[probe.assumption]
        accepted, message = sut.validate(probe.server, probe.model)
        want = not (fact.is_enforced and fact.stage in ("server_args", "model_load"))
        assert accepted is want, (release, probe.assumption, probe.description, fact.status, message)
        if not want:
            assert message, "a rejection carries the release's message"
        if not want and fact.stage == "model_load":  # by the check the fact names, with its own assert
            assert message.startswith(f"model load ({fact.checks[0]}): AssertionError: assert"), message


@pytest.mark.parametrize("release", ["0.33.0"])
def test_vllm_accepts_the_probe_of_each_assumption_it_does_not_enforce(release):
    from gpu_impl.sut import open_sut

    envs = _envs()
    if not envs.env_ready(release, engine="vllm"):
        pytest.skip(f"no environment for vllm {release}: run `fa3verify engine setup vllm=={release}`")
    facts = F.facts_for("vllm", release)
    probes = F.probes("vllm")
    assert {p.assumption for p in probes} == set(facts)
    with open_sut(f"vllm=={release}") as sut:
        for probe in probes:
            accepted, message = sut.validate(probe.server, probe.model)
            want = not (facts[probe.assumption].is_enforced)
            assert accepted is want, (release, probe.assumption, probe.description, message)
        # negative control: sglang's probe of the same assumption breaks a rule of vLLM's own (DCP needs tp_size
        # above the KV heads), so it could not show the assumption unenforced
        shared = next(p for p in F.probes() if p.assumption == "ASSUMPTION_ATTN_CP_NEEDS_PREFILL_CP")
        accepted, message = sut.validate(shared.server, shared.model)
        assert accepted is False and "Decode context parallelism" in message, message


def _copy_with_validation(release: str, tmp_path: Path, reject: str) -> Path:
    """The release's installed sglang as a tree of links, with ``ServerArgs._handle_context_parallelism`` made to
    raise first when ``reject`` (a condition on ``self``) holds (patched at test time; nothing of sglang is kept)."""
    from release_copies import patched_copy

    _need_env(release)
    # the copy's ServerArgs._handle_context_parallelism must match once (else the release no longer has it)
    patch = (r"(\n    def _handle_context_parallelism\(self\):\n)",
             r"\1        if " + reject + ":\n            raise ValueError('patched copy: " + reject.replace("'", "")
             + " is rejected')\n")
    return patched_copy(release, tmp_path / f"sglang-{release}-patched", [patch], module=Path("srt") / "server_args.py")


def _witness_stage(engine: str, tmp_path: Path, cache: dict):
    from fa3verify.engine_gate import plan_rows, replay_witnesses
    from gpu_impl.sut import open_sut

    with open_sut(engine) as sut:
        rows = plan_rows(sut, 10.0, str(tmp_path / "witnesses"), cache)
        return replay_witnesses(sut, [r.case_file for r in rows], str(tmp_path / "cases"))


#: (release, the condition its patched validation rejects): 0.5.13's findings need attention CP (prefill CP and
#: attention CP without it; its guard covers DP attention), 0.5.17's need attention CP without prefill CP.
FAILING = [("0.5.13", "self.attn_cp_size > 1"), ("0.5.17", "self.attn_cp_size > 1 and not self.enable_prefill_cp")]


@pytest.mark.parametrize("release, reject", FAILING)
def test_a_copy_whose_validation_rejects_what_its_findings_need_passes_the_witness_stage(release, reject, tmp_path):
    need(release)
    cache: dict = {}  # the same release: the unpatched copy reuses the patched copy's witness searches
    patched = _copy_with_validation(release, tmp_path / "a", reject)
    checks, findings = _witness_stage(f"sglang-src={patched}", tmp_path / "a", cache)
    assert not findings and not any(c.failed for c in checks), [c.message for c in checks if c.failed]
    rejected = [c for c in checks if c.verdict == "rejected"]
    assert rejected and all("patched copy" in c.message for c in rejected)
    # negative control: the copy with its own validation fails on the same witnesses
    plain = _copy_with_validation(release, tmp_path / "b", "False")
    checks, findings = _witness_stage(f"sglang-src={plain}", tmp_path / "b", cache)
    assert findings and {f.invariant for f in findings} & {"SPLIT_BOUND", "COMBINE_CAPACITY"}
    assert not any(c.verdict == "rejected" for c in checks)
