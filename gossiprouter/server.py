"""The trio server: listeners, one reader and one writer task per connection.

This is the only module that touches sockets. A connection's first bytes say
which protocol it speaks (:func:`sniff`); a session of that protocol then
turns what the reader receives into bytes queued on other connections'
outboxes, and each connection's writer drains its own outbox with one
``send_all`` per wake-up. A receiver that cannot keep up is handled by its
outbox's policy; nothing here ever waits on another connection's socket.
"""

from __future__ import annotations

import errno
import logging
import math
import socket as _stdsocket
from collections.abc import Callable
from dataclasses import dataclass

import trio

from gossiprouter.config import Config
from gossiprouter.dispatch import Dispatcher
from gossiprouter.ops.runtime import Operations
from gossiprouter.ops.tls import TLSStream
from gossiprouter.protocol import native as wire
from gossiprouter.sessions import jgroups2 as _jgroups2
from gossiprouter.sessions import jgroups5 as _jgroups5
from gossiprouter.sessions.base import Hub, Session
from gossiprouter.sessions.native import NativeSession

log = logging.getLogger("gossiprouter")

RECV_SIZE = 256 * 1024
# The first read only has to tell the protocol; a small buffer keeps the
# allocator from fragmenting on thousands of connections that say little.
SNIFF_SIZE = 4096
# A writer sends at most about this much per send_all, so that its progress
# (which tells a slow receiver from a stalled one) is seen often.
WRITE_BATCH = 1 << 20
# Back-pressure (see sessions.base.Congestion): a reader that fed a congested
# receiver pauses in steps of STALL_STEP, at most MAX_STALL per chunk; a
# receiver whose writer made no progress for STALLED_AFTER slows nobody.
STALL_STEP = 0.002
MAX_STALL = 0.05
STALLED_AFTER = 0.25
# Membership events wait this long so that a burst of closes is seen whole
# before anyone is told (see Hub.deliver).
NOTICE_DELAY = 0.005
NOTICE_MAX_DELAY = 1.0

# Accept errors that mean "out of resources right now": retried after a pause,
# as trio.serve_listeners does, instead of killing the accept loop.
_ACCEPT_RETRY = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
_ACCEPT_PAUSE = 0.1

SessionFactory = Callable[[Hub, str, bytes], Session | None]


class ListenError(OSError):
    """The router could not listen on its address; says which and why."""

    def __init__(self, host: str, port: int, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror)
        self.host, self.port = host, port

    def __str__(self) -> str:
        why = {
            errno.EADDRINUSE: "the port is already in use (is another router running?)",
            errno.EADDRNOTAVAIL: "no such local address",
            errno.EACCES: "permission denied (ports below 1024 need privileges)",
        }.get(self.errno or 0, self.strerror or "error")
        return f"cannot listen on {self.host}:{self.port}: {why}"


@dataclass(frozen=True)
class Sniffed:
    protocol: str
    consumed: int


def sniff(first: bytes) -> Sniffed | str | None:
    """Decide a connection's protocol from its first bytes.

    Returns :class:`Sniffed`, None when more bytes are needed, or a string
    naming why the bytes are not any protocol the router speaks.
    """
    if not first:
        return None
    b0 = first[0]
    if b0 == wire.PREAMBLE[0]:
        if len(first) < 4:
            return None if wire.PREAMBLE.startswith(first) else _describe(first)
        if first[:4] == wire.PREAMBLE:
            return Sniffed("native", 4)
        return _describe(first)
    if b0 == 0x00:
        return Sniffed("jgroups5", 0)
    if 1 <= b0 <= 16:
        return Sniffed("jgroups2", 0)
    return _describe(first)


def _describe(first: bytes) -> str:
    head = first[:16]
    if head[:1] == b"\x16":
        kind = "a TLS ClientHello"
    elif head.split(b" ", 1)[0] in (b"GET", b"POST", b"HEAD", b"PUT", b"OPTIONS", b"DELETE"):
        kind = "an HTTP request"
    else:
        kind = "an unknown protocol"
    return f"{kind} (first bytes {head!r})"


class Connection:
    """A live TCP connection and its session."""

    def __init__(self, stream: trio.SocketStream, peer: str) -> None:
        # The socket stream, or the TLS stream over it once ops.accept has run.
        self.stream: trio.SocketStream | TLSStream = stream
        self.peer = peer
        self.session: Session | None = None
        self.scope = trio.CancelScope()
        self.lot = trio.lowlevel.ParkingLot()


class Server:
    """A gossiprouter listening on one port.

    Use :meth:`serve` in a nursery (``await nursery.start(server.serve)``
    returns the bound ``(host, port)``), and :meth:`shutdown` to stop it
    gracefully.
    """

    def __init__(self, config: Config, hub: Hub | None = None) -> None:
        self.config = config
        self.hub = hub or Hub(config)
        self.connections: set[Connection] = set()
        self.factories: dict[str, SessionFactory] = {
            "native": _native_factory,
            "jgroups2": _jgroups2.factory,
            "jgroups5": _jgroups5.factory,
        }
        self.address: tuple[str, int] | None = None
        self._accept_scope = trio.CancelScope()
        self._stopping = False
        self._closed = trio.Event()
        # Reads established plain-TCP connections from one task (gossiprouter.dispatch).
        self.dispatcher = Dispatcher(self.hub, RECV_SIZE, self._throttle)
        # TLS, allow-lists, tokens, metrics/admin port (raises ConfigError on bad files).
        self.ops = Operations(self)

    # ------------------------------------------------------------------ lifecycle

    async def serve(
        self, *, task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen, accept and serve until :meth:`shutdown` or cancellation."""
        cfg = self.config
        try:
            listener = await self._listen(cfg.host, cfg.port, cfg.backlog)
        except OSError as e:
            raise ListenError(cfg.host, cfg.port, e) from e
        sockname = listener.socket.getsockname()
        self.address = (sockname[0], sockname[1])
        log.info("listening on %s:%d (native, JGroups 2.12 and 5.x on one port)", *self.address)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._reaper)
                nursery.start_soon(self._notifier)
                if cfg.dispatcher:
                    await nursery.start(self.dispatcher.run)
                await nursery.start(self.ops.serve)
                task_status.started(self.address)
                with self._accept_scope:
                    await self._accept_loop(listener, nursery)
                await listener.aclose()
                # Shutdown: wait for connections to flush, then cut what is left.
                with trio.move_on_after(cfg.shutdown_timeout + 0.5):
                    while self.connections:
                        await trio.sleep(0.02)
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await listener.aclose()
            self._closed.set()
            log.info("stopped")

    @staticmethod
    async def _listen(host: str, port: int, backlog: int) -> trio.SocketListener:
        family = _stdsocket.AF_INET6 if ":" in host else _stdsocket.AF_INET
        sock = trio.socket.socket(family, _stdsocket.SOCK_STREAM)
        try:
            sock.setsockopt(_stdsocket.SOL_SOCKET, _stdsocket.SO_REUSEADDR, 1)
            await sock.bind((host, port))
            sock.listen(backlog)
        except BaseException:
            sock.close()
            raise
        return trio.SocketListener(sock)

    def shutdown(self) -> None:
        """Stop accepting, tell every client (ERROR ``shutting_down``), flush, stop."""
        if self._stopping:
            return
        self._stopping = True
        log.info("shutting down: %d connections", len(self.connections))
        self._accept_scope.cancel()
        deadline = trio.current_time() + self.config.shutdown_timeout
        for conn in list(self.connections):
            if conn.session is not None:
                conn.session.close("shutting_down", "router is shutting down")
            conn.scope.deadline = min(conn.scope.deadline, deadline)

    async def wait_closed(self) -> None:
        await self._closed.wait()

    # ------------------------------------------------------------------ accepting

    async def _accept_loop(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as e:
                if e.errno in _ACCEPT_RETRY:
                    log.error("accept failed: %s; retrying in %.1fs", e, _ACCEPT_PAUSE)
                    await trio.sleep(_ACCEPT_PAUSE)
                    continue
                raise
            nursery.start_soon(self._handle, stream)

    async def _handle(self, stream: trio.SocketStream) -> None:
        try:
            peer_addr = stream.socket.getpeername()
            peer = f"{peer_addr[0]}:{peer_addr[1]}"
        except OSError:
            await stream.aclose()
            return
        stream.setsockopt(_stdsocket.IPPROTO_TCP, _stdsocket.TCP_NODELAY, True)
        conn = Connection(stream, peer)
        self.connections.add(conn)
        try:
            with conn.scope:
                await self._run(conn)
        finally:
            self.connections.discard(conn)
            if conn.session is not None:
                conn.session.outbox.direct = None  # never write to a closed socket
                self._forget(conn.session)
            with trio.CancelScope(shield=True):
                if conn.stream is not stream:  # TLS: try to send close_notify, briefly
                    with trio.move_on_after(0.5):
                        await conn.stream.aclose()
                await stream.aclose()

    async def _run(self, conn: Connection) -> None:
        cfg = self.config
        first = b""
        with trio.move_on_after(cfg.handshake_timeout) as handshake:
            if not await self.ops.accept(conn):  # allow-list, then TLS (logged there)
                return
            verdict = None
            while verdict is None:
                try:
                    data = await conn.stream.receive_some(SNIFF_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                if not data:
                    return
                first += data
                verdict = sniff(first)
        if handshake.cancelled_caught:
            log.info("closing %s: no protocol preamble within %.1fs", conn.peer,
                     cfg.handshake_timeout)
            return
        if isinstance(verdict, str):
            log.info("closing %s: %s", conn.peer, verdict)
            return
        assert verdict is not None
        if not await self.ops.admit(conn, verdict.protocol):  # per-protocol allow-list
            return
        factory = self.factories.get(verdict.protocol)
        session = None if factory is None else factory(self.hub, conn.peer, first)
        if session is None:
            log.info("closing %s: %s protocol is not served on this port", conn.peer,
                     verdict.protocol)
            return
        conn.session = session
        now = trio.current_time()
        session.last_recv = now
        ob = session.outbox
        lot = conn.lot

        def wake() -> None:
            lot.unpark_all()

        ob.wake = wake
        if isinstance(conn.stream, trio.SocketStream) and cfg.direct_send:
            # trio keeps its sockets non-blocking, so the reader of another
            # connection may write straight to this one while its writer is
            # idle (Outbox.push); TLS streams always go through the writer.
            raw = getattr(conn.stream.socket, "_sock", None)
            if raw is not None:
                counters = self.hub.counters
                send = raw.send

                def direct(data: bytes) -> int:
                    n: int = send(data)
                    counters.bytes_out += n
                    counters.writes += 1
                    return n

                ob.direct = direct

        def on_close() -> None:
            # The connection counts as closed at once (its members leave now, and
            # nothing more is routed to it); its final flush, the farewell frame
            # behind whatever was already being written, gets a bounded time.
            self._forget(session)
            linger = cfg.shutdown_timeout if self._stopping else cfg.close_timeout
            conn.scope.deadline = min(conn.scope.deadline, trio.current_time() + linger)

        ob.on_close = on_close
        if self._stopping or len(self.connections) > cfg.max_connections:
            reason = "shutting_down" if self._stopping else "limit"
            if reason == "limit":
                log.warning("refusing %s: %d connections (max_connections %d)", conn.peer,
                            len(self.connections) - 1, cfg.max_connections)
            session.close(reason, f"too many connections (max {cfg.max_connections})"
                          if reason == "limit" else "router is shutting down")
        elif len(first) > verdict.consumed:
            session.on_data(first[verdict.consumed:], now)
            self.hub.counters.bytes_in += len(first)
        del first  # not kept for the connection's lifetime
        async with trio.open_nursery() as nursery:
            # The writer task starts only when something has to wait for the
            # socket (with direct sends most connections never need one), which
            # keeps idle connections small.
            writer = False

            def start_writer() -> None:
                nonlocal writer
                if writer:
                    lot.unpark_all()
                else:
                    writer = True
                    nursery.start_soon(self._writer, conn, session, nursery.cancel_scope)

            ob.wake = start_writer
            if ob.chunks or ob.closed:  # queued before the nursery existed
                start_writer()
            raw = getattr(conn.stream.socket, "_sock", None) if isinstance(
                conn.stream, trio.SocketStream) and cfg.dispatcher else None
            if raw is not None:
                await self.dispatcher.serve(raw, session)
            else:
                await self._reader(conn, session)
            # The reader is done (EOF or the session closed): let the writer
            # flush, if there is anything to flush; a connection that closes
            # with nothing queued needs no writer task at all (cheaper when
            # thousands of clients drop at once).
            if not writer and not ob.chunks:
                ob.wake = _nothing_to_wake
            if not ob.closed:
                ob.close("eof")
            if writer or ob.chunks:
                start_writer()

    async def _reader(self, conn: Connection, session: Session) -> None:
        stream = conn.stream
        counters = self.hub.counters
        congestion = self.hub.congestion
        ob = session.outbox
        while not ob.closed:
            try:
                data = await stream.receive_some(RECV_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                session.on_eof()
                return
            counters.bytes_in += len(data)
            session.on_data(data, trio.current_time())
            if congestion.pending:
                congestion.pending = False
                await self._throttle()

    async def _throttle(self) -> None:
        """Pause this reader while a receiver it fed is congested but still draining."""
        congestion = self.hub.congestion
        end = trio.current_time() + MAX_STALL
        while True:
            now = trio.current_time()
            if now >= end or not congestion.draining(now, STALLED_AFTER):
                return
            await trio.sleep(STALL_STEP)

    async def _writer(self, conn: Connection, session: Session, scope: trio.CancelScope) -> None:
        ob = session.outbox
        ob.last_progress = trio.current_time()
        stream = conn.stream
        counters = self.hub.counters
        try:
            while True:
                if not ob.chunks:
                    if ob.closed:
                        break
                    await conn.lot.park()
                    ob.last_progress = trio.current_time()  # a busy period starts
                    continue
                chunks = ob.take(WRITE_BATCH)
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                counters.writes += 1  # per write, not per frame
                counters.bytes_out += len(data)
                ob.busy = True
                await stream.send_all(data)
                ob.busy = False
                ob.last_progress = trio.current_time()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            # The writer ends only when the connection is over.
            if not ob.closed:
                ob.close("write failed")
            scope.cancel()

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
                             e.addr.hex(), e.group, session, reason)
                elif e.grace_until is not None:
                    log.info("%s (%s) in %r: connection %r closed (%s); in reconnect grace",
                             e.name or "-", e.addr.hex(), e.group, session, reason)

    # ------------------------------------------------------------------ notices

    async def _notifier(self) -> None:
        """Deliver membership events a few milliseconds late, in batches (Hub.deliver)."""
        hub = self.hub
        lot = trio.lowlevel.ParkingLot()

        def wake() -> None:
            lot.unpark_all()

        hub.defer = wake
        try:
            while True:
                if not hub.pending:
                    await lot.park()
                # Wait while members keep dropping (a mass disconnect), at most
                # NOTICE_MAX_DELAY, then tell only those still connected.
                start = trio.current_time()
                seen = -1
                while len(hub.pending) != seen and (
                        trio.current_time() - start < NOTICE_MAX_DELAY):
                    seen = len(hub.pending)
                    await trio.sleep(NOTICE_DELAY)
                hub.flush_notices(hub.take_pending())
        finally:
            hub.defer = None

    # ------------------------------------------------------------------ reaper

    async def _reaper(self) -> None:
        """Idle connections, expired entries, ended reconnect graces."""
        cfg = self.config
        idle = cfg.idle_timeout
        while True:
            now = trio.current_time()
            wake = now + 1.0
            if idle > 0:
                for conn in list(self.connections):
                    s = conn.session
                    if s is None or s.outbox.closed:
                        continue
                    if now - s.last_recv >= idle:
                        log.info("closing %r: idle for %.1fs", s, now - s.last_recv)
                        s.close("idle_timeout", f"nothing received for {idle:g}s")
                    else:
                        wake = min(wake, s.last_recv + idle)
            notices = self.hub.table.expire(now)
            if notices:
                self.hub.deliver(notices)
                for e in {id(n.entry): n.entry for n in notices}.values():
                    log.info("%s (%s) left %r: %s", e.name or "-", e.addr.hex(), e.group,
                             "reconnect grace ended" if e.kind.label == "connection"
                             else "registration expired")
            nd = self.hub.table.next_deadline()
            if nd is not None:
                wake = min(wake, nd)
            await trio.sleep_until(max(wake, now + 0.01) if math.isfinite(wake) else now + 1.0)


def _nothing_to_wake() -> None:
    pass


def _native_factory(hub: Hub, peer: str, first: bytes) -> Session:
    return NativeSession(hub, peer)
