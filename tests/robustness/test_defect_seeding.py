"""Seeded defects are transformations applied from outside (gpu_impl.defects, gpu_impl.seeded_defects).

The backend, the scenario runner and the emulated kernel name no defect: every backend- and kernel-layer defect is
a mixin that overrides one step, every policy-layer one rewrites the scenario's policy. Each check here has its
negative control: the unseeded system behaves as before.
"""

import ast
import copy
import pickle
from pathlib import Path

import pytest

from gpu_impl.backend import FlashAttentionBackend
from gpu_impl.config import MODELS, ServerConfig
from gpu_impl.defects import DEFECTS, apply_policy_defects, seed_backend, seed_kernel, seed_run
from gpu_impl.guards import load_guard
from gpu_impl.kernels import load
from gpu_impl.kernels.emulated import EmulatedKernel
from gpu_impl.scenario import Scenario, Step
from gpu_impl.seeded_defects.backend import BACKEND_SEEDS
from gpu_impl.seeded_defects.kernel import KERNEL_SEEDS

ROOT = Path(__file__).resolve().parents[2]
SUT_SOURCES = ("gpu_impl/backend.py", "gpu_impl/scenario.py", "gpu_impl/kernels/emulated.py")


def defect_checks(source: str) -> list:
    """Defect names in the code (string constants outside docstrings) and ``... in <x>.defects`` tests."""
    found = []
    tree = ast.parse(source)
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found += [name for name in DEFECTS if name in node.value]
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            found += [f"in .{c.attr}" for c in node.comparators if isinstance(c, ast.Attribute) and c.attr == "defects"]
    return sorted(found)


@pytest.mark.parametrize("path", SUT_SOURCES)
def test_the_system_under_test_checks_no_defect(path):
    assert defect_checks((ROOT / path).read_text()) == [], path


def test_the_structural_check_sees_a_defect_check():
    # negative control of the check above: the old hot-path forms are caught, comments and docstrings are not
    assert defect_checks('if "call-not-varlen" in self.defects:\n    pass\n') == ["call-not-varlen", "in .defects"]
    assert defect_checks('x = name not in backend.defects\n') == ["in .defects"]
    assert defect_checks('"""the call-not-varlen defect"""\n# graph-metadata-new-buffer\n') == []


def test_every_backend_and_kernel_defect_has_one_transformation():
    for name, d in DEFECTS.items():
        if d.layer == "backend":
            assert name in BACKEND_SEEDS, name
        if d.layer == "kernel":
            assert name in KERNEL_SEEDS, name
    assert set(BACKEND_SEEDS) <= {n for n, d in DEFECTS.items() if d.layer in ("backend", "kernel")}
    assert set(KERNEL_SEEDS) == {n for n, d in DEFECTS.items() if d.layer == "kernel"}


def _scenario(cuda_graph=True, defects=(), guard="fixed"):
    server = ServerConfig(tp_size=2, cuda_graph=cuda_graph)
    return Scenario(server=server, model=MODELS["llama-3-8b"], guard=load_guard(guard), guard_spec=guard,
                    steps=[Step("decode", [8000, 5])], defects=frozenset(defects))


def test_every_policy_defect_rewrites_the_policy():
    scn = _scenario()
    for name, d in DEFECTS.items():
        if d.layer == "policy":
            assert apply_policy_defects(scn, {name}) != scn, name
    assert apply_policy_defects(scn, set()) is scn


def test_a_seeded_backend_overrides_only_its_step():
    server = ServerConfig(tp_size=2, cuda_graph=True)
    plain = FlashAttentionBackend(server, MODELS["llama-3-8b"], load_guard("fixed"))
    seeded = seed_backend(plain, {"graph-split-count-from-capture"})
    assert isinstance(seeded, FlashAttentionBackend) and seeded.defects == {"graph-split-count-from-capture"}
    assert plain.defects == frozenset() and type(plain) is FlashAttentionBackend
    (call,) = seeded.decode_calls([[8000, 5]])
    (fresh,) = plain.decode_calls([[8000, 5]])
    assert fresh.call_num_splits is None and call.call_num_splits is not None
    assert call.launch_num_splits != fresh.launch_num_splits
    # policy and caller names leave the backend itself
    assert seed_backend(plain, {"runner-keeps-stale-cp-metadata", "cascade-prefix-metadata-batch-size"}) is plain


def test_call_not_varlen_is_metadata_level_only():
    server = ServerConfig(tp_size=2)
    plain = FlashAttentionBackend(server, MODELS["llama-3-8b"], load_guard("fixed"))
    seeded = seed_backend(plain, {"call-not-varlen"})
    (call,) = plain.decode_calls([[300, 5]])
    assert plain.call_inputs(call).varlen_q and plain.metadata_only is None
    assert not seeded.call_inputs(call).varlen_q and seeded.metadata_only


def test_a_seeded_kernel_copies_and_pickles_as_its_base_plus_names():
    kernel = load("emulated", mode="gpu-like", num_sm=16)
    one = kernel.with_defects({"combine-no-neg-inf-guard"})
    two = one.with_defects({"finite-mask-sentinel"})
    assert type(kernel) is EmulatedKernel and kernel.defects == frozenset() and EmulatedKernel.defects == frozenset()
    assert isinstance(two, EmulatedKernel) and two.defects == {"combine-no-neg-inf-guard", "finite-mask-sentinel"}
    for twin in (pickle.loads(pickle.dumps(two)), copy.copy(two), copy.deepcopy(two), two.with_num_sm(8)):
        assert type(twin) is type(two) and twin.defects == two.defects
    assert two.with_num_sm(8).num_sm == 8 and two.num_sm == 16
    assert "seeded defects: combine-no-neg-inf-guard, finite-mask-sentinel" in two.describe()
    assert "seeded" not in kernel.describe()
    with pytest.raises(ValueError, match="not kernel-layer"):
        seed_kernel(kernel, {"call-not-varlen"})


def test_seed_run_applies_every_layer_and_refuses_a_kernel_it_cannot_seed():
    scn = _scenario(defects={"runner-keeps-stale-cp-metadata", "graph-metadata-new-buffer", "finite-mask-sentinel"})
    kernel = load("emulated", mode="gpu-like")

    def make(s):
        return FlashAttentionBackend(s.server, s.model, s.guard, s.metadata_heads)

    seeded_scn, backend, seeded_kernel = seed_run(scn, make, kernel)
    assert seeded_scn.clear_stale_cp_metadata is False and scn.clear_stale_cp_metadata is True
    assert "graph-metadata-new-buffer" in backend.defects
    assert seeded_kernel.defects == {"finite-mask-sentinel"} and kernel.defects == frozenset()

    class NoSeeding:
        name = "opaque"

    with pytest.raises(ValueError, match="kernel 'opaque' cannot seed"):
        seed_run(scn, make, NoSeeding())
    # negative control: no defects, nothing is replaced
    plain_scn, plain_backend, plain_kernel = seed_run(_scenario(), make, kernel)
    assert type(plain_backend) is FlashAttentionBackend and plain_kernel is kernel
