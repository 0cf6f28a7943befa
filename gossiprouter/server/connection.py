"""A connection of the server: the :class:`Connection`, and the part of the server that
writes connections out and forgets them when they close (:class:`ConnectionsPart`).

:class:`Connection` is the one per-connection object: its cancel scope, its direct send on a
plain-TCP socket, its writer task when one is needed, and the callbacks the server gives its
outbox. :class:`ConnectionsPart` is the first part of
:class:`gossiprouter.server.listener.Server`: the writer task that drains an outbox
(:meth:`ConnectionsPart._writer`), and the removal of what a closed connection's session held
in the routing table (:meth:`ConnectionsPart._forget`). What reads a connection is in
:mod:`gossiprouter.server.feeder`; a failure while writing is confined to the one connection
(the error policy: :mod:`gossiprouter.server.listener`, "Errors").
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable

import trio

from gossiprouter.core.addresses import format_addr
from gossiprouter.core.config import Config
from gossiprouter.server.dispatch import Parked
from gossiprouter.server.hooks import ByteStream
from gossiprouter.sessions.base import Hub, Session
from gossiprouter.sessions.counters import Counters

log = logging.getLogger("gossiprouter")

WRITER_TASK = "gossiprouter writer"
# A writer sends at most about this much per send_all, so that its progress
# (which tells a slow receiver from a stalled one) is seen often.
WRITE_BATCH = 1 << 20


class Connection:
    """A live TCP connection and its session.

    Also the one per-connection object behind the callbacks the server gives the outbox
    (:meth:`direct`, :meth:`start_writer`, :meth:`on_close`): bound methods of this object
    rather than closures per connection, and no nursery per connection (the writer task,
    when one is needed, runs in the server's nursery under :attr:`writer_scope`, which
    follows :attr:`scope`'s deadline): idle connections are what a router has most of
    (issue 24)."""

    __slots__ = ("close_reason", "counters", "handshake_deadline", "lot", "peer", "raw_send",
                 "scope", "server", "session", "stream", "writer", "writer_scope")

    def __init__(self, stream: trio.SocketStream, peer: str,
                 server: ConnectionsPart | None = None) -> None:
        # The socket stream, or the TLS stream over it once the accept hook has run.
        self.stream: trio.SocketStream | ByteStream = stream
        self.peer = peer
        self.server = server
        self.session: Session | None = None
        self.scope = trio.CancelScope()
        self.lot = Parked()  # its writer task's, when it has one
        # The whole handshake (TLS, preamble, HELLO or the first JGroups frame) must be done
        # by then (the reaper enforces it once the session exists).
        self.handshake_deadline = math.inf
        # Why the router closed it before it had a session (a session's outbox says it after).
        self.close_reason = ""
        # The writer task, once started: set when it is over; and the scope it runs in.
        self.writer: trio.Event | None = None
        self.writer_scope: trio.CancelScope | None = None
        # The direct send (plain TCP): the socket's send, and the counters it adds to.
        self.raw_send: Callable[[bytes], int] | None = None
        self.counters: Counters | None = None

    def limit(self, deadline: float) -> None:
        """Bound the connection's remaining life (its reader and writer) by ``deadline``."""
        scope = self.scope
        scope.deadline = min(scope.deadline, deadline)
        ws = self.writer_scope
        if ws is not None:
            ws.deadline = min(ws.deadline, deadline)

    def direct(self, data: bytes) -> int:
        """The outbox's non-blocking send on a plain-TCP socket, counted."""
        n: int = self.raw_send(data)  # type: ignore[misc]  # set before it is installed
        counters = self.counters
        assert counters is not None
        counters.bytes_out += n
        counters.writes += 1
        return n

    def on_close(self) -> None:
        """The outbox closed: the connection counts as closed at once (its members leave
        now, and nothing more is routed to it); its final flush, the farewell frame behind
        whatever was already being written, gets a bounded time."""
        server = self.server
        session = self.session
        assert server is not None and session is not None
        server._forget(session)
        cfg = server.config
        linger = cfg.shutdown_timeout if server._stopping else cfg.close_timeout
        self.limit(trio.current_time() + linger)

    def start_writer(self) -> None:
        """The outbox's wake-up: the writer task starts only when something has to wait for
        the socket (with direct sends most connections never need one), in the server's
        nursery; later wake-ups unpark it."""
        session = self.session
        server = self.server
        assert session is not None and server is not None
        ob = session.outbox
        # The writer owns the stream from now on (docs/architecture.md, "One writer per
        # stream"): the relay thread stops writing this socket before the writer can start
        # a frame, and anything routed here meanwhile queues behind.
        ob.claim()
        if not ob.busy:
            # A busy period starts now: the write deadline counts from here, not from the
            # end of the last one (or 0.0), since the reaper may run before the writer task
            # does and would see a stall that is not one.
            ob.last_progress = trio.current_time()
        if self.writer is not None:
            self.lot.unpark()
            return
        self.writer = trio.Event()
        scope = self.writer_scope = trio.CancelScope(deadline=self.scope.deadline)
        if self.scope.cancel_called:
            scope.cancel()
        nursery = server._nursery
        assert nursery is not None
        nursery.start_soon(server._writer, self, session, name=WRITER_TASK)


class ConnectionsPart:
    """The part of :class:`~gossiprouter.server.listener.Server` that every connection calls
    back (:meth:`Connection.on_close`, :meth:`Connection.start_writer`): its writer task,
    and forgetting a closed connection's members. The attributes are the server's (set by
    its constructor and :meth:`~gossiprouter.server.listener.Server.serve`)."""

    config: Config
    hub: Hub
    # Set by shutdown(): everyone is being closed.
    _stopping: bool
    # Where connections and their writer tasks run (set by serve).
    _nursery: trio.Nursery | None

    async def _writer(self, conn: Connection, session: Session) -> None:
        """Write what the outbox queues until the connection is over; in the server's nursery,
        under the connection's writer scope (its deadline follows the connection's), and
        when it ends, it ends the connection's reader (Connection.start_writer)."""
        scope = conn.writer_scope
        assert scope is not None and conn.writer is not None
        try:
            with scope:
                ob = session.outbox
                ob.last_progress = trio.current_time()
                stream = conn.stream
                sock = stream.socket if isinstance(stream, trio.SocketStream) else None
                counters = self.hub.counters
                try:
                    while True:
                        if not ob.chunks:
                            if ob.closed:
                                break
                            await conn.lot.park()
                            ob.last_progress = trio.current_time()  # a busy period starts
                            continue
                        ob.claim()  # woken by start_writer, which claimed: cheap, never wrong
                        chunks = ob.take(WRITE_BATCH)
                        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                        counters.writes += 1  # per write, not per frame
                        counters.bytes_out += len(data)
                        ob.busy = True
                        if sock is None:
                            await stream.send_all(data)
                        else:
                            # Plain TCP: one send() at a time, so that every bit of progress
                            # is seen (the write deadline, write_timeout, is about progress).
                            with memoryview(data) as view:
                                sent = 0
                                while sent < len(data):
                                    sent += await sock.send(view[sent:])
                                    ob.last_progress = trio.current_time()
                        ob.busy = False
                        ob.last_progress = trio.current_time()
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass
                except Exception as exc:
                    self.hub.contain(session, exc, "writing to it")
                finally:
                    # The writer ends only when the connection is over.
                    if not ob.closed:
                        ob.close("write failed")
                    conn.scope.cancel()  # the reader too, as the nursery's scope did
        finally:
            conn.writer.set()

    def _forget(self, session: Session) -> None:
        """Drop everything ``session`` held from the table (idempotent)."""
        table = self.hub.table
        held = list(table.registrations(session).values())
        if not held and session not in table.watching:
            return
        notices = table.drop_carrier(session, trio.current_time())
        if not self._stopping:  # when everyone is being closed, nobody needs telling
            self.hub.deliver(notices)
        if held and log.isEnabledFor(logging.INFO):
            reason = session.outbox.close_reason or "closed"
            for e in held:
                if table.entry(e.group, e.addr) is not e:
                    log.info("%s (%s) left %r: connection %r closed (%s)", e.name or "-",
                             format_addr(e.addr), e.group, session, reason)
                elif e.grace_until is not None:
                    log.info("%s (%s) in %r: connection %r closed (%s); in reconnect grace",
                             e.name or "-", format_addr(e.addr), e.group, session, reason)


def drop_unread(stream: trio.SocketStream) -> None:
    """Read and drop, without waiting, what the peer sent that nobody will read.

    Closing a socket with unread input makes the kernel send a reset and discard what is
    still unsent, such as the farewell telling a flooding or stalled client why it was
    closed (ERROR rate_limited, slow_consumer). At most 1 MiB, then a normal close."""
    raw = getattr(stream.socket, "_sock", None)
    if raw is None:
        return
    with contextlib.suppress(OSError):  # BlockingIOError: nothing more is buffered
        for _ in range(16):
            if not raw.recv(65536):
                return


def nothing_to_wake() -> None:
    pass
