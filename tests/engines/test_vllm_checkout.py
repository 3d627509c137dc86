"""``--engine vllm-src=PATH``: a vLLM checkout (or wheel) as the system under test, beside its nearest release.

Unit tests need nothing. Those marked ``engine`` gate copies of the vLLM 0.33.0 wheel's package (links, one module
written anew, tests/release_copies.py) in the cached environment: the clean copy passes (exit 0), the copy with
vLLM #20301's pattern seeded into its own builder fails (exit 1): the negative control.
"""

import json
import re

import pytest

from fa3verify.cli import main
from gpu_impl.engines import envs
from gpu_impl.sut import EngineSpecError, parse_engine

RELEASE = "0.33.0"


def test_the_form_parses_and_names_itself(tmp_path):
    spec = parse_engine(f"vllm-src={tmp_path}")
    assert (spec.kind, spec.path, spec.plugin.options_key, spec.plugin.named_only(spec)) == ("vllm-src", str(tmp_path), "vllm", True)
    assert str(spec) == f"vllm-src={tmp_path}"
    with pytest.raises(EngineSpecError, match="vllm-src= needs a path"):
        parse_engine("vllm-src=")
    with pytest.raises(EngineSpecError, match="vllm-src=PATH"):
        parse_engine("vllm-git")


def test_a_path_without_vllm_is_bad_input_naming_engine(tmp_path, capsys):
    assert main(["fuzz", "--engine", f"vllm-src={tmp_path}", "--cases", "1"]) == 2
    err = capsys.readouterr().err
    assert "--engine" in err and "no vllm package under" in err and "Traceback" not in err


def test_a_case_found_on_a_vllm_checkout_replays_only_when_named(tmp_path):
    from fa3verify.engine_choice import engine_for_case, spec_from_identity
    from fa3verify.errors import UsageError
    from fa3verify.finding_terms import replay_line

    ident = {"name": "vllm-src", "path": str(tmp_path), "release": RELEASE}
    spec = spec_from_identity(ident)
    assert spec.kind == "vllm-src" and spec.path == str(tmp_path)

    class C:
        engine = ident

    with pytest.raises(UsageError, match=f"--engine vllm-src={tmp_path}"):
        engine_for_case(C())
    assert f"--engine vllm-src={tmp_path}" in replay_line(str(tmp_path / "c.json"), None, spec)


def _gate(root, tmp_path, name):
    """400 cases: the seeded split count shows where FA3's heuristic asks more than the 32 splits the full CUDA
    graph's call holds (measured: 1 failing case in 400 on seed 0; the clean copy runs the same draws). Both gates
    write into one cases directory, so the second's witness searches on the model (the same for both copies of
    one release) are answered by the suite's theorem memo (tests/conftest.py), which gives back a refutation only
    to a run with the same cases directory; each gate's findings are named by their content, engine included."""
    out = tmp_path / f"{name}.json"
    rc = main(["gate", "--engine", f"vllm-src={root}", "--cases", "400", "--cases-dir", str(tmp_path / "cases"),
               "--json", str(out)])
    return rc, json.loads(out.read_text())


@pytest.mark.engine
def test_gate_on_a_vllm_checkout_aligned_passes_and_seeded_pr20301_fails(tmp_path, engine_pool, monkeypatch):
    """The passing checkout is 0.33.0 with its full-graph replay precompute aligned to the captured call
    (``ALIGNED_REPLAY_0_33_0``): the clean release fails the gate with that finding (SHAPE, silent at the replay),
    which its V1 runner's capture and replay reach (docs/engines-vllm.md)."""
    if not envs.env_ready(RELEASE, engine="vllm"):
        pytest.skip(f"no environment for vllm {RELEASE} under {envs.env_dir(RELEASE, engine='vllm')}")
    from engine_pool import route_opens
    from release_copies import ALIGNED_REPLAY_0_33_0, PR20301_0_33_0, vllm_patched_copy

    # each copy's worker starts once (tests/engine_pool.py): the seeded gate's and its replay's commands share it
    route_opens(engine_pool, monkeypatch)

    aligned = vllm_patched_copy(RELEASE, tmp_path / "aligned", ALIGNED_REPLAY_0_33_0)
    rc, summary = _gate(aligned, tmp_path, "aligned")
    assert rc == 0, [c.get("message") for c in summary["checks"] if c.get("failed") or c.get("inconclusive")]
    seeded = vllm_patched_copy(RELEASE, tmp_path / "seeded", ALIGNED_REPLAY_0_33_0 + PR20301_0_33_0)
    rc, summary = _gate(seeded, tmp_path, "seeded")
    assert rc == 1
    failed = [c for c in summary["checks"] if c.get("failed")]
    assert failed and any("SPLIT_BOUND" in json.dumps(c) for c in failed), failed
    # the findings name where the checkout's code made each side (gpu_impl/engines/call_sites.py): the seeded
    # builder's precompute, read from the engine's stack
    sourced = [f for f in summary["findings"] if f.get("source")]
    assert sourced and all(re.match(r"FlashAttentionMetadataBuilder\.\w+ \(vllm/v1/attention/backends/flash_attn\.py:\d+\)",
                                    f["source"]["precompute"]) and f["source"].get("call") for f in sourced), sourced
    # the case replays on the seeded checkout only when named, as the printed replay line names it
    case = next(c["case_file"] for c in failed if c.get("case_file"))
    assert main(["replay", case]) == 2
    assert main(["replay", case, "--engine", f"vllm-src={seeded}"]) == 1
