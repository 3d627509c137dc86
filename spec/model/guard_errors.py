"""The faults of evaluating a backend's guard: the exceptions and their messages, shared by the guard loader
(spec.model.guards) and the child process that isolates a user's guard (spec.model.guard_isolation)."""

from __future__ import annotations


class GuardSpecError(ValueError):
    """A ``--guard`` spec that cannot be resolved to a callable."""


class GuardRaised(RuntimeError):
    """A guard faulted while being evaluated (raised, exited, returned a non-bool); reported as GUARD_RAISED.

    ``missing_attribute`` names the absent flag, if any.
    """

    invariant = "GUARD_RAISED"

    def __init__(self, message: str, missing_attribute: str | None = None):
        super().__init__(message)
        self.missing_attribute = missing_attribute


class GuardTimeout(GuardRaised):
    """A guard call (or its import) missed its deadline (spec.model.guard_isolation.GUARD_TIMEOUT_S): GUARD_TIMEOUT."""

    invariant = "GUARD_TIMEOUT"


#: The finding names a guard fault is reported under.
GUARD_FAULTS = ("GUARD_RAISED", "GUARD_TIMEOUT")


def guard_raised_message(name: str, exc_type: str, message: str, missing: str | None, args_type: str) -> str:
    """The message of a guard that raised: names the missing attribute for an AttributeError."""
    if exc_type == "AttributeError":
        what = f"attribute {missing!r}" if missing else "an attribute"
        return (f"guard {name} raised AttributeError reading {what} from {args_type} ({message}); older sglang "
                f"ServerArgs may lack it -- read flags with getattr(server_args, NAME, False)")
    return f"guard {name} raised {exc_type}: {message}"


def bad_return_message(name: str, type_name: str) -> str:
    """The message of a guard that returned something other than a bool."""
    return (f"guard {name} returned a {type_name}, not a bool: the backend would treat it as "
            f"{'True' if type_name not in ('NoneType',) else 'False'} whatever it means; return True or False")
