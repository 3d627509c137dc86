"""Guards deciding whether the FA3 backend skips its scheduler-metadata precompute.

A guard is a callable ``guard(server_args) -> bool`` over an sglang ``ServerArgs``-like object;
True means "do not precompute ``scheduler_metadata``" (FA3 then schedules every call itself).
The three built-in guards model the history of ``FlashAttentionBackend.__init__`` in
``python/sglang/srt/layers/attention/flashattention_backend.py``:

* ``none``    -- no guard: the precompute added by sglang PR #21104 ran everywhere.
* ``pre-fix`` -- ``_disable_scheduler_metadata_precompute = bool(getattr(server_args,
  "enable_dp_attention", False))``: DP attention only.
* ``fixed``   -- PR #30439's ``_should_disable_scheduler_metadata_precompute``: prefill CP or DP
  attention.

Users may point ``--guard`` at their own function (``package.module:function`` or
``path/to/file.py:function``); :func:`load_guard` resolves it to an
:class:`spec.model.guard_isolation.IsolatedGuard` (imported and called in a child process with a deadline, so
``sys.exit``/``os._exit``/a hang cannot end the tool) and :func:`evaluate_guard` runs it, turning an exception,
a non-bool result or a missed deadline into :class:`GuardRaised` (:class:`GuardTimeout`).

A guard that cannot be called as ``guard(server_args)`` -- from sglang 0.5.18 ``_should_disable_scheduler_metadata_
precompute()`` in ``flashattention_backend.py`` takes no argument and reads ``get_parallel()`` -- is refused as
bad input (:func:`call_signature_problem`), pointing to ``gate --engine sglang-src=PATH``, which runs that code in
the release's own parallel state: a file guard by reading its source (nothing is imported), a module guard by
its signature once the guard child has imported it.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator, NamedTuple

from spec.model.config import ServerConfig
from spec.model.guard_errors import (GUARD_FAULTS, GuardRaised, GuardSpecError, GuardTimeout,  # noqa: F401
                                     bad_return_message, guard_raised_message)

Guard = Callable[[Any], Any]

#: The ServerArgs flags the built-in guards read; older sglang versions lack some of them.
GUARD_FLAGS = ("enable_prefill_cp", "enable_dp_attention")


def is_bool(value: Any) -> bool:
    """Whether a guard's result is a real bool (Python or numpy), not merely truthy."""
    numpy = sys.modules.get("numpy")  # a numpy result means numpy is imported; never imported here for it
    return isinstance(value, bool) or (numpy is not None and isinstance(value, numpy.bool_))


def should_disable_scheduler_metadata_precompute(server_args: Any) -> bool:
    """The fixed guard of sglang PR #30439 (flashattention_backend.py): prefill CP or DP attention."""
    return bool(
        getattr(server_args, "enable_prefill_cp", False)
        or getattr(server_args, "enable_dp_attention", False)
    )


def prefix_guard_dp_only(server_args: Any) -> bool:
    """The guard before PR #30439 (flashattention_backend.py): only DP attention disables it."""
    return bool(getattr(server_args, "enable_dp_attention", False))


def no_guard(server_args: Any) -> bool:
    """No guard, as right after sglang PR #21104 added the precompute: never disabled."""
    return False


BUILTIN_GUARDS: dict[str, Guard] = {
    "fixed": should_disable_scheduler_metadata_precompute,
    "pre-fix": prefix_guard_dp_only,
    "none": no_guard,
}


#: Modules of this project whose functions a case file may name as its guard without --trust-case-guard: the
#: catalogue's seeded defects and the built-in guards (they run the project's own code, nothing else).
PROJECT_GUARD_MODULES = ("gpu_impl.defects", "gpu_impl.guards", "spec.model.guards")


def is_builtin_guard(spec: str) -> bool:
    """Whether a guard spec names only this project's code (an alias or a function in PROJECT_GUARD_MODULES)."""
    if not isinstance(spec, str):
        return False
    spec = spec.strip()
    if spec in BUILTIN_GUARDS:
        return True
    module, _, func = spec.rpartition(":")
    return module in PROJECT_GUARD_MODULES and func.isidentifier()


def _looks_like_path(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def _load_module_from_file(path_text: str, spec: str):
    path = Path(path_text)
    if not path.is_file():
        raise GuardSpecError(f"guard spec {spec!r}: file not found: {path_text}")
    module_name = f"_fa3verify_guard_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise GuardSpecError(f"guard spec {spec!r}: cannot load {path_text} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:  # the user's file failed while importing
        sys.modules.pop(module_name, None)
        raise GuardSpecError(
            f"guard spec {spec!r}: importing {path_text} raised {type(exc).__name__}: {exc}"
        ) from exc
    return module


def _import_module(module_name: str, spec: str):
    if not module_name or any(not part.isidentifier() for part in module_name.split(".")):
        raise GuardSpecError(
            f"guard spec {spec!r}: {module_name!r} is neither a dotted module name nor a .py path"
        )
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise GuardSpecError(
            f"guard spec {spec!r}: module {module_name!r} is not importable ({exc})"
        ) from exc
    except Exception as exc:
        raise GuardSpecError(
            f"guard spec {spec!r}: importing module {module_name!r} raised "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def load_guard(spec: str) -> Guard:
    """Resolve a ``--guard`` spec: a built-in alias or project guard in process, else an IsolatedGuard (the user's
    code runs in a child process with a deadline)."""
    from spec.model.guard_isolation import IsolatedGuard

    if not isinstance(spec, str) or not spec.strip():
        raise GuardSpecError(f"guard spec must be a non-empty string, got {spec!r}")
    spec = spec.strip()
    if spec in BUILTIN_GUARDS:
        return BUILTIN_GUARDS[spec]
    _check_spec_syntax(spec)
    if is_builtin_guard(spec):  # the project's own guards and seeded defects (objects the engines inspect)
        return load_guard_in_process(spec)
    check_guard_signature(spec)  # a no-argument guard is refused before anything of it is imported
    return IsolatedGuard(spec)


def _check_spec_syntax(spec: str) -> None:
    if ":" not in spec:
        raise GuardSpecError(
            f"guard spec {spec!r}: missing ':' -- use 'package.module:function', "
            f"'path/to/file.py:function' or one of the aliases {sorted(BUILTIN_GUARDS)}"
        )
    target, _, func_name = spec.rpartition(":")
    if not func_name or not func_name.isidentifier():
        raise GuardSpecError(
            f"guard spec {spec!r}: {func_name!r} after ':' is not a function name"
        )
    if not target:
        raise GuardSpecError(f"guard spec {spec!r}: nothing before ':' (module or file path)")
    if _looks_like_path(target):
        if not Path(target).is_file():
            raise GuardSpecError(f"guard spec {spec!r}: file not found: {target}")
    elif any(not part.isidentifier() for part in target.split(".")):
        raise GuardSpecError(
            f"guard spec {spec!r}: {target!r} is neither a dotted module name nor a .py path"
        )


def engine_hint(target: str) -> str:
    """The ``--engine`` form that gates a guard's own code: ``sglang-src=DIR`` when ``target`` (a file path) lies
    under a checkout's ``sglang/srt/`` (DIR: the folder holding ``sglang/``), else ``sglang-src=PATH``."""
    parts = Path(target).parts
    for i in range(len(parts) - 1):
        if parts[i] == "sglang" and parts[i + 1] == "srt":
            return "sglang-src=" + (str(Path(*parts[:i])) if i else ".")
    return "sglang-src=PATH"


def _no_argument_message(spec: str, func_name: str, why: str, target: str) -> str:
    return (f"guard spec {spec!r}: {func_name} {why}, but --guard calls guard(server_args) (sglang 0.5.18+'s "
            f"_should_disable_scheduler_metadata_precompute() takes no argument and reads get_parallel()); gate "
            f"the engine's own code instead: fa3verify gate --engine {engine_hint(target)}")


def call_signature_problem(guard: Any) -> str | None:
    """Why ``guard`` cannot be called with one positional argument (``"takes no argument"``, or the binding
    error), or None when it can or its signature cannot be read (a builtin: its call decides)."""
    try:
        sig = inspect.signature(guard)
    except (TypeError, ValueError):
        return None
    try:
        sig.bind(None)
    except TypeError as exc:
        if not sig.parameters:
            return "takes no argument"
        return f"cannot be called with one argument ({exc})"
    return None


def _bound_names(node: ast.stmt) -> set:
    """Top-level names a statement binds other than by ``def`` (assignments, classes, imports)."""
    if isinstance(node, ast.ClassDef):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
        node, (ast.AnnAssign, ast.AugAssign)) else []
    return {t.id for t in targets if isinstance(t, ast.Name)}


def file_guard_signature_problem(path_text: str, func_name: str) -> str | None:
    """:func:`call_signature_problem` for a top-level ``def func_name`` in a .py file, read from its source
    without importing it; None when the file has no such plain definition (the import then decides)."""
    try:
        tree = ast.parse(Path(path_text).read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return None
    found = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == func_name]
    if len(found) != 1 or found[0].decorator_list or any(func_name in _bound_names(n) for n in tree.body):
        return None  # redefined, rebound or decorated: only the imported object tells
    a = found[0].args
    positional = len(a.posonlyargs) + len(a.args)
    required_kw = [k.arg for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]
    if positional == 0 and a.vararg is None:
        return "takes no argument" if not a.kwonlyargs and a.kwarg is None else "takes no positional argument"
    if required_kw:
        return f"cannot be called with one argument (keyword-only {', '.join(required_kw)} required)"
    if positional - len(a.defaults) > 1:
        return f"cannot be called with one argument (it requires {positional - len(a.defaults)})"
    return None


def check_guard_signature(spec: str) -> None:
    """GuardSpecError for a ``file.py:function`` spec whose function cannot take ``server_args`` (source only)."""
    target, _, func_name = spec.rpartition(":")
    if _looks_like_path(target):
        why = file_guard_signature_problem(target, func_name)
        if why:
            raise GuardSpecError(_no_argument_message(spec, func_name, why, target))


def load_guard_in_process(spec: str) -> Guard:
    """Import a guard spec into this process (the guard child's job; the tool itself uses load_guard)."""
    if not isinstance(spec, str) or not spec.strip():
        raise GuardSpecError(f"guard spec must be a non-empty string, got {spec!r}")
    spec = spec.strip()
    if spec in BUILTIN_GUARDS:
        return BUILTIN_GUARDS[spec]
    _check_spec_syntax(spec)
    target, _, func_name = spec.rpartition(":")
    module = _load_module_from_file(target, spec) if _looks_like_path(target) else _import_module(
        target, spec
    )
    if not hasattr(module, func_name):
        available = sorted(
            n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
        )
        raise GuardSpecError(
            f"guard spec {spec!r}: {target} has no attribute {func_name!r}; "
            f"callables there: {available}"
        )
    guard = getattr(module, func_name)
    if not callable(guard):
        raise GuardSpecError(
            f"guard spec {spec!r}: {target}:{func_name} is a {type(guard).__name__}, not callable"
        )
    why = call_signature_problem(guard)
    if why:
        raise GuardSpecError(_no_argument_message(spec, func_name, why, target))
    return guard


def evaluate_guard(guard: Guard, server_args_like: Any) -> bool:
    """Run a guard the way the backend's ``__init__`` does, turning any exception into GuardRaised."""
    name = getattr(guard, "__qualname__", repr(guard))
    try:
        result = guard(server_args_like)
    except GuardRaised:
        raise
    except AttributeError as exc:
        missing = getattr(exc, "name", None)
        raise GuardRaised(guard_raised_message(name, "AttributeError", str(exc), missing,
                                               type(server_args_like).__name__), missing_attribute=missing) from exc
    except Exception as exc:
        raise GuardRaised(guard_raised_message(name, type(exc).__name__, str(exc), None,
                                               type(server_args_like).__name__)) from exc
    if not is_bool(result):
        if inspect.iscoroutine(result):
            result.close()
        raise GuardRaised(bad_return_message(name, type(result).__name__))
    return bool(result)


def server_args_namespace(cfg: ServerConfig) -> SimpleNamespace:
    """A ``ServerArgs``-like namespace with sglang's attribute names for ``cfg`` (server_args.py)."""
    return SimpleNamespace(
        tp_size=cfg.tp_size,
        dp_size=cfg.dp_size,
        attn_cp_size=cfg.attn_cp_size,
        enable_dp_attention=cfg.enable_dp_attention,
        enable_prefill_cp=cfg.enable_prefill_cp,
        cp_strategy=cfg.cp_strategy,
        page_size=cfg.page_size,
        enable_deterministic_inference=cfg.enable_deterministic_inference,
        disable_cuda_graph=not cfg.cuda_graph,
        context_length=cfg.context_length,
    )


class LegacyServerArgs(NamedTuple):
    """A ServerArgs-like object missing ``missing`` flags, as older sglang versions were."""

    missing: frozenset[str]
    args: SimpleNamespace


def legacy_server_args_variants(cfg: ServerConfig) -> Iterator[LegacyServerArgs]:
    """Yield ServerArgs-like namespaces lacking each non-empty subset of :data:`GUARD_FLAGS`.

    Models older sglang releases (``enable_prefill_cp`` arrived with prefill CP, long after
    ``enable_dp_attention``), so callers can check a guard does not raise on them.
    """
    subsets = [frozenset([flag]) for flag in GUARD_FLAGS] + [frozenset(GUARD_FLAGS)]
    for missing in subsets:
        ns = server_args_namespace(cfg)
        for flag in missing:
            delattr(ns, flag)
        yield LegacyServerArgs(missing, ns)


def guard_disables_precompute(guard: Guard, cfg: ServerConfig) -> bool:
    """Evaluate ``guard`` on the ServerArgs-like form of ``cfg``."""
    return evaluate_guard(guard, server_args_namespace(cfg))
