"""Which sglang releases the suite's real-release sweeps run on: the Makefile's ``ENGINE_RELEASES`` (``make test``
exports them as ``$FA3VERIFY_ENGINE_RELEASES``; a bare ``pytest`` reads the Makefile's default), or every release
on spec.model.engine_profiles.RELEASES when ``FA3VERIFY_ALL_RELEASES=1``.

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


def makefile_releases(path: Path = MAKEFILE) -> tuple:
    """The Makefile's default ``ENGINE_RELEASES ?= ...`` (the releases ``make engines`` builds)."""
    match = re.search(r"^ENGINE_RELEASES\s*\?=\s*(.*)$", path.read_text(encoding="utf-8"), re.M)
    if match is None:
        raise RuntimeError(f"{path}: no `ENGINE_RELEASES ?= ...` line")
    return tuple(match.group(1).split())


def selected(environ=None) -> tuple:
    """The releases sweeps run on now; ``("*",)`` when every release is asked for."""
    environ = os.environ if environ is None else environ
    if environ.get(ENV_ALL, "") not in ("", "0"):
        return ("*",)
    text = environ.get(ENV_RELEASES)
    return tuple(text.replace(",", " ").split()) if text is not None else makefile_releases()


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


def need(release: str, environ=None) -> None:
    """Skip the calling test unless ``release`` is selected (for a test or fixture on one named release)."""
    chosen = selected(environ)
    if chosen != ("*",) and release not in chosen:
        pytest.skip(_why(release, chosen))


def _why(release: str, chosen: tuple) -> str:
    return (f"sglang {release} is not in {ENV_RELEASES} ({' '.join(chosen) or 'empty'}); "
            f"{ENV_ALL}=1 or `make test ENGINE_RELEASES=\"{release}\"` runs it")


def vllm_worker(release: str, engine_sut=None):
    """A module fixture's body: the driver of vLLM ``release`` (skipped, naming the setup command, when its
    environment is not built), closed after the module; given the session fixture ``engine_sut``, the test process's
    shared worker for the release instead (tests/engine_pool.py: started once for every file of the process that
    drives that release, closed at the session's end)."""
    import pytest

    from gpu_impl.engines import envs

    if not envs.env_ready(release, engine="vllm"):
        pytest.skip(f"no environment for vllm {release} under {envs.env_dir(release, engine='vllm')}: run "
                    f"`fa3verify engine setup vllm=={release}` to build it")
    if engine_sut is not None:
        yield engine_sut(f"vllm=={release}").worker
        return
    from gpu_impl.engines.vllm.host import VllmWorker

    w = VllmWorker(release, progress=lambda m: None)
    yield w
    w.close()
