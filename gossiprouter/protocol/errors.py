"""The one exception every codec raises for bad input, and the native ERROR codes."""

from __future__ import annotations

# Every native ERROR code (docs/protocol.md section 8). The router's close reasons and refusal
# codes are these; metrics label by them (anything else as "other"), so a client can never
# add a label value.
ERROR_CODES = frozenset({
    "protocol", "frame_too_large", "unsupported_version", "unauthorized", "idle_timeout",
    "slow_consumer", "handshake_timeout", "rate_limited", "shutting_down", "limit",
    "not_member", "unknown_destination", "address_in_use", "forbidden", "too_long",
    "internal_error", "bad_topic",
})


class ProtocolError(Exception):
    """Input that does not follow the wire protocol.

    ``code`` is the native ERROR code the router answers with (``protocol`` or
    ``frame_too_large``); the message says what was wrong, for the log line and
    for the peer.
    """

    def __init__(self, message: str, code: str = "protocol") -> None:
        super().__init__(message)
        self.code = code
