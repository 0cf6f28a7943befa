"""The one exception every codec raises for bad input."""

from __future__ import annotations


class ProtocolError(Exception):
    """Input that does not follow the wire protocol.

    ``code`` is the native ERROR code the router answers with (``protocol`` or
    ``frame_too_large``); the message says what was wrong, for the log line and
    for the peer.
    """

    def __init__(self, message: str, code: str = "protocol") -> None:
        super().__init__(message)
        self.code = code
