"""Tests of gpu_impl.guards: built-in guard semantics, --guard spec loading, legacy ServerArgs."""

import itertools
from pathlib import Path
from types import SimpleNamespace

import pytest

from spec.model.config import ServerConfig
from spec.model.guards import (
    BUILTIN_GUARDS,
    GUARD_FLAGS,
    GuardRaised,
    GuardSpecError,
    evaluate_guard,
    guard_disables_precompute,
    legacy_server_args_variants,
    load_guard,
    no_guard,
    prefix_guard_dp_only,
    server_args_namespace,
    should_disable_scheduler_metadata_precompute,
)

REPO = Path(__file__).resolve().parent.parent.parent
EXAMPLES = REPO / "examples" / "guards"
FLAG_COMBOS = list(itertools.product([False, True], repeat=2))


@pytest.mark.parametrize("prefill_cp,dp_attention", FLAG_COMBOS)
def test_builtin_guard_semantics(prefill_cp, dp_attention):
    args = SimpleNamespace(enable_prefill_cp=prefill_cp, enable_dp_attention=dp_attention)
    assert should_disable_scheduler_metadata_precompute(args) is (prefill_cp or dp_attention)
    assert prefix_guard_dp_only(args) is dp_attention
    assert no_guard(args) is False


def test_aliases_resolve_to_builtins():
    assert load_guard("fixed") is should_disable_scheduler_metadata_precompute
    assert load_guard("pre-fix") is prefix_guard_dp_only
    assert load_guard("none") is no_guard
    assert set(BUILTIN_GUARDS) == {"fixed", "pre-fix", "none"}


def test_module_spec_loads():
    assert load_guard("gpu_impl.guards:prefix_guard_dp_only") is prefix_guard_dp_only


@pytest.mark.parametrize("name,builtin", [("prefix_guard.py", "pre-fix"),
                                          ("fixed_guard.py", "fixed")])
def test_example_files_match_builtins(name, builtin, monkeypatch):
    monkeypatch.chdir(REPO)
    guard = load_guard(f"examples/guards/{name}:should_disable")
    for prefill_cp, dp_attention in FLAG_COMBOS:
        args = SimpleNamespace(enable_prefill_cp=prefill_cp, enable_dp_attention=dp_attention)
        assert evaluate_guard(guard, args) == BUILTIN_GUARDS[builtin](args)
    assert load_guard(f"{EXAMPLES / name}:should_disable")  # absolute path works too


def test_spec_errors_name_the_problem(tmp_path):
    not_callable = tmp_path / "nc.py"
    not_callable.write_text("should_disable = 3\ndef other(a):\n    return True\n")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom at import')\n")
    cases = [
        ("gpu_impl.guards", r"missing ':'"),
        ("", r"non-empty string"),
        (f"{tmp_path}/absent.py:f", r"file not found"),
        ("no_such_pkg_zz.mod:f", r"module 'no_such_pkg_zz.mod' is not importable"),
        ("gpu_impl.guards:missing_fn", r"has no attribute 'missing_fn'.*no_guard"),
        (f"{not_callable}:should_disable", r"is a int, not callable"),
        (f"{not_callable}:", r"is not a function name"),
        (f"{not_callable}:1x", r"is not a function name"),
        (":f", r"nothing before ':'"),
        ("bad name!:f", r"neither a dotted module name nor a .py path"),
        (f"{broken}:f", r"raised RuntimeError: boom at import"),
    ]
    for spec, pattern in cases:
        with pytest.raises(GuardSpecError, match=pattern):
            load_guard(spec)
    assert issubclass(GuardSpecError, ValueError)
    assert evaluate_guard(load_guard(f"{not_callable}:other"), SimpleNamespace()) is True


def test_guard_reading_a_missing_flag_raises_guard_raised_naming_it():
    def naive(server_args):
        return server_args.enable_prefill_cp or server_args.enable_dp_attention

    cfg = ServerConfig(tp_size=2, attn_cp_size=2, enable_prefill_cp=True, cp_strategy="zigzag")
    for variant in legacy_server_args_variants(cfg):
        first_read = "enable_prefill_cp"
        if first_read in variant.missing:
            with pytest.raises(GuardRaised, match="'enable_prefill_cp'") as err:
                evaluate_guard(naive, variant.args)
            assert err.value.missing_attribute == "enable_prefill_cp"
        else:  # enable_prefill_cp is True, so `or` never reads the missing dp flag
            assert evaluate_guard(naive, variant.args) is True


def test_other_exceptions_become_guard_raised():
    def bad(server_args):
        raise ZeroDivisionError("x")

    with pytest.raises(GuardRaised, match="ZeroDivisionError") as err:
        evaluate_guard(bad, SimpleNamespace())
    assert err.value.missing_attribute is None


def test_legacy_variants_lack_each_flag_and_builtins_never_raise():
    cfg = ServerConfig(tp_size=4, dp_size=2, enable_dp_attention=True)
    variants = list(legacy_server_args_variants(cfg))
    assert [sorted(v.missing) for v in variants] == [
        ["enable_prefill_cp"], ["enable_dp_attention"], sorted(GUARD_FLAGS)]
    for v in variants:
        for flag in GUARD_FLAGS:
            assert hasattr(v.args, flag) == (flag not in v.missing)
        for guard in BUILTIN_GUARDS.values():
            result = evaluate_guard(guard, v.args)
            assert result == (("enable_dp_attention" not in v.missing) and guard is not no_guard)


def test_namespace_uses_sglang_names():
    cfg = ServerConfig(cuda_graph=True, enable_prefill_cp=True, cp_strategy="zigzag",
                       tp_size=2, attn_cp_size=2)
    ns = server_args_namespace(cfg)
    assert ns.disable_cuda_graph is False and ns.enable_prefill_cp is True
    assert guard_disables_precompute(load_guard("fixed"), cfg) is True
    assert guard_disables_precompute(load_guard("pre-fix"), cfg) is False
