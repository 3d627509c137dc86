"""What each release's V2 runner passes where releases differ, read from the release's own installed source and
compared with releases.json ``v2_runner`` (which driver generation v2 follows):

- ``dispatch_max_query_len``: ``execute_model`` hands ``CudaGraphManager.dispatch`` its batch's longest query
  (``batch``: 0.28.0 .. 0.30.0), or sets ``max_query_len = None`` when the batch has a prefill (0.31.0 on);
- ``capture_max_query_len``: the capture's ``prepare_inputs_to_capture(..., max_query_len=...)`` is
  ``desc.max_query_len`` alone (``descriptor``: 0.28.0 .. 0.30.0) or ``desc.max_query_len or
  desc.uniform_token_count`` (0.31.0 on).

Each release is read where its engine environment is built (skipped, naming the setup command, where not). Negative
controls: the reader classifies a source with the other form as the other kind, and the comparison reports a table
that lists a release under the wrong kind (0.31.0 under ``batch``, as the table did before it was read this way).
"""

from __future__ import annotations

import ast
import json

import pytest

from gpu_impl.engines import envs
from gpu_impl.engines.vllm import recipes

V2 = json.loads(recipes.RELEASES_FILE.read_text())["v2_runner"]
#: every release whose V2 runner generation v2 drives (beside the V1 runner, and 0.34.0's only runner); the V2 runners
#: that earlier generations drive (v2early, v2first: releases.json ``v2_runner.generation``) have no
#: ``CudaGraphManager.dispatch`` for these arguments to reach
RELEASES = sorted({r for r in V2["driven"] if recipes.v2_runner_generation(r) == "v2"} | {"0.34.0"},
                  key=recipes.version_key)


def _function(tree, name):
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def dispatch_kind(model_runner_source: str) -> str | None:
    """``batch``, ``none_with_prefill``, or None (this ``execute_model`` passes ``dispatch`` no max_query_len)."""
    fn = _function(ast.parse(model_runner_source), "execute_model")
    passes = any(isinstance(n, ast.keyword) and n.arg == "max_query_len" for n in ast.walk(fn))
    if not passes:
        return None
    cleared = any(isinstance(n, (ast.Assign, ast.AnnAssign)) and isinstance(n.value, ast.Constant)
                  and n.value.value is None
                  and any(isinstance(t, ast.Name) and t.id == "max_query_len"
                          for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))
                  for n in ast.walk(fn))
    return "none_with_prefill" if cleared else "batch"


def capture_kind(cudagraph_utils_source: str) -> str | None:
    """``descriptor``, ``descriptor_or_uniform``, or None (the capture passes no max_query_len)."""
    for n in ast.walk(ast.parse(cudagraph_utils_source)):
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "prepare_inputs_to_capture":
            for k in n.keywords:
                if k.arg == "max_query_len":
                    text = ast.unparse(k.value)
                    return {"desc.max_query_len": "descriptor",
                            "desc.max_query_len or desc.uniform_token_count": "descriptor_or_uniform"}.get(text, text)
    return None


def disagreements(kinds: dict, table: dict) -> list[str]:
    """Releases whose read kinds disagree with the table (``kinds``: release -> (dispatch kind, capture kind))."""
    out = []
    for release, (dispatch, capture) in kinds.items():
        listed = release in table["dispatch_max_query_len"].get("batch", ())
        if dispatch is not None and listed != (dispatch == "batch"):
            out.append(f"{release}: execute_model passes dispatch {dispatch}, the table lists it "
                       f"{'under' if listed else 'not under'} 'batch'")
        listed = release in table["capture_max_query_len"].get("descriptor", ())
        if capture is not None and listed != (capture == "descriptor"):
            out.append(f"{release}: the capture passes {capture}, the table lists it "
                       f"{'under' if listed else 'not under'} 'descriptor'")
    return out


def _source(release: str, rel_path: str) -> str:
    env = envs.env_dir(release, engine="vllm")
    found = sorted(env.glob(f"lib/python3*/site-packages/vllm/{rel_path}"))
    if not found:
        pytest.skip(f"no vllm {release} engine environment at {env} (fa3verify engine setup vllm=={release})")
    return found[0].read_text()


def _kinds(release: str):
    return (dispatch_kind(_source(release, "v1/worker/gpu/model_runner.py")),
            capture_kind(_source(release, "v1/worker/gpu/cudagraph_utils.py")))


@pytest.mark.parametrize("release", RELEASES)
def test_the_table_says_what_the_release_passes(release):
    kinds = _kinds(release)
    assert disagreements({release: kinds}, V2) == []
    if recipes.version_key(release) >= recipes.version_key("0.28.0"):   # both arguments exist from 0.28.0
        assert None not in kinds, kinds


def test_the_kinds_read_from_0_30_0_and_0_31_0():
    assert _kinds("0.30.0") == ("batch", "descriptor")
    assert _kinds("0.31.0") == ("none_with_prefill", "descriptor_or_uniform")


def test_negative_control_the_other_form_reads_as_the_other_kind():
    runner = ("class R:\n    def execute_model(self, s):\n        max_query_len = max(s)\n"
              "        if s.has_prefill:\n            max_query_len = None\n"
              "        return dispatch(1, max_query_len=max_query_len)\n")
    assert dispatch_kind(runner) == "none_with_prefill"
    assert dispatch_kind(runner.replace("max_query_len = None", "pass")) == "batch"
    capture = "def c(desc):\n    prepare_inputs_to_capture(1, max_query_len=desc.max_query_len)\n"
    assert capture_kind(capture) == "descriptor"
    assert capture_kind(capture.replace("desc.max_query_len)", "desc.max_query_len or desc.uniform_token_count)")) \
        == "descriptor_or_uniform"


def test_negative_control_a_table_listing_0_31_0_under_batch_is_reported():
    wrong = {**V2, "dispatch_max_query_len": {"batch": ["0.28.0", "0.29.0", "0.30.0", "0.31.0"]},
             "capture_max_query_len": {"descriptor": ["0.28.0", "0.29.0", "0.30.0", "0.31.0"]}}
    found = disagreements({"0.31.0": ("none_with_prefill", "descriptor_or_uniform")}, wrong)
    assert len(found) == 2 and all(f.startswith("0.31.0:") for f in found)
    assert disagreements({"0.31.0": ("none_with_prefill", "descriptor_or_uniform")}, V2) == []
