"""Log lines a client can cause at will, rate-limited (a foundation piece: no I/O of its own).

The server logs refusals at accept, write timeouts and rate-limited closes through it; the
operations layer its failed authentications. Metrics count every occurrence; the log gets at
most one line per interval for each kind, so a hostile client cannot flood it.
"""

from __future__ import annotations

import logging
import time


class RateLimitedLog:
    """WARNING lines a client can cause at will (refusals, failed authentications): at most
    one line per ``interval`` seconds for each message format; the next line logged says
    how many were left out meanwhile. Metrics count every occurrence."""

    def __init__(self, logger: logging.Logger, interval: float) -> None:
        self.logger = logger
        self.interval = interval
        # format -> (time of the last line, occurrences not logged since)
        self._state: dict[str, tuple[float, int]] = {}

    def warning(self, fmt: str, *args: object, now: float | None = None) -> bool:
        """Log now, or count it for the next line; True if a line was written."""
        t = time.monotonic() if now is None else now
        last, skipped = self._state.get(fmt, (-1e18, 0))
        if t - last < self.interval:
            self._state[fmt] = (last, skipped + 1)
            return False
        self._state[fmt] = (t, 0)
        if skipped:
            self.logger.warning(fmt + " (and %d more like this in the last %.0fs)",
                                *args, skipped, t - last)
        else:
            self.logger.warning(fmt, *args)
        return True
