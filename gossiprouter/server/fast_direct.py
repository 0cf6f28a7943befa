"""A plain-TCP connection's direct send while the compiled fast path runs
(:meth:`gossiprouter.server.fastpath.FastPath.open`): through the relay thread while it writes
the connection too, else the socket's own send; counted."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gossiprouter.sessions.base import Session
    from gossiprouter.sessions.counters import Counters


class Direct:
    """A plain-TCP connection's direct send with the fast path (FastPath.open): through the
    relay thread while it writes the connection too, else the socket's own send; counted."""

    __slots__ = ("cid", "counters", "raw_send", "reclaim", "relay_send", "session")

    def __init__(self, relay_send: Callable[[int, bytes], int],
                 reclaim: Callable[[Session], None], session: Session, cid: int,
                 raw_send: Callable[[bytes], int], counters: Counters) -> None:
        self.relay_send = relay_send  # one bound method of the relay for all
        self.reclaim = reclaim  # FastPath._reclaim: the outbox takes over
        self.session = session
        self.cid = cid
        self.raw_send = raw_send
        self.counters = counters

    def send(self, data: bytes) -> int:
        # One method, as the server's own direct send (not a wrapper around it).
        session = self.session
        if not session.fast_attached:
            n: int = self.raw_send(data)
        else:
            try:
                n = self.relay_send(self.cid, data)
            except OSError:
                session.fast_attached = False  # detached; the writer meets the error
                session.outbox.reclaim = no_bytes
                raise
            if n == -1:  # the thread holds bytes for it: they go first, then ``data``
                self.reclaim(session)
                return 0
            if n == -2:  # not attached after all (cannot happen: kept in step)
                session.fast_attached = False
                session.outbox.reclaim = no_bytes
                n = self.raw_send(data)
            elif n < len(data):  # the socket is full: the outbox's writer takes over
                session.fast_attached = False
                session.outbox.reclaim = no_bytes
        counters = self.counters
        counters.bytes_out += n
        counters.writes += 1
        return n


def no_bytes() -> bytes:
    """An outbox's ``reclaim`` when the thread holds nothing for it."""
    return b""
