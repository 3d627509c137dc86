"""Errors the command line turns into exit code 2 with a message naming the bad field."""


class UsageError(ValueError):
    """Bad input or usage: the message names the field and what is allowed."""


class OutputNotWritten(OSError):
    """An output the run was asked for could not be written after the run's work (a full disk, a folder removed
    or made read-only during the run): ``field`` is the option (``--json``), ``path`` the path the user gave
    (never a temporary file), ``reason`` the system's word for it. An OSError, as the failed write it reports."""

    def __init__(self, field: str, path: str, reason: str):
        self.field, self.path, self.reason = field, path, reason
        super().__init__(f"{field}: {path} was not written: {reason}")
