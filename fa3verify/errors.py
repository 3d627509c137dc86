"""Errors the command line turns into exit code 2 with a message naming the bad field."""


class UsageError(ValueError):
    """Bad input or usage: the message names the field and what is allowed."""
