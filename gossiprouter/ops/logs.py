"""Log formats: ``text`` for people, ``json`` for log shippers.

The router logs with the standard :mod:`logging` module under the
``gossiprouter`` logger: connections opened and refused, members joining and
leaving (who, which group, from where), errors with their cause; never one
line per message. The JSON format writes one object per line with ``time``
(UTC, ISO 8601), ``level``, ``logger``, ``message``, any extra fields the
call passed (``peer``, ``reason``, ``identity``, ...) and ``exception``.

Log lines quote what clients send (group and logical names, addresses,
reasons). :class:`ClientText`, installed on every handler by
:func:`use_format`, keeps that text from forging lines or flooding the log:
each argument is cut to :data:`MAX_FIELD` characters, and control characters
(newlines, ANSI escapes, ...) are written as escapes (:func:`clean`).
"""

from __future__ import annotations

import json
import logging
import re
import weakref
from datetime import UTC, datetime
from typing import Any

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName"}


# At most this many characters of one client-supplied value in a log line; a line is cut at
# MAX_LINE. A member joining with a 4 MiB name must not write 4 MiB of log per join and leave.
MAX_FIELD = 200
MAX_LINE = 4000
# C0 controls (\n, \r, ESC...), DEL, C1 controls (CSI...) and the Unicode line separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escape(m: re.Match[str]) -> str:
    return m.group().encode("unicode_escape").decode("ascii")


def clean(text: str, limit: int = MAX_FIELD) -> str:
    """``text`` fit for one log line: control characters escaped (a newline becomes ``\\n``,
    ESC ``\\x1b``) and at most ``limit`` characters of it kept, saying how many were cut."""
    if len(text) > limit:
        text = f"{text[:limit]}[...{len(text) - limit} more]"
    return _CONTROL.sub(_escape, text)


def _clip(arg: object) -> object:
    if isinstance(arg, str) and len(arg) > MAX_FIELD:
        return f"{arg[:MAX_FIELD]}[...{len(arg) - MAX_FIELD} more]"
    if isinstance(arg, bytes | bytearray) and len(arg) > MAX_FIELD:
        return bytes(arg[:MAX_FIELD])
    return arg


# The records ClientText has already made safe (a record reaches the filter of every handler;
# cutting twice would cut the "[...N more]" note). Kept here, not on the record: anything set
# on a record is written by the JSON format (and by any formatter that writes its fields).
_cleaned: weakref.WeakSet[logging.LogRecord] = weakref.WeakSet()


class ClientText(logging.Filter):
    """Make every record safe to write as one line, whatever client text it quotes.

    String and bytes arguments are cut to :data:`MAX_FIELD` before formatting (so ``%r`` of
    a name stays short), then the formatted message is escaped and cut by :func:`clean`.
    The traceback of an exception (``exc_info``) is left as it is.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record in _cleaned:
            return True
        args = record.args
        if isinstance(args, tuple) and args:
            record.args = tuple(_clip(a) for a in args)
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: let the handler report it as usual
            return True
        record.msg = clean(message, MAX_LINE)
        record.args = None
        # Fields passed with ``extra=`` (the JSON format writes them), e.g. a refused group.
        for key, value in list(vars(record).items()):
            if key not in _STANDARD and isinstance(value, str):
                setattr(record, key, clean(value))
        _cleaned.add(record)
        return True


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
    """Switch the root logger's handlers to ``fmt`` ('text' keeps their formatter), and make
    them write client text safely (:class:`ClientText`)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, ClientText) for f in handler.filters):
            handler.addFilter(ClientText())
        if fmt == "json":
            handler.setFormatter(JsonFormatter())
