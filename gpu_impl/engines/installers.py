"""How packages get into an engine environment: ``uv pip install`` when uv is installed, else ``pip install``.

Invariant: uv installs from the same sources, under the same global constraints, as pip would on this machine:
pip's effective configuration (``pip config list``, whose ``:env:`` entries are the ``PIP_*`` variables) is read
at run time and translated option by option; when any option that changes what gets installed has no translation,
uv is not used (pip is). Our own constraints (CPU torch, blocked torchvision & co) are passed to either installer
by the builder (``envs``), and its torch check runs after the install whichever installer ran.

Simplifications: only the ``global`` and ``install`` sections and the environment are read (``download``,
``wheel`` ... sections do not apply to an install); pip's own precedence is kept (environment over ``install``
over ``global``). uv is asked to pick the best version across all indexes (``--index-strategy
unsafe-best-match``, pip's rule; uv's default stops at the first index that has the package), to ignore uv's own
configuration files (``--no-config``: pip's configuration is the one source), to hard-link packages from its
cache (``--link-mode hardlink``: the CPU torch wheel is unpacked once, not once per environment). uv does not
compile bytecode at install time (pip does, for every file): the builder's checks and the workers import with
bytecode writing on (``envs.driver_environ``), so what the engine imports is compiled once, on first import
(measured: compiling everything, ``--compile-bytecode``, costs more than it saves; docs/engines.md). With uv the
environment is made by ``uv venv`` and holds no pip.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Optional

__all__ = ["Installer", "choose", "find_uv", "parse_pip_config", "translate_pip_config", "pip_config"]

#: ``FA3VERIFY_INSTALLER=pip`` or ``uv`` forces one (uv then must be installed); unset: uv when installed.
CHOICE_VARIABLE = "FA3VERIFY_INSTALLER"

_SECTION_RANK = {"global": 0, "install": 1, ":env:": 2}
_LINE = re.compile(r"^(:env:|[A-Za-z0-9_-]+)\.([A-Za-z0-9_-]+)=(.*)$")
_TRUE = ("1", "true", "yes", "on")

#: pip options that list several values (white space separated, as pip reads them from files and variables).
_MULTI = ("find-links", "extra-index-url", "constraint", "trusted-host", "only-binary", "no-binary")

#: pip option -> uv flag (``--flag value`` per value).
_FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
          "constraint": "--constraint", "trusted-host": "--allow-insecure-host", "only-binary": "--only-binary",
          "no-binary": "--no-binary"}
#: pip switch -> uv arguments when it is on.
_SWITCHES = {"no-index": ["--no-index"], "pre": ["--prerelease", "allow"]}
#: pip option -> the environment variable uv reads for it.
_VARIABLES = {"cert": ("SSL_CERT_FILE",), "default-timeout": ("UV_HTTP_TIMEOUT",), "timeout": ("UV_HTTP_TIMEOUT",),
              "proxy": ("HTTPS_PROXY", "HTTP_PROXY"), "retries": ("UV_HTTP_RETRIES",)}
#: pip options that do not change what gets installed (output, pip's own housekeeping).
_NO_EFFECT = ("disable-pip-version-check", "no-color", "progress-bar", "quiet", "verbose", "root-user-action",
              "no-warn-script-location", "no-warn-conflicts", "no-input", "no-cache-dir", "cache-dir", "log",
              "no-python-version-warning", "exists-action", "require-virtualenv", "break-system-packages")


def parse_pip_config(text: str) -> dict:
    """The effective value of each install-relevant pip option in ``pip config list`` output (``section.key='v'``
    lines), pip's precedence applied: environment over ``install`` over ``global``."""
    best: dict = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if not m or m.group(1) not in _SECTION_RANK:
            continue
        section, key, raw = m.groups()
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw.strip("'\"")
        key = {"constraints": "constraint"}.get(key, key)
        rank = _SECTION_RANK[section]
        if key not in best or rank >= best[key][0]:
            best[key] = (rank, str(value))
    return {k: v for k, (_, v) in best.items()}


@dataclass
class Translation:
    """uv's arguments and environment for a pip configuration, and what could not be translated."""

    args: list = field(default_factory=list)
    environ: dict = field(default_factory=dict)
    untranslated: list = field(default_factory=list)


def translate_pip_config(config: dict) -> Translation:
    """uv's options for pip's effective configuration (``parse_pip_config``); an option that changes what gets
    installed and has no uv equivalent lands in ``untranslated``."""
    out = Translation(args=["--index-strategy", "unsafe-best-match"])
    for key in sorted(config):
        value = config[key]
        if key in _NO_EFFECT:
            continue
        values = value.split() if key in _MULTI else [value]
        if key in _FLAGS:
            for v in values:
                out.args += [_FLAGS[key], v]
        elif key in _SWITCHES:
            if value.strip().lower() in _TRUE:
                out.args += _SWITCHES[key]
        elif key in _VARIABLES:
            for var in _VARIABLES[key]:
                out.environ[var] = value
        else:
            out.untranslated.append(f"{key}={value}")
    return out


def pip_config(python: str) -> str:
    """``pip config list`` as the given interpreter's pip sees it (files and ``PIP_*`` variables)."""
    proc = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise OSError(f"`{python} -m pip config list` failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}")
    return proc.stdout


def find_uv() -> Optional[str]:
    """The uv executable: the ``uv`` package of this interpreter (``make setup`` installs it), else uv on PATH."""
    try:
        import uv  # noqa: PLC0415 - optional

        path = uv.find_uv_bin()
        if path and os.path.exists(path):
            return path
    except (ImportError, FileNotFoundError):
        pass
    return shutil.which("uv")


@dataclass
class Installer:
    """One installer bound to one environment: ``command(args)`` is the install command line, ``environ`` the
    environment it runs with, ``note`` what the builder reports (and stamps)."""

    name: str
    python: str
    base: list
    environ: Optional[dict] = None
    note: str = ""
    uv: Optional[str] = None

    def command(self, args: list) -> list:
        return self.base + list(args)

    def venv_command(self, base_python: str, directory: str) -> list:
        """The command creating the environment: ``uv venv`` (no pip inside: uv installs) or ``python -m venv``."""
        if self.uv is not None:
            return [self.uv, "venv", "-q", "--no-config", "--python", base_python, directory]
        return [base_python, "-m", "venv", directory]


def choose(python: str, want: Optional[str] = None) -> Installer:
    """The installer for the environment whose interpreter will be ``python``: uv when installed and pip's
    configuration (as this interpreter's pip reads it) translates fully, or when ``want``/``$FA3VERIFY_INSTALLER``
    says uv; else pip. ValueError for a bad choice; a pip configuration that cannot be read means pip."""
    want = (want or os.environ.get(CHOICE_VARIABLE, "")).strip().lower() or None
    if want not in (None, "pip", "uv"):
        raise ValueError(f"{CHOICE_VARIABLE}: must be 'pip' or 'uv', got {want!r}")
    pip = Installer("pip", python, [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"])
    if want == "pip":
        return pip
    uv = find_uv()
    if uv is None:
        if want == "uv":
            raise ValueError(f"{CHOICE_VARIABLE}=uv: uv is not installed (`pip install uv` into the project's venv)")
        pip.note = "uv not installed"
        return pip
    try:
        tr = translate_pip_config(parse_pip_config(pip_config(sys.executable)))
    except (OSError, subprocess.TimeoutExpired) as exc:
        if want == "uv":
            raise ValueError(f"{CHOICE_VARIABLE}=uv: pip's configuration cannot be read ({exc})") from None
        pip.note = f"uv not used: pip's configuration cannot be read ({exc})"
        return pip
    if tr.untranslated and want != "uv":
        pip.note = f"uv not used: pip option(s) without a uv equivalent: {', '.join(tr.untranslated)}"
        return pip
    env = dict(os.environ)
    env.update(tr.environ)
    base = [uv, "pip", "install", "--python", python, "-q", "--no-config", "--link-mode", "hardlink"] + tr.args
    note = "uv" + (f" (untranslated pip options: {', '.join(tr.untranslated)})" if tr.untranslated else "")
    return Installer("uv", python, base, environ=env, note=note, uv=uv)


def main(argv=None) -> int:
    """``python -m gpu_impl.engines.installers``: print how pip's configuration translates to uv;
    ``... install [--python PY] ARGS...``: install ARGS into PY's environment (default: this interpreter's) with
    the installer :func:`choose` picks (examples/ci/run-gate.sh installs fa3-verify this way). Exit 2 on a bad
    choice or a failed install."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["install"]:
        t = translate_pip_config(parse_pip_config(pip_config(sys.executable)))
        print("uv args:", " ".join(t.args))
        print("uv environment:", " ".join(f"{k}=..." for k in sorted(t.environ)))
        print("untranslated:", ", ".join(t.untranslated) or "none")
        return 0
    args, python = argv[1:], sys.executable
    if args[:1] == ["--python"] and len(args) >= 2:
        python, args = args[1], args[2:]
    try:
        inst = choose(python)
    except ValueError as exc:
        print(f"installers: error: {exc}", file=sys.stderr)
        return 2
    cmd = inst.command(args)
    print(f"installers: {inst.name}: {' '.join(cmd)}", file=sys.stderr)
    rc = subprocess.run(cmd, env=inst.environ, stdin=subprocess.DEVNULL).returncode
    if rc != 0:
        print(f"installers: error: the install exited {rc} (see its output above)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
