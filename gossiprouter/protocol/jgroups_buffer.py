"""The receive buffer of both JGroups stream decoders (2.12 and 3.6.5+/5.x), sans-IO."""

from __future__ import annotations

from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.jgroups_reader import Buffer

__all__ = ["DEFAULT_MAX_FRAME", "StreamBuffer"]

#: Default cap on one GossipData (2.12) or one frame body (5.x), in bytes.
DEFAULT_MAX_FRAME = 8 * 1024 * 1024


class StreamBuffer:
    """The receive buffer of both JGroups stream decoders (``jgroups2``, ``jgroups5``).

    Bytes are :meth:`feed`-ed as they arrive and parsed from ``_pos``; once a parse error made
    the stream unusable (``_error``), every later :meth:`_check` raises it again.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        if max_frame <= 0:
            raise ValueError("max_frame must be positive")
        self.max_frame = max_frame
        self._buf = bytearray()
        self._pos = 0  # start of the first unparsed object or frame
        self._error: ProtocolError | None = None

    def feed(self, data: Buffer) -> None:
        """Append bytes received from the socket."""
        self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as an event (a partial object at EOF)."""
        return len(self._buf) - self._pos

    def _check(self) -> None:
        """Raise again the error that made the stream unusable, if any."""
        if self._error is not None:
            raise ProtocolError(f"stream unusable after: {self._error}", self._error.code)

    def _compact(self) -> None:
        """Drop the bytes already parsed."""
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0

