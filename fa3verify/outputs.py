"""Input files and output paths of a run, checked before the run starts.

Invariants: (1) every output path a run will write is checked before any work: a file output is not a
directory and sits under a directory (or a directory the run may create), a directory output is not a file,
no two outputs coincide; (2) no output is a file the run reads (the case file, the run summary, the guard
source): a run never overwrites its input; (3) input files are read only when they are regular files of a
bounded size (a FIFO, a directory, a symlink loop or an unreadable path is exit 2 naming the argument, never a
hang or a traceback); (4) ``-`` names standard output for a file output (at most one output may write there)
and no folder output; a FIFO, a character device or a symbolic link to one is a valid file output (written
through, :mod:`fa3verify.outputs`), a socket or block device is not.

Writing a report or output file: `-` is standard output, special files are written through, regular files
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
import glob
import json
import os
import stat
import sys
import tempfile
import time
from typing import Iterable, Iterator, Optional, Union

from . import exitcodes
from .errors import OutputNotWritten, UsageError


#: Largest input file (case file, run summary) read, in bytes.
MAX_INPUT_BYTES = 16 * 1024 * 1024

#: argparse dest -> "file" or "dir": what each output option names (per command where they differ).
OUTPUT_OPTIONS = {"json": "file", "junit": "file", "html": "file", "markdown": "file", "write_docs": "file",
                  "cases_dir": "dir", "write_corpus": "dir", "out_dir": "dir", "out": "dir"}
COMMAND_OUTPUTS = {"hazard-map": {"out": "file"}}
#: command -> (dest, the folder the command writes when neither that option nor ``also`` is given, ``also``):
#: outputs whose default is decided after parsing, checked like a given path.
DEFAULT_OUTPUTS = {"fuzz": ("cases_dir", "fa3verify-out/cases", "out"),
                   "run-ranks": ("out_dir", "fa3verify-out/ranks", None)}
#: argparse dest -> the argument name used in messages, for inputs.
INPUT_OPTIONS = {"case": "CASE", "cases": "CASE", "run_json": "RUN.json",  # report merge: its REPORT.json too
                 "matrix": "MATRIX.json"}  # engine fixes


def read_text(path: str, field: str, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of a regular input file; UsageError naming `field` for anything else."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UsageError(f"{field}: no such file: {path}") from None
    except OSError as exc:
        raise UsageError(f"{field}: cannot read {path}: {_why(exc)}") from None
    if stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{field}: {path} is a directory; expected a regular file")
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{field}: {path} is not a regular file (a FIFO, socket or device); expected a regular file")
    if st.st_size > max_bytes:
        raise UsageError(f"{field}: {path} has {st.st_size} bytes; at most {max_bytes} are read")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):  # replaced between stat and open
                raise UsageError(f"{field}: {path} is not a regular file")
            raw = fh.read(max_bytes + 1)
    except OSError as exc:
        raise UsageError(f"{field}: cannot read {path}: {_why(exc)}") from None
    if len(raw) > max_bytes:
        raise UsageError(f"{field}: {path} has more than {max_bytes} bytes; at most {max_bytes} are read")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{field}: {path} is not UTF-8 text") from None


def _why(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "symbolic link loop"
    if exc.errno == errno.EACCES:
        return "permission denied"
    if exc.errno == errno.EROFS:
        return "read-only file system"
    return exc.strerror or (str(exc) if exc.args else "") or type(exc).__name__


def os_reason(exc: OSError) -> str:
    """The system's reason for a failed read or write, in words (no file name: the caller names the path)."""
    return _why(exc)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _check_ancestors(flag: str, path: str, kind: str = "file") -> None:
    """The nearest existing ancestor of `path` must be a directory (else the write fails at the end), and one the
    run can create files in: a file output is written through a temporary file in its folder, a folder output
    gets files (and the folders leading to it are created). Probed by creating and removing a temporary file, as
    permission bits say nothing under root, on a read-only mount or in /proc."""
    start = os.path.abspath(path) if kind == "dir" else os.path.dirname(os.path.abspath(path))
    if kind == "file" and os.path.islink(path) and os.path.isfile(path):
        start = os.path.dirname(os.path.realpath(path))  # a link to a regular file: written at its target
    parent = start
    while parent and not os.path.lexists(parent):
        up = os.path.dirname(parent)
        if up == parent:
            break
        parent = up
    if os.path.lexists(parent) and not os.path.isdir(parent):
        raise UsageError(f"{flag}: cannot write {path}: {parent} is not a directory")
    if not os.path.isdir(parent):
        return

    try:
        fd, probe = tempfile.mkstemp(prefix=".fa3verify-probe-", dir=parent)
    except OSError as exc:
        where = f"{parent} (the working directory)" if parent == os.getcwd() else parent
        raise UsageError(f"{flag}: cannot write {path}: no file can be created in {where}: {_why(exc)}; "
                         f"give {flag} a writable path") from None
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError:
        pass


def check_output(flag: str, path: str, kind: str, inputs: Iterable[tuple[str, str]] = ()) -> None:
    """One output path: writable where it is, and not one of the run's inputs (name, path)."""
    if not isinstance(path, str) or not path:
        raise UsageError(f"{flag}: expected a path, got {path!r}")

    if path == STDOUT:
        if kind != "file":
            raise UsageError(f"{flag}: '-' (standard output) names no folder; give a folder path")
        return
    if kind == "file" and is_stdout(path):
        return
    if kind == "file":
        if os.path.isdir(path):
            raise UsageError(f"{flag}: {path} is a directory; expected a file path")
        if os.path.lexists(path) and not os.path.exists(path):
            raise UsageError(f"{flag}: {path} is a broken symbolic link")
        if os.path.exists(path):
            mode = os.stat(path).st_mode
            if stat.S_ISSOCK(mode) or stat.S_ISBLK(mode):
                raise UsageError(f"{flag}: {path} is a {'socket' if stat.S_ISSOCK(mode) else 'block device'}; "
                                 f"expected a file path, '-' (standard output), a FIFO or a character device")
        for name, inp in inputs:
            if os.path.exists(path) and _same_file(path, inp):
                raise UsageError(f"{flag}: {path} is the run's input {name}; a run never overwrites a file it reads")
        if os.path.exists(path) and not stat.S_ISREG(os.stat(path).st_mode):
            if not os.access(path, os.W_OK):  # a FIFO or character device: written through, never replaced
                raise UsageError(f"{flag}: cannot write {path}: permission denied")
            return
    else:
        if os.path.lexists(path) and not os.path.isdir(path):
            raise UsageError(f"{flag}: {path} exists and is not a directory")
    _check_ancestors(flag, path, kind)


def run_inputs(args) -> list[tuple[str, str]]:
    """(argument name, path) of every file the parsed command reads: case files, summaries, the guard source."""
    values = vars(args)
    out = []
    for dest, name in INPUT_OPTIONS.items():
        v = values.get(dest)
        for p in ([v] if isinstance(v, str) else list(v) if isinstance(v, (list, tuple)) else []):
            if isinstance(p, str):
                out.append((name, p))
    guard = values.get("guard")
    if isinstance(guard, str) and ":" in guard:
        target = guard.strip().rpartition(":")[0]
        if target.endswith(".py") or "/" in target:
            out.append(("--guard", target))
    return out


def check_outputs(command: str, args) -> None:
    """Check every output option of the parsed command before the run (see the module invariants)."""
    values = dict(vars(args))
    kinds = {**OUTPUT_OPTIONS, **COMMAND_OUTPUTS.get(command, {})}
    if command in DEFAULT_OUTPUTS:
        dest, default, also = DEFAULT_OUTPUTS[command]
        if values.get(dest) is None and (also is None or values.get(also) is None):
            values[dest] = default
    inputs = run_inputs(args)
    seen: dict[str, str] = {}
    for dest, kind in kinds.items():
        path = values.get(dest)
        if path is None or isinstance(path, bool):  # absent, or a flag of that name (engine matrix --markdown)
            continue
        flag = "--" + dest.replace("_", "-")
        check_output(flag, path, kind, inputs)

        key = "<stdout>" if is_stdout(path) else os.path.realpath(path)
        if key == "<stdout>" and key in seen:
            raise UsageError(f"{flag}: {path} is standard output, and so is {seen[key]}; at most one output "
                             f"can be written there")
        if key in seen:
            raise UsageError(f"{flag}: {path} is also the path of {seen[key]}; give each output its own path")
        seen[key] = flag


def output_paths(command: str, args) -> list:
    """The paths of every output option the parsed command was given (for :func:`outputs.stdout_reserved_for`)."""
    values = vars(args)
    kinds = {**OUTPUT_OPTIONS, **COMMAND_OUTPUTS.get(command, {})}
    return [values[d] for d in kinds if isinstance(values.get(d), str)]


def shown_path(path: str) -> str:
    """A path as a command prints it: relative to the working directory when it lies under it (as the user
    typed it, ``fa3verify-out/...``), else absolute; the reports themselves keep whatever path they record."""
    full = os.path.abspath(path)
    try:
        rel = os.path.relpath(full)
    except ValueError:  # another drive (Windows): no relative form
        return full
    return full if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel


def fresh_dir(base: str, patterns: Iterable[str]) -> str:
    """`base`, or the first `base/run-N` (N = 2, 3, ...) holding no file matching `patterns` (for default
    output folders, so a second run neither deletes nor mixes with the first run's files)."""
    def clean(d: str) -> bool:
        return not any(glob.glob(os.path.join(glob.escape(d), p)) for p in patterns)

    if clean(base):
        return base
    n = 2
    while not clean(os.path.join(base, f"run-{n}")):
        n += 1
    return os.path.join(base, f"run-{n}")


def read_json(path: str, field: str, max_depth: int = 64):
    """Parse a JSON input file (read_text's checks, bounded nesting, bounded integer digits); UsageError naming
    `field` for anything malformed."""
    from spec.model.cases import json_nesting

    text = read_text(path, field)
    depth = json_nesting(text)
    if depth > max_depth:
        raise UsageError(f"{field}: {path}: expected JSON nested at most {max_depth} levels deep, got {depth}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{field}: {path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"{field}: {path}: expected JSON with integers of at most 4300 digits ({exc})"[:300]) from None


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
