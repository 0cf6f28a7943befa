"""Log lines that can repeat at will, rate-limited (a foundation piece: no I/O of its own).

The server logs refusals at accept, write timeouts and rate-limited closes through it; the
operations layer its failed authentications; the federation bridge the failures to reach its
broker (one line at once, then the retries summed up). Metrics count every occurrence; the
log gets at most one line per interval for each kind, so neither a hostile client nor a dead
broker can flood it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class RateLimitedLog:
    """WARNING lines that can repeat at will (refusals, failed authentications, a broker that
    cannot be reached): at most one line per ``interval`` seconds for each kind (the message
    format, or the ``key`` given); the next line logged says how many were left out
    meanwhile. The first of a kind is logged at once. Metrics count every occurrence."""

    def __init__(self, logger: logging.Logger, interval: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.interval = interval
        self.clock = clock  # monotonic seconds (a test may freeze it)
        # kind -> (time of the last line, occurrences not logged since)
        self._state: dict[str, tuple[float, int]] = {}

    def warning(self, fmt: str, *args: object, now: float | None = None,
                key: str | None = None) -> bool:
        """Log now, or count it for the next line of its kind (``key``, by default
        ``fmt``); True if a line was written."""
        t = self.clock() if now is None else now
        kind = fmt if key is None else key
        last, skipped = self._state.get(kind, (-1e18, 0))
        if t - last < self.interval:
            self._state[kind] = (last, skipped + 1)
            return False
        self._state[kind] = (t, 0)
        if skipped:
            self.logger.warning(fmt + " (and %d more like this in the last %.0fs)",
                                *args, skipped, t - last)
        else:
            self.logger.warning(fmt, *args)
        return True

    def reset(self) -> None:
        """Forget every kind: the next occurrence of any is logged at once (the condition
        ended, say the broker is reached again)."""
        self._state.clear()
