"""The load test's errors: one line for the user, raised by the driver and its processes."""

from __future__ import annotations

__all__ = ["LoadTestError", "RunInputError"]


class LoadTestError(Exception):
    """The run failed; the message is one line for the user."""


class RunInputError(LoadTestError):
    """The run could not start because of its input (options, run directory)."""
