"""Which engine releases the suite's real-release tests run on: for sglang the Makefile's ``ENGINE_RELEASES``, for
vLLM its ``VLLM_RELEASES`` (``make test`` exports them as ``$FA3VERIFY_ENGINE_RELEASES`` and
``$FA3VERIFY_VLLM_RELEASES``; a bare ``pytest`` reads the Makefile's defaults), or every release whose environment
is built when ``FA3VERIFY_ALL_RELEASES=1``. So a machine whose engine home holds every release runs the same tests
as a fresh clone, in the same time; the other releases' tests run on demand.

A sweep keeps one parameter per release, so its test ids do not depend on the machine; a release outside the
selection skips, naming the variable that runs it. A release inside it still needs its engine environment (the
test's own skip names the command that builds it).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

MAKEFILE = Path(__file__).resolve().parents[1] / "Makefile"
ENV_RELEASES = "FA3VERIFY_ENGINE_RELEASES"
ENV_ALL = "FA3VERIFY_ALL_RELEASES"
ENV_VLLM_RELEASES = "FA3VERIFY_VLLM_RELEASES"


def makefile_releases(path: Path = MAKEFILE, variable: str = "ENGINE_RELEASES") -> tuple:
    """The Makefile's default ``ENGINE_RELEASES ?= ...`` (or ``variable``'s: the releases ``make engines`` builds)."""
    match = re.search(rf"^{variable}\s*\?=\s*(.*)$", path.read_text(encoding="utf-8"), re.M)
    if match is None:
        raise RuntimeError(f"{path}: no `{variable} ?= ...` line")
    return tuple(match.group(1).split())


def selected(environ=None, engine: str = "sglang") -> tuple:
    """The releases of ``engine`` the tests run on now; ``("*",)`` when every release is asked for."""
    environ = os.environ if environ is None else environ
    if environ.get(ENV_ALL, "") not in ("", "0"):
        return ("*",)
    name, variable = (ENV_RELEASES, "ENGINE_RELEASES") if engine == "sglang" else (ENV_VLLM_RELEASES, "VLLM_RELEASES")
    text = environ.get(name)
    return tuple(text.replace(",", " ").split()) if text is not None else makefile_releases(variable=variable)


def sweep(releases, environ=None) -> list:
    """``pytest.param`` per release for ``@pytest.mark.parametrize("release", sweep(RELEASES))``: the ones outside
    :func:`selected` carry a skip mark saying how to run them."""
    chosen = selected(environ)
    out = []
    for release in releases:
        if chosen == ("*",) or release in chosen:
            out.append(pytest.param(release, id=release))
        else:
            out.append(pytest.param(release, id=release, marks=pytest.mark.skip(reason=_why(release, chosen))))
    return out


def need(release: str, environ=None, engine: str = "sglang") -> None:
    """Skip the calling test unless ``engine``'s ``release`` is selected (for a test or fixture on one named
    release)."""
    chosen = selected(environ, engine=engine)
    if chosen != ("*",) and release not in chosen:
        pytest.skip(_why(release, chosen, engine=engine))


def _why(release: str, chosen: tuple, engine: str = "sglang") -> str:
    name, variable = (ENV_RELEASES, "ENGINE_RELEASES") if engine == "sglang" else (ENV_VLLM_RELEASES, "VLLM_RELEASES")
    return (f"{engine} {release} is not in {name} ({' '.join(chosen) or 'empty'}); "
            f"{ENV_ALL}=1 or `make test {variable}=\"{release}\"` runs it")


def need_built(release: str, engine: str = "sglang", environ=None) -> None:
    """Skip the calling test unless ``engine``'s ``release`` is selected and its engine environment is built (each
    skip says how to run it)."""
    from gpu_impl.engines import envs

    need(release, environ, engine=engine)
    if not envs.env_ready(release, engine=engine):
        pytest.skip(f"no environment for {engine} {release} under {envs.env_dir(release, engine=engine)}: run "
                    f"`fa3verify engine setup {engine}=={release}` to build it")


def need_sglang(release: str, environ=None) -> None:
    """:func:`need_built` for sglang."""
    need_built(release, "sglang", environ)


def need_vllm(release: str, environ=None) -> None:
    """:func:`need_built` for vLLM."""
    need_built(release, "vllm", environ)


def vllm_worker(release: str, engine_sut=None):
    """A module fixture's body: the driver of vLLM ``release`` (skipped, naming the setup command, when its
    environment is not built), closed after the module; given the session fixture ``engine_sut``, the test process's
    shared worker for the release instead (tests/engine_pool.py: started once for every file of the process that
    drives that release, closed at the session's end)."""
    need_vllm(release)
    if engine_sut is not None:
        yield engine_sut(f"vllm=={release}").worker
        return
    from gpu_impl.engines.vllm.host import VllmWorker

    w = VllmWorker(release, progress=lambda m: None)
    yield w
    w.close()
