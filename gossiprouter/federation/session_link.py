"""A broker session's side of the relay thread's link (federation/link.py): handing the
socket to the thread at the session's start and back at its end, and feeding paho what the
thread reads but does not handle itself (paho_fast.BufferedClient.fed), in order.

:class:`gossiprouter.federation.broker.BrokerSession` holds one; the reader task waits on it
instead of on the socket while the thread reads the socket.
"""

from __future__ import annotations

import errno
import logging
import socket
from typing import TYPE_CHECKING, Any

import trio

from gossiprouter.federation.link import Link

if TYPE_CHECKING:
    from gossiprouter.federation.paho_fast import BufferedClient

log = logging.getLogger("gossiprouter.federation.bridge")


class SessionLink:
    """The link as one broker session after another uses it (see the module docstring)."""

    def __init__(self) -> None:
        self.link: Link | None = None  # set when the server runs the fast path (attach)
        self._event = trio.Event()  # the thread handed something up
        self._paused = False  # ... and reads no more until told (wait)

    def open(self, c: BufferedClient, sock: Any) -> None:
        """A session begins on ``sock``: a plain TCP one is the thread's to write, and to read
        when it says so (TLS and WebSockets keep paho's own I/O)."""
        link = self.link
        if link is None or type(sock) is not socket.socket or not c.fast:
            return
        self._event = trio.Event()
        self._paused = False
        try:
            reads = link.open(sock.fileno(), self._feed(c))
        except OSError as e:  # (no descriptor left to share it): paho's own I/O
            log.warning("bridge: the relay thread cannot take the broker connection (%s): "
                        "Python reads and writes it", e)
            return
        if reads:
            c.fed, c.fed_end = bytearray(), False
        c.link = link

    def close(self, c: BufferedClient) -> None:
        """The session is over: the socket is Python's again (unless paho closed it already,
        which let the link go first: BufferedClient._sock_close)."""
        link = c.link
        if link is not None:
            c.link = None
            link.close()

    def off(self) -> None:
        """The session is not up: the thread publishes and delivers no routed message."""
        if self.link is not None:
            self.link.disable()

    async def wait(self, c: BufferedClient) -> None:
        """All the thread handed up is read: it reads on (the next read goes up whole while
        paho holds the start of a packet), and this returns when it hands up more."""
        if c.fed_end is not False:
            return  # (the stream ended: paho reads that next)
        if self._paused and self.link is not None:
            self._paused = False
            self.link.resume(c.mid_packet())
        await self._event.wait()
        self._event = trio.Event()

    def _feed(self, c: BufferedClient) -> Any:
        def feed(kind: str, data: bytes) -> None:
            # What the thread read and hands up ("data"), or how the stream ended ("eof",
            # "error"): paho reads it next.
            if c.fed is None:
                return
            if kind == "data":
                c.fed += data
                self._paused = True  # the thread reads no more until told (wait)
            else:
                c.fed_end = True if kind == "eof" else OSError(errno.ECONNRESET,
                                                                "connection reset by peer")
            self._event.set()

        return feed
