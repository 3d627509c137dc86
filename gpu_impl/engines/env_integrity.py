"""Whether an engine environment still holds its release's own code.

An environment is judged as the release it was built from, so a module edited after the install (by hand, or by a
tool that wrote through a link into the cache) would be judged in the release's name. Every installed wheel lists
its files with their sha256 in ``<dist>.dist-info/RECORD``; :func:`modified_files` compares the engine package's
Python sources with it (about 0.2 s for vLLM's 3,600 modules with the files cached).
"""

from __future__ import annotations

import base64
import csv
import hashlib
from pathlib import Path


def site_packages(env: Path) -> Path:
    """The environment's ``site-packages`` (the one ``lib/python3.*`` folder of a venv)."""
    found = sorted(Path(env).glob("lib/python3.*/site-packages"))
    if len(found) != 1:
        raise FileNotFoundError(f"{env}: expected one lib/python3.*/site-packages, found {len(found)}")
    return found[0]


def record_of(site: Path, distribution: str) -> Path:
    """The RECORD of ``distribution`` installed in ``site``."""
    found = sorted(site.glob(f"{distribution}-*.dist-info/RECORD"))
    if len(found) != 1:
        raise FileNotFoundError(f"{site}: expected one {distribution}-*.dist-info/RECORD, found {len(found)}")
    return found[0]


def _digest(path: Path, algorithm: str) -> str:
    raw = hashlib.new(algorithm, path.read_bytes()).digest()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def modified_files(env: Path, distribution: str) -> list:
    """The Python sources of ``distribution`` in environment ``env`` whose bytes differ from its RECORD, or that are
    missing, as paths relative to site-packages (``missing: path`` for the latter); [] when all match."""
    site = site_packages(env)
    out = []
    with open(record_of(site, distribution), newline="", encoding="utf-8") as handle:
        for row in csv.reader(handle):
            if len(row) < 2 or not row[0].endswith(".py") or "=" not in row[1]:
                continue
            algorithm, expected = row[1].split("=", 1)
            path = site / row[0]
            try:
                if _digest(path, algorithm) != expected:
                    out.append(row[0])
            except FileNotFoundError:
                out.append(f"missing: {row[0]}")
    return out
