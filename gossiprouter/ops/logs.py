"""Log formats: ``text`` for people, ``json`` for log shippers.

The router logs with the standard :mod:`logging` module under the
``gossiprouter`` logger: connections opened and refused, members joining and
leaving (who, which group, from where), errors with their cause; never one
line per message. The JSON format writes one object per line with ``time``
(UTC, ISO 8601), ``level``, ``logger``, ``message``, any extra fields the
call passed (``peer``, ``reason``, ``identity``, ...) and ``exception``.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out:
                out[key] = value if isinstance(value, (str, int, float, bool, type(None))) \
                    else str(value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def use_format(fmt: str) -> None:
    """Switch the root logger's handlers to ``fmt`` ('text' leaves them as they are)."""
    if fmt != "json":
        return
    for handler in logging.getLogger().handlers:
        handler.setFormatter(JsonFormatter())
