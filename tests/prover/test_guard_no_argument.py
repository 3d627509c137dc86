"""A guard that takes no argument (sglang 0.5.18+'s ``_should_disable_scheduler_metadata_precompute()``, which reads
``get_parallel()``) is refused as bad input (exit 2) with a pointer to ``gate --engine sglang-src=PATH``, instead of
an import error or a GUARD_RAISED on every check (spec/model/guards.py ``check_guard_signature``,
``call_signature_problem``). A file guard is refused from its source, before anything of it runs."""

import os
import subprocess
import sys
import textwrap

import pytest

from spec.model import guards
from spec.model.guards import GuardSpecError, call_signature_problem, engine_hint, load_guard

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FUNC = "_should_disable_scheduler_metadata_precompute"

#: The 0.5.18+ shape (flashattention_backend.py): an import the tool's environment lacks, a no-argument guard, and
#: a marker written if the module were ever executed.
RELEASE_SHAPE = textwrap.dedent(f"""\
    import pathlib
    pathlib.Path(__file__).with_name("IMPORTED").write_text("imported")
    from sglang.srt.runtime_context import get_parallel


    def {FUNC}() -> bool:
        return bool(get_parallel().enable_prefill_cp or get_parallel().attn_dp_enabled)
    """)


def _checkout(tmp_path, source=RELEASE_SHAPE):
    d = tmp_path / "python" / "sglang" / "srt" / "layers" / "attention"
    d.mkdir(parents=True)
    (d / "flashattention_backend.py").write_text(source)
    return d / "flashattention_backend.py"


def test_the_release_shaped_guard_is_exit_2_pointing_to_the_checkout_without_running_it(tmp_path):
    path = _checkout(tmp_path)
    spec = f"python/sglang/srt/layers/attention/flashattention_backend.py:{FUNC}"
    proc = subprocess.run([sys.executable, "-m", "fa3verify", "gate", "--guard", spec, "--cases", "1"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert f"{FUNC} takes no argument" in lines[0]
    assert lines[0].endswith("fa3verify gate --engine sglang-src=python")
    assert not (path.parent / "IMPORTED").exists()  # refused from the source: nothing of the file ran


def test_an_importable_no_argument_module_guard_is_refused_by_its_signature_not_guard_raised(tmp_path, monkeypatch):
    (tmp_path / "noarg_guard_mod.py").write_text("def should_disable():\n    return False\n"
                                                 "def needs_two(a, b):\n    return False\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(GuardSpecError, match=r"should_disable takes no argument.*--engine sglang-src=PATH"):
        load_guard("noarg_guard_mod:should_disable")
    with pytest.raises(GuardSpecError, match=r"needs_two cannot be called with one argument"):
        load_guard("noarg_guard_mod:needs_two")


def test_a_decorated_file_guard_is_left_to_its_imported_signature(tmp_path):
    """The source check only decides plain definitions; a wrapped one is judged after the guard child imports it."""
    f = tmp_path / "wrapped.py"
    f.write_text("import functools\n\ndef deco(fn):\n    @functools.wraps(fn)\n    def w():\n        return fn()\n"
                 "    return w\n\n@deco\ndef guard():\n    return False\n")
    assert guards.file_guard_signature_problem(str(f), "guard") is None
    with pytest.raises(GuardSpecError, match="guard takes no argument"):
        load_guard(f"{f}:guard")


def test_negative_control_one_argument_guards_load_and_run(tmp_path):
    """Guards of the ServerArgs form keep working: a file guard in the same layout, defaults and *args allowed."""
    src = f"def {FUNC}(server_args, strict=False):\n    return bool(getattr(server_args, 'enable_dp_attention', 0))\n"
    path = _checkout(tmp_path, src)
    g = load_guard(f"{path}:{FUNC}")
    try:
        assert guards.evaluate_guard(g, guards.SimpleNamespace(enable_dp_attention=True)) is True
    finally:
        g.close()
    for fn in (lambda server_args: True, lambda *a: True, lambda s, t=1, *, k=2: True):
        assert call_signature_problem(fn) is None
    assert call_signature_problem(lambda: True) == "takes no argument"
    assert call_signature_problem(lambda *, k: True).startswith("cannot be called with one argument")


def test_the_engine_hint_names_the_folder_holding_sglang():
    assert engine_hint("python/sglang/srt/layers/attention/flashattention_backend.py") == "sglang-src=python"
    assert engine_hint("/w/sg/python/sglang/srt/x.py") == "sglang-src=/w/sg/python"
    assert engine_hint("mypkg/guard.py") == "sglang-src=PATH"
