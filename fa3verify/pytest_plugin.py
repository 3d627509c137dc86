"""pytest plugin: `pytest --fa3verify-guard module:function` adds the fa3-verify gate as a test;
`pytest --fa3verify-sanitize=raise|warn|record` runs the suite under the runtime metadata sanitizer;
`pytest --fa3verify-emulate-fa3` makes `import flash_attn_interface` give the CPU emulated FA3 (gpu_impl.emulate_fa3).

With the option, one test item, ``fa3verify_gate[<guard>]``, is appended to the collected suite. It runs
:func:`fa3verify.api.gate` (prove + fuzz) on the guard and fails with the verdict, the failed checks and
every finding with its replay command when the gate does not pass. ``-k``/``-m`` select it like any other
test (it carries the ``fa3verify`` marker). Without the option the plugin adds nothing, so installing
fa3-verify never changes another suite.

With ``--fa3verify-sanitize=MODE`` the sanitizer (:mod:`fa3verify.sanitize`) is installed before collection and
uninstalled at the end: in mode "raise" a test whose FA3 call consumes mismatched scheduler metadata fails with
:class:`~gpu_impl.fa3_calls.MetadataMismatch`; the terminal summary gives the calls checked, the violations and
the files written (``--fa3verify-sanitize-dir``, default ``fa3verify-sanitize``), and the device's SM count with
where it came from (``--fa3verify-sanitize-num-sm N``, 1..1024, else read from the device; 132 on the CPU).

The plugin is registered through the ``pytest11`` entry point of the fa3-verify distribution; in a checkout
that is not installed, load it with ``-p fa3verify.pytest_plugin``.
"""

from __future__ import annotations

from typing import Optional

import pytest

ITEM_NAME = "fa3verify_gate"
MARKER = "fa3verify"


def pytest_addoption(parser):
    group = parser.getgroup("fa3verify", "fa3-verify gate")
    group.addoption("--fa3verify-guard", action="store", default=None, metavar="SPEC",
                    help="run the fa3-verify gate on this guard (module:function or file.py:function, or "
                         "fixed / pre-fix / none) as one extra test item")
    group.addoption("--fa3verify-budget-s", action="store", type=float, default=20.0,
                    help="fuzz budget in seconds for the gate (default 20)")
    group.addoption("--fa3verify-cases", action="store", type=int, default=None, metavar="N",
                    help="fuzz N cases instead of a time budget")
    group.addoption("--fa3verify-seed", action="store", type=int, default=0, help="fuzz seed (default 0)")
    group.addoption("--fa3verify-timeout-s", action="store", type=float, default=10.0,
                    help="z3 timeout per query in seconds (default 10)")
    group.addoption("--fa3verify-metadata-heads", action="store", default="tp", choices=("tp", "attn_tp"),
                    help="head counts the backend under test precomputes metadata with (default tp)")
    group.addoption("--fa3verify-keep-stale-cp-metadata", action="store_true", default=False,
                    help="model a runner that keeps CP metadata from an earlier batch (pre-fix runner)")
    group.addoption("--fa3verify-cases-dir", action="store", default="fa3verify-out/cases", metavar="DIR",
                    help="where the gate saves case files (default fa3verify-out/cases)")
    group.addoption("--fa3verify-json", action="store", default=None, metavar="PATH",
                    help="also write the gate's run summary as JSON (schema fa3verify.run/1)")
    group.addoption("--fa3verify-sanitize", action="store", default=None, metavar="MODE",
                    help="run the suite under the FA3 metadata sanitizer: raise, warn or record")
    group.addoption("--fa3verify-sanitize-dir", action="store", default=None, metavar="DIR",
                    help="where the sanitizer writes its log, pair and case files (default fa3verify-sanitize)")
    group.addoption("--fa3verify-sanitize-deep", action="store_true", default=False,
                    help="deep sanitizer checks (every spec invariant; a device sync per checked call)")
    group.addoption("--fa3verify-sanitize-num-sm", action="store", default=None, metavar="N",
                    help="the device's SM count, 1..1024 (default: $FA3VERIFY_SANITIZE_NUM_SM, else read from the "
                         "first FA3 tensor's CUDA device; 132 on the CPU)")
    group.addoption("--fa3verify-emulate-fa3", action="store_true", default=False,
                    help="register the CPU emulated FA3 as flash_attn_interface (and sgl_kernel.flash_attn where "
                         "no real sgl_kernel exists) before collection; see docs/emulator.md")


def _options(config) -> dict:
    get = config.getoption
    return {"guard": get("fa3verify_guard"), "metadata_heads": get("fa3verify_metadata_heads"),
            "keep_stale_cp_metadata": bool(get("fa3verify_keep_stale_cp_metadata")),
            "budget_s": get("fa3verify_budget_s"), "cases": get("fa3verify_cases"), "seed": get("fa3verify_seed"),
            "timeout_s": get("fa3verify_timeout_s"), "cases_dir": get("fa3verify_cases_dir")}


SANITIZE_MODES = ("raise", "warn", "record")


def _configure_sanitizer(config) -> None:
    mode = config.getoption("fa3verify_sanitize", None)
    if mode is None:
        return
    if mode not in SANITIZE_MODES:
        raise pytest.UsageError(f"--fa3verify-sanitize: must be one of {', '.join(SANITIZE_MODES)}, got {mode!r}")
    import fa3verify.sanitize as sanitize

    options = {}
    num_sm = config.getoption("fa3verify_sanitize_num_sm", None)
    try:
        if num_sm is not None:
            options = {"num_sm": sanitize.checked_num_sm(num_sm, "--fa3verify-sanitize-num-sm"),
                       "num_sm_source": "given (--fa3verify-sanitize-num-sm)"}
        config._fa3verify_sanitizer = sanitize.install(mode=mode, deep=config.getoption("fa3verify_sanitize_deep"),
                                                       out_dir=config.getoption("fa3verify_sanitize_dir"), **options)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_unconfigure(config):
    sanitizer = getattr(config, "_fa3verify_sanitizer", None)
    if sanitizer is not None:
        import fa3verify.sanitize as sanitize

        if sanitize.current() is sanitizer:
            sanitize.uninstall()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    sanitizer = getattr(config, "_fa3verify_sanitizer", None)
    if sanitizer is None:
        return
    st = sanitizer.status()
    terminalreporter.write_sep("-", "fa3verify sanitize")
    terminalreporter.write_line(f"mode {st['mode']}: {st['checked_calls']} FA3 calls with scheduler metadata checked, "
                                f"{st['graph_checks']} CUDA-graph recomputes checked, {st['violation_events']} "
                                f"violations; wrapped: {', '.join(st['wrapped']) or 'no FA3 entry point was imported'}")
    terminalreporter.write_line(f"device: {st['num_sm']} SMs, sm{st['arch']} ({st['num_sm_source']})")
    for text in st["unreachable"]:
        terminalreporter.write_line(f"NOT CHECKED (bound before install): {text}")
    for path in st["files"]:
        terminalreporter.write_line(f"wrote {path}")


def pytest_configure(config):
    config.addinivalue_line("markers", f"{MARKER}: the fa3-verify gate added by --fa3verify-guard")
    if config.getoption("fa3verify_emulate_fa3", False):
        import gpu_impl.emulate_fa3  # noqa: F401  (registers on import, before the sanitizer wraps FA3)
    _configure_sanitizer(config)
    guard = config.getoption("fa3verify_guard", None)
    if guard is None:
        return
    if not guard.strip():
        raise pytest.UsageError("--fa3verify-guard: must be a guard spec (module:function, file.py:function, "
                                "fixed, pre-fix or none), got an empty string")
    opts = _options(config)
    if opts["cases"] is None and not opts["budget_s"] > 0:
        raise pytest.UsageError(f"--fa3verify-budget-s: must be > 0, got {opts['budget_s']}")
    if opts["cases"] is not None and opts["cases"] < 1:
        raise pytest.UsageError(f"--fa3verify-cases: must be >= 1, got {opts['cases']}")
    if not opts["timeout_s"] > 0:
        raise pytest.UsageError(f"--fa3verify-timeout-s: must be > 0, got {opts['timeout_s']}")
    if opts["seed"] < 0:
        raise pytest.UsageError(f"--fa3verify-seed: must be >= 0, got {opts['seed']}")


def pytest_report_header(config):
    guard = config.getoption("fa3verify_guard", None)
    if guard is None:
        return None
    opts = _options(config)
    budget = f"{opts['cases']} cases" if opts["cases"] is not None else f"{opts['budget_s']:g} s"
    return (f"fa3verify: gate on guard {guard!r} (metadata heads {opts['metadata_heads']}, "
            f"fuzz {budget}, seed {opts['seed']})")


class GateFailed(Exception):
    """The gate did not pass; carries the :class:`fa3verify.api.GateResult`."""

    def __init__(self, result):
        super().__init__(result.verdict)
        self.result = result


class Fa3VerifyGateItem(pytest.Item):
    """The gate as one test: runs `fa3verify.api.gate` and fails with its findings unless it passes."""

    def __init__(self, *, gate_options: dict, json_path: Optional[str] = None, **kwargs):
        super().__init__(**kwargs)
        self.gate_options = dict(gate_options)
        self.json_path = json_path
        self.add_marker(MARKER)
        self.result = None

    def runtest(self) -> None:
        from fa3verify import api

        result = api.gate(**self.gate_options)
        self.result = result
        self.user_properties.append(("fa3verify_verdict", result.verdict))
        self.user_properties.append(("fa3verify_findings", len(result.findings)))
        if self.json_path:
            result.write_json(self.json_path)
        if not result.passed:
            raise GateFailed(result)

    def repr_failure(self, excinfo, style=None):
        from fa3verify.errors import UsageError

        err = excinfo.value
        if isinstance(err, GateFailed):
            return f"fa3verify gate on guard {self.gate_options['guard']!r}: {err.result.verdict.upper()}\n" \
                   + err.result.report()
        if isinstance(err, UsageError):
            return f"fa3verify gate: bad input: {err}"
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, f"fa3verify gate [{self.gate_options['guard']}]"


def checked_json_path(json_path: Optional[str], guard: str) -> Optional[str]:
    """``--fa3verify-json`` checked before the gate runs, as the command line checks its outputs
    (fa3verify.outputs): not a directory, not under a file, never the guard file the gate reads."""
    if json_path is None:
        return None
    from .errors import UsageError
    from .outputs import check_output

    target = guard.rsplit(":", 1)[0]
    inputs = [("--fa3verify-guard", target)] if target.endswith(".py") or "/" in target else []
    try:
        check_output("--fa3verify-json", json_path, "file", inputs)
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    return json_path


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    """Append the gate item when --fa3verify-guard is given (tryfirst, so -k/-m can still deselect it)."""
    guard = config.getoption("fa3verify_guard", None)
    if guard is None:
        return
    name = f"{ITEM_NAME}[{guard}]"
    item = Fa3VerifyGateItem.from_parent(session, name=name, nodeid=name, gate_options=_options(config),
                                         json_path=checked_json_path(config.getoption("fa3verify_json"), guard))
    items.append(item)
    # Report it as collected, as a collector would, so "collected N items" and --collect-only count it.
    config.hook.pytest_collectreport(report=pytest.CollectReport(name, "passed", None, [item]))
