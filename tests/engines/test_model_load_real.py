"""The model-load head split on real sglang releases (marked ``engine``; 0.5.13 and 0.5.23, the environments
``make engines`` builds; a release without its environment skips, naming the command): the release's own
``Qwen3Attention.__init__`` refuses falcon-7b's 71 heads on ``tp_size 2`` with its own assert, which its
ServerArgs accepts, and the release's domain counts that configuration under the release's message. Negative
control: a source copy of 0.5.23 whose head-split assert is removed accepts it (the verdict is the release's code,
not ours)."""

from __future__ import annotations

import pytest

from gpu_impl.config import MODELS, ServerConfig
from gpu_impl.sut import open_sut
from engine_releases import need_sglang, sweep
from release_copies import patched_copy

pytestmark = pytest.mark.engine

CHECK = "model load (srt/models/qwen3.py Qwen3Attention.__init__): AssertionError: "
#: the assert each release's qwen3.py fails on 71 heads over attn_tp_size 2, by its source line
HEADS_ASSERT = {"0.5.13": "assert self.total_num_heads % attn_tp_size == 0 (qwen3.py line 87)",
                #: 0.5.16 reads get_server_args() after its split (counted as its rejection before, by mistake)
                "0.5.16": "assert self.total_num_heads % attn_tp_size == 0 (qwen3.py line 89)",
                "0.5.23": "assert self.total_num_heads % attn_tp_size == 0 (qwen3.py line 166)"}
#: the copy's patch: the query-head assert of 0.5.23's Qwen3Attention.__init__ removed
NO_HEADS_ASSERT = ((r"\n        assert self\.total_num_heads % attn_tp_size == 0\n", "\n"),)
MODEL_PY = "srt/models/qwen3.py"


@pytest.mark.parametrize("release", sweep(sorted(HEADS_ASSERT)))
def test_the_release_refuses_71_heads_on_tp_2_at_model_load_with_its_own_assert(release, engine_sut):
    need_sglang(release)
    falcon = MODELS["falcon-7b"]
    with engine_sut(f"sglang=={release}") as sut:  # the test process's shared worker (tests/engine_pool.py)
        assert sut.validate(ServerConfig(tp_size=2), falcon) == (False, CHECK + HEADS_ASSERT[release])
        # the same heads on attn_tp_size 1 load; 6 KV heads do not split over attn_tp_size 4
        assert sut.validate(ServerConfig(tp_size=2, attn_cp_size=2), falcon)[0] is True
        kv6 = {"name": "kv-6", "num_heads": 24, "num_kv_heads": 6, "head_dim": 128}
        ok, message = sut.validate(ServerConfig(tp_size=4), kv6)
        assert ok is False and message.startswith(CHECK + "assert self.total_num_kv_heads % attn_tp_size == 0")
        dom = sut.domain()
        assert dom.admit(ServerConfig(tp_size=2), falcon) == CHECK + HEADS_ASSERT[release]


def test_a_copy_without_the_head_split_assert_accepts_what_the_release_refuses(tmp_path):
    need_sglang("0.5.23")
    root = patched_copy("0.5.23", tmp_path / "copy", NO_HEADS_ASSERT, module=MODEL_PY)
    with open_sut(f"sglang-src={root}") as sut:
        assert sut.validate(ServerConfig(tp_size=2), MODELS["falcon-7b"])[0] is True
        # its KV-head assert is the release's own still
        ok, message = sut.validate(ServerConfig(tp_size=4), {"name": "kv-6", "num_heads": 24, "num_kv_heads": 6,
                                                             "head_dim": 128})
        assert ok is False and "total_num_kv_heads" in message
