"""Writing a report or output file: `-` is standard output, special files are written through, regular files
atomically and with the user's umask.

Invariant: an output is written the way its path asks, never destroying what the path names:
(1) ``-``, and a symbolic link that resolves to this process's standard output (``/dev/stdout``,
``/dev/fd/1``, ``/proc/self/fd/1``), is written to standard output, and while a run has such an output
everything else it prints goes to stderr (:func:`stdout_reserved_for`), so stdout carries the report alone;
(2) a symbolic link, FIFO or character device (``/dev/null``, a terminal, a process substitution) is opened and
written through, never replaced by a regular file; a link to a regular file is written atomically at its target,
so the link stays; (3) a regular (or new) file is written through a temporary file in its folder and a rename, so
a crash never leaves half a report and a failed write keeps the previous one, and it gets mode
``0666 & ~umask`` (0644 by default), as a shell redirect would. Which paths are allowed at all (not a directory,
not one of the run's inputs, ...) is checked before the run by :mod:`fa3verify.outputs`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import tempfile
import time
from typing import Iterator, Optional, Union

from .errors import OutputNotWritten, UsageError

#: The path that names standard output.
STDOUT = "-"
#: Seconds a write to a FIFO waits for a reader to open it (a FIFO nobody reads would block the run forever).
FIFO_WAIT_S = 30.0

#: The stream the report goes to while :func:`stdout_reserved_for` has moved the rest of the output to stderr.
_report_stream = None


def current_umask() -> int:
    """The process umask, read without changing it where the system says it (Linux), else set and restored."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def is_stdout(path: object) -> bool:
    """Whether an output path names this process's standard output: ``-``, or a symbolic link resolving to it."""
    if path == STDOUT:
        return True
    if not isinstance(path, str) or not path:
        return False
    try:
        if not os.path.islink(path):
            return False
        st = os.stat(path)
        fd = _stdout_stream().fileno()
        out = os.fstat(fd)
    except (OSError, ValueError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (out.st_dev, out.st_ino)


def _stdout_stream():
    return _report_stream if _report_stream is not None else sys.stdout


@contextlib.contextmanager
def stdout_reserved_for(paths) -> Iterator[None]:
    """While the block runs, when one of ``paths`` is standard output: what the run prints goes to stderr and the
    report alone to stdout (invariant (1))."""
    global _report_stream
    if not any(is_stdout(p) for p in paths) or _report_stream is not None:
        yield
        return
    saved = sys.stdout
    _report_stream = saved
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        sys.stdout = saved
        _report_stream = None


def write_output(path: str, data: Union[str, bytes], field: str = "output") -> None:
    """Write ``data`` (text as UTF-8) to the output ``path`` as the module invariant says; ``field`` names the
    option in an error. A write the system refuses raises :class:`fa3verify.errors.OutputNotWritten` naming
    ``field`` and ``path`` (not the temporary file); the previous file at ``path``, if any, is kept."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    try:
        _write_output(path, raw, field)
    except OSError as exc:
        from .outputs import os_reason

        raise OutputNotWritten(field, path, os_reason(exc)) from None


def _write_output(path: str, raw: bytes, field: str) -> None:
    if is_stdout(path):
        _write_stdout(raw)
        return
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    if os.path.islink(path):
        target = os.path.realpath(path)
        if st is not None and stat.S_ISREG(st.st_mode) and _is_plain_path(target, st):
            _write_atomic(target, raw)  # the link's own target is replaced; the link stays
        else:
            _write_through(path, raw, st, field)
        return
    if st is not None and not stat.S_ISREG(st.st_mode):
        _write_through(path, raw, st, field)
        return
    _write_atomic(path, raw)


def _is_plain_path(target: str, st: os.stat_result) -> bool:
    """Whether ``target`` (a link's resolved path) is the file itself, not a /proc "magic" link's description."""
    try:
        t = os.stat(target)
    except OSError:
        return False
    return (t.st_dev, t.st_ino) == (st.st_dev, st.st_ino) and not target.startswith("/proc/")


def _write_stdout(raw: bytes) -> None:
    stream = _stdout_stream()
    stream.flush()
    buffer = getattr(stream, "buffer", None)
    if buffer is not None:
        buffer.write(raw)
        buffer.flush()
    else:
        stream.write(raw.decode("utf-8", errors="replace"))
    stream.flush()


def _write_through(path: str, raw: bytes, st: Optional[os.stat_result], field: str) -> None:
    """Open ``path`` for writing and write ``raw`` to it (a FIFO waits at most FIFO_WAIT_S for its reader)."""
    is_fifo = st is not None and stat.S_ISFIFO(st.st_mode)
    flags = os.O_WRONLY | (os.O_TRUNC if st is not None and stat.S_ISREG(st.st_mode) else 0)
    if is_fifo:
        deadline = time.monotonic() + FIFO_WAIT_S
        while True:
            try:
                fd = os.open(path, flags | os.O_NONBLOCK)
                break
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
                if time.monotonic() >= deadline:
                    raise UsageError(f"{field}: {path} is a FIFO that no process opened for reading within "
                                     f"{FIFO_WAIT_S:g} s; nothing was written") from None
                time.sleep(0.05)
        os.set_blocking(fd, True)
    else:
        fd = os.open(path, flags)
    with os.fdopen(fd, "wb") as fh:
        fh.write(raw)


def _write_atomic(path: str, raw: bytes) -> None:
    """A regular file through a temporary file in its folder and a rename, mode 0666 & ~umask."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".fa3verify-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            os.fchmod(fh.fileno(), 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def deliver(rc: int, outputs, command: str = "") -> int:
    """Write the outputs of a run whose verdict is ``rc`` (its exit code), each ``(field, path, write)`` with
    ``path`` None when not asked; a write that fails is named on stderr (option, path, reason) and the others
    are still written. The exit code: the verdict's (a FAIL stays 1, an inconclusive run 3), except that a PASS
    whose asked-for output is missing is 3 (inconclusive), never a clean 0: a CI job that reads the report
    would find none."""
    from . import exitcodes

    missing = []
    for field, path, write in outputs:
        if path is None or path is False:
            continue
        try:
            write()
        except OutputNotWritten as exc:
            missing.append(exc)
    if not missing:
        return rc
    who = f"fa3verify {command}" if command else "fa3verify"
    for exc in missing:
        print(f"{who}: error: {exc}", file=sys.stderr)
    names = ", ".join(f"{e.field} {e.path}" for e in missing)
    verdict = exitcodes.verdict_name(rc).upper()
    if rc == exitcodes.PASS:
        print(f"{who}: the verdict was PASS, but {names} was not written: exit 3 (inconclusive), not a clean "
              f"pass", file=sys.stderr)
        return exitcodes.INCONCLUSIVE
    print(f"{who}: the verdict {verdict} stands (exit {rc}); not written: {names}", file=sys.stderr)
    return rc
