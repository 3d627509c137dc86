"""The vLLM CPU glue answers the capability queries of vLLM's compiled ``_C`` extension (a CUDA build that does
not load on CPU), so ``ModelConfig`` inspects the placeholder model and the release's model checks decide.

Unit tests need nothing; those marked ``engine`` run vLLM 0.33.0 in its cached environment and skip without it. The
negative control runs the same validation without the capability fakes: every configuration is then rejected with
"failed to be inspected" (what the CLI fuzz campaign hit: 0 cases, every draw rejected).
"""

import json
import subprocess
from pathlib import Path

import pytest

from gpu_impl.engines import envs
from gpu_impl.engines.vllm import glue as vllm_glue

RELEASE = "0.33.0"
ROOT = Path(__file__).resolve().parents[2]


def test_the_answers_are_a_sm90_cuda_builds_and_each_fake_is_listed():
    data = json.loads(vllm_glue.CAPABILITIES_FILE.read_text())
    assert vllm_glue.capability_answer("cutlass_scaled_mm_supports_fp8", 90) is True
    assert vllm_glue.capability_answer("cutlass_scaled_mm_supports_block_fp8", 90) is True
    assert vllm_glue.capability_answer("cutlass_scaled_mm_supports_fp4", 90) is False
    assert vllm_glue.capability_answer("cutlass_scaled_mm_supports_fp4", 100) is True
    assert vllm_glue.capability_answer("cutlass_scaled_mm_supports_block_fp8", 89) is False
    faked = " ".join(vllm_glue.FAKED)
    doc = (ROOT / "docs" / "engines-vllm.md").read_text()
    for name in data["queries"]:
        short = name.replace("cutlass_scaled_mm_supports", "")
        assert short in faked, name
        assert name in doc, f"docs/engines-vllm.md does not list the faked {name}"


SCRIPT = r"""
import json, sys
from gpu_impl.engines.vllm import glue as vllm_glue
if sys.argv[1] == "without":
    vllm_glue._install_capability_queries = lambda: []
vllm_glue.install()
import torch
from gpu_impl.engines.vllm.validation import validate_vllm_config
answers = {}
if sys.argv[1] == "with":
    answers = {n: bool(getattr(torch.ops._C, n)(90)) for n in json.loads(vllm_glue.CAPABILITIES_FILE.read_text())["queries"]}
s = dict(tp=2, dcp=1, block_size=16, kv_cache_dtype="auto", num_heads=32, num_kv_heads=8, head_dim=128,
         dtype="bfloat16", max_model_len=40960)
print("RESULT " + json.dumps({"answers": answers, "verdict": validate_vllm_config(s)}))
"""


def _validate_in_env(mode: str, tmp_path) -> dict:
    if not envs.env_ready(RELEASE, engine="vllm"):
        pytest.skip(f"no vllm=={RELEASE} environment (python -m gpu_impl.engines.envs vllm=={RELEASE})")
    env = envs.driver_environ(engine="vllm")
    env["VLLM_CACHE_ROOT"] = str(tmp_path / f"vllm-cache-{mode}")  # no model info cached by an earlier run
    proc = subprocess.run([str(envs.env_python(RELEASE, engine="vllm")), "-c", SCRIPT, mode], env=env,
                          capture_output=True, text=True, timeout=600, cwd=str(ROOT))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.engine
def test_model_config_is_built_on_cpu_with_the_capability_fakes(tmp_path):
    out = _validate_in_env("with", tmp_path)
    assert out["answers"] == {"cutlass_scaled_mm_supports_fp8": True, "cutlass_scaled_mm_supports_block_fp8": True,
                              "cutlass_scaled_mm_supports_fp4": False}
    assert out["verdict"] == {"accepted": True, "message": "accepted by ParallelConfig, CacheConfig and ModelConfig"}


@pytest.mark.engine
def test_negative_control_without_the_capability_fakes_every_model_config_fails_inspection(tmp_path):
    out = _validate_in_env("without", tmp_path)
    assert out["verdict"]["accepted"] is False
    assert "failed to be inspected" in out["verdict"]["message"], out
