"""Pins of spec/model/guards.py: what a user of the guard loader sees.

Each test pins one observable: the verdict a guard gives on a configuration (the built-in guards against sglang's
own released code, read from the cached engine environments), the exact exit-2 message a bad ``--guard`` spec
gets, what a guard function receives (``server_args_namespace``), how a guard fault is reported, and that a guard
file is loaded in process (``load_guard_in_process``, the guard child's path) as its own module without running
anything the user did not name. The loads run in this process on purpose: mutmut only counts tests that reach
the mutated function in the test process, and the IsolatedGuard path loads in a child.
"""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from spec.model.config import ServerConfig
from spec.model.guards import (
    GuardRaised,
    GuardSpecError,
    evaluate_guard,
    is_bool,
    is_builtin_guard,
    load_guard,
    load_guard_in_process,
    server_args_namespace,
)

FLAG_COMBOS = list(itertools.product([False, True], repeat=2))


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def _spec_error(spec) -> str:
    with pytest.raises(GuardSpecError) as err:
        load_guard_in_process(spec)
    return str(err.value)


# ---- the built-in guards against sglang's released flashattention_backend.py -----------------------------------

def _backend_source(release: str) -> str | None:
    from gpu_impl.engines.envs import env_dir

    found = sorted(env_dir(release).glob(
        "lib/python*/site-packages/sglang/srt/layers/attention/flashattention_backend.py"))
    return found[0].read_text() if found else None


#: Marks a release whose flashattention_backend.py has no scheduler-metadata guard (0.5.11: PR #21104's precompute
#: ran everywhere).
NO_RELEASED_GUARD = object()


def _released_guard(release: str):
    """sglang's own guard of ``release`` as a function of server_args, compiled from the installed file (read only).

    0.5.12-0.5.14 assign ``self._disable_scheduler_metadata_precompute = bool(getattr(server_args,
    "enable_dp_attention", False))`` in ``FlashAttentionBackend.__init__``; 0.5.15-0.5.17 define
    ``_should_disable_scheduler_metadata_precompute(server_args)`` at module level (0.5.18+ read get_parallel()
    instead of server_args: not a function of ServerArgs, docs/facts-engines.md). None when the environment is not cached.
    """
    text = _backend_source(release)
    if text is None:
        return None
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "_should_disable_scheduler_metadata_precompute":
            namespace: dict = {}
            exec(compile(ast.Module(body=[node], type_ignores=[]), "<sglang guard>", "exec"), namespace)
            return namespace[node.name]
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute)
                and node.targets[0].attr == "_disable_scheduler_metadata_precompute"):
            code = compile(ast.Expression(body=node.value), "<sglang guard>", "eval")
            return lambda server_args: eval(code, {"server_args": server_args})
    assert "scheduler_metadata_precompute" not in text, f"sglang {release}: a guard this test does not recognise"
    return NO_RELEASED_GUARD


@pytest.mark.parametrize("release,alias", [("0.5.11", "none")]
                         + [(r, "pre-fix") for r in ("0.5.12", "0.5.13", "0.5.14")]
                         + [(r, "fixed") for r in ("0.5.15", "0.5.16", "0.5.17")])
def test_builtin_guards_give_the_released_sglang_verdict_on_every_flag_combination(release, alias):
    theirs = _released_guard(release)
    if theirs is None:
        pytest.skip(f"sglang {release} engine environment not cached")
    if theirs is NO_RELEASED_GUARD:
        theirs = lambda server_args: False  # noqa: E731 -- no guard: the precompute is never disabled
    ours = load_guard(alias)
    for prefill_cp, dp_attention in FLAG_COMBOS:
        args = server_args_namespace(ServerConfig(enable_prefill_cp=prefill_cp, enable_dp_attention=dp_attention))
        assert evaluate_guard(ours, args) is theirs(args), (release, prefill_cp, dp_attention)


def test_server_args_namespace_names_are_fields_of_sglang_server_args():
    from gpu_impl.engines.envs import env_dir

    found = sorted(env_dir("0.5.17").glob("lib/python*/site-packages/sglang/srt/server_args.py"))
    if not found:
        pytest.skip("sglang 0.5.17 engine environment not cached")
    cls = next(n for n in ast.parse(found[0].read_text()).body
               if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    fields = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert set(vars(server_args_namespace(ServerConfig()))) <= fields


# ---- what a guard receives -----------------------------------------------------------------------------------

def test_a_guard_receives_every_server_args_field_with_the_configuration_values():
    cfg = ServerConfig(tp_size=8, dp_size=2, attn_cp_size=2, enable_dp_attention=True, enable_prefill_cp=True,
                       cp_strategy="zigzag", page_size=64, enable_deterministic_inference=True, cuda_graph=True,
                       context_length=4096)
    seen = []
    evaluate_guard(lambda args: seen.append(vars(args).copy()) or False, server_args_namespace(cfg))
    assert seen == [{"tp_size": 8, "dp_size": 2, "attn_cp_size": 2, "enable_dp_attention": True,
                     "enable_prefill_cp": True, "cp_strategy": "zigzag", "page_size": 64,
                     "enable_deterministic_inference": True, "disable_cuda_graph": False,
                     "context_length": 4096}]


# ---- exit-2 messages of bad specs ----------------------------------------------------------------------------

def test_a_spec_that_is_not_a_non_empty_string_is_refused_as_such():
    assert _spec_error(None) == "guard spec must be a non-empty string, got None"
    assert _spec_error("") == "guard spec must be a non-empty string, got ''"
    assert _spec_error("  ") == "guard spec must be a non-empty string, got '  '"


def test_the_function_name_is_what_follows_the_last_colon():
    assert _spec_error("a:b:f") == "guard spec 'a:b:f': 'a:b' is neither a dotted module name nor a .py path"
    with pytest.raises(GuardSpecError) as err:
        load_guard("a:b:f")
    assert str(err.value) == "guard spec 'a:b:f': 'a:b' is neither a dotted module name nor a .py path"


def test_a_guard_file_in_a_directory_with_a_colon_loads(tmp_path):
    path = _write(tmp_path / "ranks:2" / "my_guard.py", """
        def my_guard(server_args):
            return server_args.attn_cp_size > 1
        """)
    guard = load_guard_in_process(f"{path}:my_guard")
    assert evaluate_guard(guard, server_args_namespace(ServerConfig(tp_size=2, attn_cp_size=2))) is True
    assert evaluate_guard(guard, server_args_namespace(ServerConfig())) is False


@pytest.mark.parametrize("target", ["guards/my_guard", "guards\\my_guard", "no_such_guard_file.py"])
def test_a_target_with_a_slash_backslash_or_py_suffix_is_a_path(target, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = f"{target}:guard"
    expected = f"guard spec {spec!r}: file not found: {target}"
    assert _spec_error(spec) == expected
    with pytest.raises(GuardSpecError) as err:
        load_guard(spec)
    assert str(err.value) == expected


def test_a_file_python_cannot_load_as_a_module_is_refused(tmp_path):
    path = _write(tmp_path / "guard.txt", "def guard(server_args):\n    return True\n")
    spec = f"{path}:guard"
    assert _spec_error(spec) == f"guard spec {spec!r}: cannot load {path} as a Python module"


def test_a_guard_file_that_raises_while_importing_names_the_error_and_leaves_no_module(tmp_path):
    path = _write(tmp_path / "broken_guard.py", """
        def guard(server_args):
            return True
        raise RuntimeError("bad file")
        """)
    spec = f"{path}:guard"
    assert _spec_error(spec) == f"guard spec {spec!r}: importing {path} raised RuntimeError: bad file"
    assert not any(getattr(m, "__file__", None) == str(path) for m in list(sys.modules.values()))


def test_a_guard_file_that_unregisters_itself_and_raises_is_still_a_spec_error(tmp_path):
    path = _write(tmp_path / "vanishing_guard.py", """
        import sys
        sys.modules.pop(__name__)
        raise ValueError("gone")
        """)
    spec = f"{path}:guard"
    assert _spec_error(spec) == f"guard spec {spec!r}: importing {path} raised ValueError: gone"


def test_a_module_that_raises_while_importing_names_the_error(tmp_path, monkeypatch):
    _write(tmp_path / "fa3v_pin_boom_guard.py", "raise ValueError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _spec_error("fa3v_pin_boom_guard:guard") == (
        "guard spec 'fa3v_pin_boom_guard:guard': importing module 'fa3v_pin_boom_guard' raised "
        "ValueError: boom at import")


def test_a_module_that_does_not_exist_is_not_importable():
    assert _spec_error("fa3v_pin_no_such_module:guard") == (
        "guard spec 'fa3v_pin_no_such_module:guard': module 'fa3v_pin_no_such_module' is not importable "
        "(No module named 'fa3v_pin_no_such_module')")


def test_a_missing_function_lists_the_public_callables_only(tmp_path):
    path = _write(tmp_path / "some_guards.py", """
        GAMMA = 3
        def alpha(server_args):
            return True
        def _beta(server_args):
            return False
        class Delta:
            pass
        """)
    spec = f"{path}:nope"
    assert _spec_error(spec) == (f"guard spec {spec!r}: {path} has no attribute 'nope'; "
                                 f"callables there: ['Delta', 'alpha']")
    spec = f"{path}:GAMMA"
    assert _spec_error(spec) == f"guard spec {spec!r}: {path}:GAMMA is a int, not callable"


# ---- a guard file is its own module, and nothing the user did not name runs ----------------------------------

def test_each_guard_file_is_its_own_registered_module_and_no_main_block_runs(tmp_path):
    marker = tmp_path / "main_ran"
    first = _write(tmp_path / "a" / "guard.py", f"""
        def guard(server_args):
            return True
        if __name__ == "__main__":
            open({str(marker)!r}, "w").write("ran")
        """)
    second = _write(tmp_path / "b" / "guard.py", """
        def guard(server_args):
            return False
        """)
    g1 = load_guard_in_process(f"{first}:guard")
    g2 = load_guard_in_process(f"{second}:guard")
    assert not marker.exists()
    assert g1.__module__ != g2.__module__
    # pickle, dataclasses and inspect find a function's module through sys.modules[__module__]
    assert sys.modules[g1.__module__].__file__ == str(first)
    assert sys.modules[g2.__module__].__file__ == str(second)
    args = server_args_namespace(ServerConfig())
    assert (evaluate_guard(g1, args), evaluate_guard(g2, args)) == (True, False)


# ---- how a guard fault is reported ---------------------------------------------------------------------------

class LegacyArgs:
    """A ServerArgs of an older release: no enable_prefill_cp."""


def reads_prefill_cp(server_args):
    return server_args.enable_prefill_cp


def raises_nameless_attribute_error(server_args):
    raise AttributeError("custom")


def raises_value_error(server_args):
    raise ValueError("bad value")


#: A user's exception class that only shares the builtin's name (not an AttributeError subclass). The guard child
#: reports a fault by its class name across the process boundary (spec/model/guard_child.py), so the in-process report
#: keys on the name too: both give the same message.
LookalikeAttributeError = type("AttributeError", (Exception,), {})


def raises_a_lookalike(server_args):
    raise LookalikeAttributeError("not the builtin")


def returns_one(server_args):
    return 1


def test_a_guard_reading_a_missing_flag_is_reported_with_the_flag_and_the_args_type():
    with pytest.raises(GuardRaised) as err:
        evaluate_guard(reads_prefill_cp, LegacyArgs())
    assert str(err.value) == (
        "guard reads_prefill_cp raised AttributeError reading attribute 'enable_prefill_cp' from LegacyArgs "
        "('LegacyArgs' object has no attribute 'enable_prefill_cp'); older sglang ServerArgs may lack it -- read "
        "flags with getattr(server_args, NAME, False)")
    assert err.value.missing_attribute == "enable_prefill_cp"


def test_an_attribute_error_without_a_name_says_an_attribute():
    with pytest.raises(GuardRaised) as err:
        evaluate_guard(raises_nameless_attribute_error, LegacyArgs())
    assert str(err.value) == (
        "guard raises_nameless_attribute_error raised AttributeError reading an attribute from LegacyArgs "
        "(custom); older sglang ServerArgs may lack it -- read flags with getattr(server_args, NAME, False)")
    assert err.value.missing_attribute is None


def test_another_exception_is_reported_by_its_class_name_and_message():
    with pytest.raises(GuardRaised) as err:
        evaluate_guard(raises_value_error, LegacyArgs())
    assert str(err.value) == "guard raises_value_error raised ValueError: bad value"
    with pytest.raises(GuardRaised) as err:
        evaluate_guard(raises_a_lookalike, LegacyArgs())
    assert str(err.value) == (
        "guard raises_a_lookalike raised AttributeError reading an attribute from LegacyArgs (not the builtin); "
        "older sglang ServerArgs may lack it -- read flags with getattr(server_args, NAME, False)")


def test_a_guard_without_a_qualname_is_named_by_its_repr():
    guard = functools.partial(raises_value_error)
    with pytest.raises(GuardRaised) as err:
        evaluate_guard(guard, LegacyArgs())
    assert str(err.value) == f"guard {guard!r} raised ValueError: bad value"


def test_a_non_bool_result_is_refused_naming_its_type():
    with pytest.raises(GuardRaised) as err:
        evaluate_guard(returns_one, LegacyArgs())
    assert str(err.value) == ("guard returns_one returned a int, not a bool: the backend would treat it as True "
                              "whatever it means; return True or False")


def test_an_async_guard_is_refused_and_its_coroutine_closed():
    async def decide(server_args):
        return True

    made = []

    def async_guard(server_args):
        made.append(decide(server_args))
        return made[-1]

    with pytest.raises(GuardRaised, match="returned a coroutine, not a bool"):
        evaluate_guard(async_guard, LegacyArgs())
    assert inspect.getcoroutinestate(made[0]) == inspect.CORO_CLOSED


def test_numpy_bools_are_bools_and_other_numpy_scalars_or_lookalikes_are_not():
    assert evaluate_guard(lambda a: np.True_, LegacyArgs()) is True
    assert evaluate_guard(lambda a: np.False_, LegacyArgs()) is False
    for value in (np.int64(1), np.float32(0.0), type("bool", (), {})()):
        with pytest.raises(GuardRaised, match="not a bool"):
            evaluate_guard(lambda a, v=value: v, LegacyArgs())
    # numpy.bool_ is the bool scalar type in numpy 1.x (pyproject allows numpy>=1.26) and 2 (where numpy.bool is
    # the same class): the check is isinstance, so a class that only borrows the name is not a bool
    assert is_bool(np.bool_(True)) is True and is_bool(np.array(True)) is False
    assert is_bool(type("bool_", (), {"__module__": "numpy"})()) is False
    assert is_bool(type("bool", (), {"__module__": "numpy"})()) is False


def test_only_strings_can_name_a_builtin_guard():
    assert is_builtin_guard(None) is False
    assert is_builtin_guard(3) is False
    assert is_builtin_guard(" fixed ") is True
    assert is_builtin_guard("spec.model.guards:no_guard") is True
    assert is_builtin_guard("spec.model.guards:no_guard:x") is False
