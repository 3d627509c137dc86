"""sglang as a system under test: a release (``sglang==V``) or a checkout / wheel (``sglang-src=PATH``) driven in
its engine environment by a long-lived worker (``sglang_driver``), one scenario per request.

Invariant: every ScenarioResult this returns came from the worker running sglang's own backend; a worker that
dies, hangs or answers garbage raises :class:`DriverError` (a crash, never a pass or a violation). A checkout runs
in the environment of the nearest registered release, with its own ``sglang`` first on the path; the worker's
``hello`` must show that sglang was imported from the checkout, else the spec is refused.
"""

from __future__ import annotations

import hashlib
import os
import re
import selectors
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Callable, Optional

from ..sut import EngineSpec, SystemUnderTest
from . import envs, recipes
from .errors import CheckoutImportError, DriverError, EngineUnavailable
from .protocol import decode, encode, result_from_wire, scenario_to_wire

__all__ = ["SglangSUT", "ScenarioUnsupported", "resolve_source"]

#: Seconds one request may take before the worker is declared hung (a 32k-token scenario takes well under 10 s).
REQUEST_TIMEOUT_S = float(os.environ.get("FA3VERIFY_ENGINE_TIMEOUT", "900"))


class ScenarioUnsupported(EngineUnavailable):
    """The scenario uses a feature the engine driver does not run (MLA, fp8 KV cache, a release without the kit)."""


_VERSION = re.compile(r"""__version__\s*=\s*(?:version\s*=\s*)?["']([^"']+)["']""")


def resolve_source(path: str) -> tuple:
    """(directory to put first on the path, sglang version, revision) of a checkout or wheel.

    ``path``: an sglang clone, its ``python/`` directory, or a ``.whl`` file (unpacked once into the engine home).
    """
    p = Path(path).expanduser().resolve()
    if p.is_file() and p.suffix == ".whl":
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
        dest = envs.engine_home() / "src" / digest[:16]
        if not (dest / "sglang").is_dir():
            tmp = Path(tempfile.mkdtemp(prefix="unpack-", dir=dest.parent if dest.parent.exists() else None))
            with zipfile.ZipFile(p) as zf:
                zf.extractall(tmp)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, dest)
        root, revision = dest, f"wheel-sha256:{digest[:16]}"
    elif p.is_dir():
        root = p if (p / "sglang").is_dir() else p / "python"
        if not (root / "sglang" / "__init__.py").exists():
            raise CheckoutImportError(f"sglang-src={path}: no sglang package under {p} (want an sglang clone, its "
                                      f"python/ directory, or a wheel file)")
        revision = _git_revision(root)
    else:
        raise CheckoutImportError(f"sglang-src={path}: not a directory or a .whl file")
    return root, source_version(root), revision


def source_version(root: Path) -> Optional[str]:
    """The sglang version of a checkout or unpacked wheel: ``sglang/_version.py`` (generated at build time), a
    literal in ``sglang/version.py``, ``git describe --tags``, or ``pyproject.toml``; None when none says
    (fallback versions such as ``0.0.0.dev0`` say nothing)."""
    def real(v):
        return v if v and not v.startswith("0.0.0") else None

    for name in ("_version.py", "version.py"):
        f = root / "sglang" / name
        if f.exists():
            for m in _VERSION.finditer(f.read_text(errors="replace")):
                if real(m.group(1)):
                    return m.group(1)
    try:
        out = subprocess.run(["git", "-C", str(root), "describe", "--tags", "--abbrev=0"], capture_output=True,
                             text=True, timeout=30, stdin=subprocess.DEVNULL)
        tag = out.stdout.strip().lstrip("v") if out.returncode == 0 else ""
        if real(tag):
            return tag
    except (OSError, subprocess.TimeoutExpired):
        pass
    pyproject = root / "pyproject.toml"
    if pyproject.exists():
        m = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(errors="replace"), re.M)
        if m and real(m.group(1)):
            return m.group(1)
    return None


def _git_revision(path: Path) -> str:
    try:
        out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if out.returncode != 0:
        return "unknown (not a git checkout)"
    dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL).stdout.strip()
    return out.stdout.strip() + ("+dirty" if dirty else "")


class SglangSUT(SystemUnderTest):
    """sglang's own FlashAttentionBackend, in a worker process inside the release's engine environment."""

    #: the worker's main module (the engine driver); a harness may name another that serves the same protocol
    DEFAULT_WORKER = "gpu_impl.engines.sglang_driver"

    def __init__(self, spec: EngineSpec, progress: Callable[[str], None] = print, root: Optional[Path] = None,
                 worker: Optional[str] = None, worker_env: Optional[dict] = None):
        """``worker``: the module run as the worker (default :data:`DEFAULT_WORKER`; ``fa3verify.sanitize
        .engine_worker`` runs the same driver under the runtime sanitizer); ``worker_env``: extra environment
        variables for it."""
        self.spec = spec
        self.worker = worker or self.DEFAULT_WORKER
        self.worker_env = dict(worker_env or {})
        #: the worker's ``observer`` status from its latest answer (a sanitizer's status), or None
        self.observed: Optional[dict] = None
        self.source = None
        self.revision = None
        self.version = None
        if spec.kind == "sglang":
            self.release = envs.check_release(spec.release)
        elif spec.kind == "sglang-src":
            self.source, self.version, self.revision = resolve_source(spec.path)
            self.release = recipes.nearest_release(self.version or recipes.RELEASES[-1])
        else:
            raise EngineUnavailable(f"engine {spec}: not an sglang engine")
        self.env = envs.ensure_env(self.release, progress=progress, root=root)
        self._proc = None
        self._stderr = None
        self._buf = b""
        self.hello: Optional[dict] = None

    # -- the worker ----------------------------------------------------------------------------------------
    def start(self) -> dict:
        """Start the worker (import sglang once); returns its hello. Idempotent."""
        if self._proc is not None and self._proc.poll() is None:
            return self.hello
        extra = [str(self.source)] if self.source is not None else []
        env = envs.driver_environ(extra_paths=extra)
        env.update({"FA3VERIFY_ENGINE_RELEASE": self.release, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        env.update(self.worker_env)
        self._stderr = tempfile.TemporaryFile()
        t = time.monotonic()
        self._proc = subprocess.Popen([str(self.env / "bin" / "python"), "-m", self.worker],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env,
                                      cwd=str(envs.PROJECT_ROOT))
        self._buf = b""
        first = self._read(timeout=REQUEST_TIMEOUT_S)
        if not first.get("ok"):
            self.close()
            raise self._import_error(first)
        self.hello = dict(first["hello"], start_s=round(time.monotonic() - t, 2))
        self.observed = first.get("observer")
        if self.source is not None and not str(self.hello.get("path", "")).startswith(str(self.source)):
            self.close()
            raise CheckoutImportError(f"sglang-src={self.spec.path}: sglang was imported from "
                                      f"{self.hello.get('path')}, not from the checkout {self.source}")
        return self.hello

    def _import_error(self, resp: dict) -> Exception:
        what = f"sglang-src={self.spec.path}" if self.source is not None else f"sglang=={self.release}"
        msg = f"{what}: does not import in its environment ({self.env}): {resp.get('error')}"
        return CheckoutImportError(msg) if self.source is not None else EngineUnavailable(msg)

    def _read(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        out = self._proc.stdout
        sel = selectors.DefaultSelector()
        sel.register(out, selectors.EVENT_READ)
        try:
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._kill()
                    raise DriverError(f"engine worker {self.spec}: no answer within {timeout:.0f}s; killed"
                                      f"{self._stderr_tail()}")
                if not sel.select(timeout=min(left, 5.0)):
                    if self._proc.poll() is not None:
                        break
                    continue
                chunk = os.read(out.fileno(), 1 << 16)
                if not chunk:
                    break
                self._buf += chunk
        finally:
            sel.close()
        if b"\n" not in self._buf:
            code = self._proc.poll()
            raise DriverError(f"engine worker {self.spec} exited (code {code}) without an answer"
                              f"{self._stderr_tail()}")
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            return decode(line.decode())
        except ValueError:
            raise DriverError(f"engine worker {self.spec}: not a response: {line[:200]!r}") from None

    def _stderr_tail(self, n: int = 2000) -> str:
        if self._stderr is None:
            return ""
        try:
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - n))
            tail = self._stderr.read().decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""
        return f"\n  worker stderr (last lines):\n    " + "\n    ".join(tail.splitlines()[-15:]) if tail else ""

    def request(self, obj: dict, timeout: float = REQUEST_TIMEOUT_S) -> dict:
        self.start()
        try:
            self._proc.stdin.write(encode(obj).encode())
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise DriverError(f"engine worker {self.spec}: cannot send ({exc}){self._stderr_tail()}") from None
        return self._read(timeout)

    def _answer(self, resp: dict) -> dict:
        if resp.get("ok"):
            if "observer" in resp:
                self.observed = resp["observer"]
            return resp
        kind, err = resp.get("kind"), resp.get("error")
        if kind == "unsupported":
            raise ScenarioUnsupported(f"engine {self.spec}: {err}")
        if kind == "bad_request":
            raise ValueError(f"engine {self.spec}: {err}")
        raise DriverError(f"engine {self.spec}: sglang's code crashed: {err}\n{resp.get('traceback', '')}")

    # -- SystemUnderTest -----------------------------------------------------------------------------------
    def run(self, scenario, kernel=None, numerics: bool = False, device: str = "cpu"):
        resp = self._answer(self.request({"op": "run", "scenario": scenario_to_wire(scenario),
                                          "numerics": bool(numerics)}))
        return result_from_wire(resp)

    def validate(self, server_config, model_config=None) -> tuple:
        """(accepted, message): the release's own ServerArgs verdict on a configuration (accepted is None when its
        validation cannot run on CPU)."""
        import dataclasses

        server = dataclasses.asdict(server_config) if dataclasses.is_dataclass(server_config) else dict(server_config)
        model = dataclasses.asdict(model_config) if dataclasses.is_dataclass(model_config) else model_config
        resp = self._answer(self.request({"op": "validate", "server": server, "model": model}))
        return resp["accepted"], resp["message"]

    def identity(self) -> dict:
        if self.source is not None:
            return {"name": "sglang-src", "path": str(self.spec.path), "revision": self.revision,
                    "version": self.version, "release": self.release}
        return {"name": "sglang", "release": self.release}

    def describe(self) -> str:
        return str(self.spec) + (f" (runs beside sglang=={self.release})" if self.source is not None else "")

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            try:
                proc.stdin.write(encode({"op": "quit"}).encode())
                proc.stdin.flush()
                proc.stdin.close()
                proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                proc.kill()
                proc.wait()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
