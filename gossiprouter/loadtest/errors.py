"""The load test's errors: one line for the user, raised by the driver and its processes."""

from __future__ import annotations

__all__ = ["LoadTestError", "RunInputError", "first_error"]


class LoadTestError(Exception):
    """The run failed; the message is one line for the user."""


class RunInputError(LoadTestError):
    """The run could not start because of its input (options, run directory)."""


def first_error(e: BaseException) -> LoadTestError | None:
    """The first :class:`LoadTestError` in ``e`` or in its exception groups."""
    if isinstance(e, LoadTestError):
        return e
    if isinstance(e, BaseExceptionGroup):
        for x in e.exceptions:
            found = first_error(x)
            if found is not None:
                return found
    return None
