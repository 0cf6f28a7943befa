"""The trio server: listeners, a reader task per connection, a writer task when needed.

This is the only module that touches sockets. A connection's first bytes say
which protocol it speaks (:func:`sniff`); a session of that protocol then
turns what the reader receives into bytes queued on other connections'
outboxes, and each connection's writer drains its own outbox with one
``send_all`` per wake-up. A receiver that cannot keep up is handled by its
outbox's policy; nothing here ever waits on another connection's socket.

Errors (the policy, as :func:`trio.serve_listeners` states its own):

* A client's mistake is not an exception: sessions answer bad frames, refused
  requests and values that cannot be stored (too long, not writable back in
  some protocol) with the protocol's error (native ERROR, JGroups 2.12
  OP_FAIL, a 5.x frame skipped and logged) and count them.
* Any other exception raised while serving one connection (decoding, routing,
  encoding a reply, the writer) is a router bug confined to that connection:
  logged once with its traceback, counted (metric
  ``gossiprouter_internal_errors_total``), answered with ERROR
  ``internal_error`` where the protocol has one, and that connection is
  closed (its members leave as for any close). Every other connection is
  served on. Telling a watcher or member about an event runs on behalf of
  whoever caused it, so there the failure is confined to the one target
  (:meth:`Hub.contain`); an event that cannot be encoded at all is dropped for
  that protocol and counted, closing nobody.
* The reaper and notifier tasks log, count and carry on after an exception.
* Fatal, ending :meth:`Server.serve`: failing to listen (:class:`ListenError`),
  an accept error other than running out of descriptors or memory (those are
  retried after a pause), and what is not an :class:`Exception` (cancellation,
  KeyboardInterrupt, SystemExit).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import socket as _stdsocket
import warnings
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import trio

from gossiprouter.core.addresses import format_hostport
from gossiprouter.core.config import Config, ConfigError
from gossiprouter.core.ratelog import RateLimitedLog
from gossiprouter.federation.bridge import Bridge
from gossiprouter.protocol import native as wire
from gossiprouter.server import snapshot
from gossiprouter.server.dispatch import END, READ, Dispatcher, Parked
from gossiprouter.server.fastpath import FastPath, status
from gossiprouter.server.hooks import ByteStream, NoHooks, ServerHooks, needs_hooks
from gossiprouter.sessions import jgroups2 as _jgroups2
from gossiprouter.sessions import jgroups5 as _jgroups5
from gossiprouter.sessions.base import TURN_CONTROLS, Counters, Hub, Session
from gossiprouter.sessions.native import NativeSession

log = logging.getLogger("gossiprouter")

RECV_SIZE = 256 * 1024
# The first read only has to tell the protocol; a small buffer keeps the
# allocator from fragmenting on thousands of connections that say little.
SNIFF_SIZE = 4096
CONNECTION_TASK = "gossiprouter connection"
WRITER_TASK = "gossiprouter writer"
# A writer sends at most about this much per send_all, so that its progress
# (which tells a slow receiver from a stalled one) is seen often.
WRITE_BATCH = 1 << 20
# Back-pressure (see sessions.base.Congestion): a reader that fed a congested
# receiver pauses in steps of STALL_STEP, at most MAX_STALL per chunk; a
# receiver whose writer made no progress for STALLED_AFTER slows nobody.
STALL_STEP = 0.002
MAX_STALL = 0.05
STALLED_AFTER = 0.25
# Fairness (issue 12): a reader hands a received chunk to its session in slices of at most
# SLICE bytes, and lets every other task run (a checkpoint) once it has used TURN seconds
# since its last one, or when its session paused (its share of control frames per turn, or
# its control budget, is spent: see Session.spend_control).
SLICE = 64 * 1024
TURN = 0.001
# Connections accepted beyond max_connections, at most this many at once, get a short
# handshake so that a native client can be told why (ERROR limit); beyond them, new
# connections are closed at accept without reading a byte.
REFUSAL_SLOTS = 16
REFUSAL_HANDSHAKE = 1.0
# Membership events wait this long so that a burst of closes is seen whole
# before anyone is told (see Hub.deliver).
NOTICE_DELAY = 0.005
NOTICE_MAX_DELAY = 1.0

# Accept errors that mean "out of resources right now": retried after a pause,
# as trio.serve_listeners does, instead of killing the accept loop.
_ACCEPT_RETRY = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
_ACCEPT_PAUSE = 0.1

# Refusals at accept, write timeouts with policy drop, rate-limited closes: at most one
# WARNING line per this many seconds for each, with a count of those not logged.
REFUSAL_LOG_INTERVAL = 10.0
REFUSAL_WHY = {
    "limit": "max_connections reached (and its refusal slots in use)",
    "limit_per_ip": "max_connections_per_ip reached for the client's address",
}

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
    """A live TCP connection and its session.

    Also the one per-connection object behind the callbacks the server gives the outbox
    (:meth:`direct`, :meth:`start_writer`, :meth:`on_close`): bound methods of this object
    rather than closures per connection, and no nursery per connection (the writer task,
    when one is needed, runs in the server's nursery under :attr:`writer_scope`, which
    follows :attr:`scope`'s deadline): idle connections are what a router has most of
    (issue 24)."""

    __slots__ = ("close_reason", "counters", "handshake_deadline", "lot", "peer", "raw_send",
                 "scope", "server", "session", "stream", "writer", "writer_scope")

    def __init__(self, stream: trio.SocketStream, peer: str, server: Server | None = None
                 ) -> None:
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


class Server:
    """A gossiprouter listening on one port.

    Use :meth:`serve` in a nursery (``await nursery.start(server.serve)``
    returns the bound ``(host, port)``), and :meth:`shutdown` to stop it
    gracefully. ``hooks`` decide at accept and at protocol detection (TLS, allow-lists,
    tokens: :class:`gossiprouter.ops.runtime.Operations`, built from the same config);
    without them, a config that needs them is refused (ConfigError).
    """

    def __init__(self, config: Config, hub: Hub | None = None, *,
                 hooks: ServerHooks | None = None) -> None:
        if hooks is None:
            unserved = needs_hooks(config)
            if unserved:
                raise ConfigError(
                    f"{', '.join(unserved)}: served by the operations layer, which this "
                    "server was built without; pass hooks=gossiprouter.ops.runtime."
                    "Operations(config) (as `gossiprouter serve` and gossiprouter.router."
                    "Router do)")
            hooks = NoHooks()
        self.config = config
        self.hub = hub or Hub(config)
        self.hooks = hooks
        # The native sessions ask the hooks' token authority (None: no tokens).
        self.hub.auth = hooks.auth
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
        # Where connections and their writer tasks run (set by serve).
        self._nursery: trio.Nursery | None = None
        # The run's clock, shared by every Feeder (set by serve).
        self.clock: Callable[[], float] = trio.current_time
        # Open connections per client IP (max_connections_per_ip).
        self._per_ip: dict[str, int] = {}
        self._refusals = RateLimitedLog(log, REFUSAL_LOG_INTERVAL)
        # Reads established plain-TCP connections from one task (gossiprouter.server.dispatch).
        self.dispatcher = Dispatcher(RECV_SIZE,
                                     self.hub.batch if config.coalesce_writes else None)
        # The compiled fast path (server.fastpath), when built and not switched off: its
        # thread reads and writes the plain-TCP connections past their handshake.
        fast, self._fast_status = status(config)
        self.fast = FastPath(self.hub) if fast else None
        # The MQTT federation bridge (docs/topics.md), checked here so a bad option fails start.
        self.bridge = Bridge(self.hub, config) if config.bridge else None

    @property
    def ops(self) -> ServerHooks:
        """Deprecated: the server's :attr:`hooks` (``router.server.ops`` was documented;
        an embedded :class:`~gossiprouter.router.Router` has ``router.ops``)."""
        warnings.warn("Server.ops is deprecated: use Server.hooks (or Router.ops)",
                      DeprecationWarning, stacklevel=2)
        return self.hooks

    def view(self) -> snapshot.RouterView:
        """What the hooks may read of this server: the hub, a census of the connections,
        the bridge (see :mod:`gossiprouter.server.snapshot`)."""
        connections = self.connections

        async def census() -> snapshot.ConnectionCensus:
            return await snapshot.census(connections)

        return snapshot.RouterView(self.hub, census, self.bridge)

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
        log.info("listening on %s:%d (native, JGroups 2.12 and 5.x on one port); fast path: %s",
                 *self.address, self._fast_status)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self.clock = trio.lowlevel.current_clock().current_time
                nursery.start_soon(self._reaper)
                nursery.start_soon(self._notifier)
                if cfg.dispatcher:
                    await nursery.start(self.dispatcher.run)
                if self.fast is not None:
                    await nursery.start(self.fast.run)
                await nursery.start(self.hooks.serve, self.view())
                if self.bridge is not None:
                    nursery.start_soon(self.bridge.run)
                task_status.started(self.address)
                with self._accept_scope:
                    await self._accept_loop(listener, nursery)
                await listener.aclose()
                # Shutdown: wait for connections to flush, then cut what is left; the
                # bridge's leave (published in shutdown()) within the same time.
                with trio.move_on_after(cfg.shutdown_timeout + 0.5):
                    while self.connections:
                        await trio.sleep(0.02)
                    if self.bridge is not None:
                        await self.bridge.left.wait()
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
        if self.bridge is not None:
            # First, so the federation sees this router's members leave (not suspected) and
            # the connections closing below publish nothing more.
            self.bridge.leave()
        self._accept_scope.cancel()
        deadline = trio.current_time() + self.config.shutdown_timeout
        for conn in list(self.connections):
            if conn.session is not None:
                conn.session.close("shutting_down", "router is shutting down")
            conn.limit(deadline)

    async def wait_closed(self) -> None:
        await self._closed.wait()

    # ------------------------------------------------------------------ accepting

    async def _accept_loop(self, listener: trio.abc.Listener[trio.SocketStream],
                           nursery: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as e:
                if e.errno in _ACCEPT_RETRY:
                    log.error("accept failed: %s; retrying in %.1fs", e, _ACCEPT_PAUSE)
                    await trio.sleep(_ACCEPT_PAUSE)
                    continue
                raise
            try:
                peer_addr = stream.socket.getpeername()
            except OSError:  # already gone
                stream.socket.close()
                continue
            ip = peer_addr[0]
            # IPv6 in brackets, as everywhere else ([::1]:port): logs, admin view, hooks.
            peer = format_hostport(ip, peer_addr[1])
            reason = self._over_limit(ip)
            if reason:
                # Refused before anything is read or started: a flood of connections costs
                # one accept and one close each, and never holds a slot.
                self.hooks.refused(peer, reason)
                self._refusals.warning("refusing connections: %s", REFUSAL_WHY[reason])
                stream.socket.close()
                continue
            # Counted here, not in the task, so that a burst of accepts sees them all.
            conn = Connection(stream, peer, self)
            cfg = self.config
            # Over max_connections (in a refusal slot): just long enough to be told why.
            over = len(self.connections) >= cfg.max_connections
            conn.handshake_deadline = trio.current_time() + (
                min(cfg.handshake_timeout, REFUSAL_HANDSHAKE) if over
                else cfg.handshake_timeout)
            self.connections.add(conn)
            self._per_ip[ip] = self._per_ip.get(ip, 0) + 1
            # One name for every connection's task (trio would make a new string each).
            nursery.start_soon(self._handle, conn, ip, name=CONNECTION_TASK)
            del conn, stream  # not kept alive by this loop until the next accept

    def _over_limit(self, ip: str) -> str:
        """Why a just-accepted connection must be closed at once ("" if it may stay)."""
        cfg = self.config
        if len(self.connections) >= cfg.max_connections + REFUSAL_SLOTS:
            return "limit"
        if cfg.max_connections_per_ip and self._per_ip.get(ip, 0) >= cfg.max_connections_per_ip:
            return "limit_per_ip"
        return ""

    async def _handle(self, conn: Connection, ip: str) -> None:
        """The connection's task: the handshake (:meth:`_run`, whose frame is gone once it
        returns), then the reader, in this one coroutine frame for the connection's life;
        the writer task, when one is needed, runs beside it (:meth:`Connection.start_writer`)
        and this task waits for it to end, as a nursery would, before closing the socket."""
        stream = conn.stream
        assert isinstance(stream, trio.SocketStream)
        with contextlib.suppress(OSError):  # a connection already reset fails in _run
            stream.setsockopt(_stdsocket.IPPROTO_TCP, _stdsocket.TCP_NODELAY, True)
        try:
            with conn.scope:
                initial = await self._run(conn)
                session = conn.session
                if initial is not None and session is not None:
                    # Every chunk goes through the connection's Feeder, whoever reads it: this
                    # task (TLS, or ``dispatcher`` off) or the dispatcher (plain TCP), which
                    # hands the connection back here whenever the Feeder asks for a wait
                    # (_settle).
                    feeder = Feeder(self, conn, session)
                    if not initial or feeder.closed or await self._settle(
                            feeder, feeder.feed(initial)):
                        del initial
                        await self._reader(conn, session, feeder)
                    # The reader is done (EOF or the session closed): let the writer flush,
                    # if there is anything to flush; a connection that closes with nothing
                    # queued needs no writer task at all (cheaper when thousands of clients
                    # drop at once).
                    del feeder
                    ob = session.outbox
                    if conn.writer is None and not ob.chunks:
                        ob.wake = _nothing_to_wake
                    if not ob.closed:
                        ob.close("eof")
                    if conn.writer is not None or ob.chunks:
                        conn.start_writer()
                    del ob, session
                if conn.writer is not None:  # as a nursery waits for its tasks
                    await conn.writer.wait()
        finally:
            if conn.writer is not None and not conn.writer.is_set():
                # Cancelled (its deadline, or the server's end): so is the writer, which this
                # task waits for, as a nursery would, before the socket is closed.
                assert conn.writer_scope is not None
                conn.writer_scope.cancel()
                with trio.CancelScope(shield=True):
                    await conn.writer.wait()
            # Every admitted connection ends here, once: the one place its close is counted
            # (by reason; Counters.closed leaves out the peer's own ends).
            s = conn.session
            self.hub.counters.closed(conn.close_reason if s is None else s.outbox.close_reason)
            self.connections.discard(conn)
            left = self._per_ip.pop(ip) - 1
            if left:
                self._per_ip[ip] = left
            if conn.session is not None:
                if self.fast is not None:  # the relay thread forgets it before the close
                    self.fast.close(conn.session)
                conn.session.outbox.direct = None  # never write to a closed socket
                try:
                    self._forget(conn.session)
                except Exception as exc:  # the connection is gone anyway: log, count
                    self.hub.contain(conn.session, exc, "removing its members")
                # Its buffers and budget back now; its outbox's callbacks (bound to conn,
                # which holds the session) dropped, so no cycle keeps them until a GC
                # (Session.release).
                conn.session.release()
            with trio.CancelScope(shield=True):
                if conn.stream is not stream:  # TLS: try to send close_notify, briefly
                    with trio.move_on_after(0.5):
                        await conn.stream.aclose()
                else:
                    _drop_unread(stream)
                await stream.aclose()

    async def _run(self, conn: Connection) -> bytes | None:
        """The handshake: the accept hook, the protocol, the session. Returns what the
        handshake read beyond the preamble (None: closed before it had a session)."""
        cfg = self.config
        first = b""
        with trio.move_on_at(conn.handshake_deadline) as handshake:
            assert isinstance(conn.stream, trio.SocketStream)
            stream = await self.hooks.accept(conn.stream, conn.peer)
            if stream is None:  # e.g. not in an allow-list, failed TLS (logged there)
                return None
            conn.stream = stream
            verdict = None
            while verdict is None:
                try:
                    data = await conn.stream.receive_some(SNIFF_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return None
                if not data:
                    return None
                first += data
                verdict = sniff(first)
        if handshake.cancelled_caught:
            log.info("closing %s: handshake not done within %.1fs (no protocol preamble)",
                     conn.peer, cfg.handshake_timeout)
            conn.close_reason = "handshake_timeout"
            return None
        if isinstance(verdict, str):
            log.info("closing %s: %s", conn.peer, verdict)
            conn.close_reason = "protocol"
            return None
        assert verdict is not None
        # Per-protocol allow-list; may wait (failed authentications from this address).
        refusal = None
        with trio.move_on_at(conn.handshake_deadline) as handshake:
            refusal = await self.hooks.admit(conn.peer, verdict.protocol)
        if handshake.cancelled_caught:
            log.info("closing %s: handshake not done within %.1fs (held back after "
                     "failed authentications from its address)", conn.peer,
                     cfg.handshake_timeout)
            conn.close_reason = "handshake_timeout"
            return None
        factory = self.factories.get(verdict.protocol)
        session = None if factory is None else factory(self.hub, conn.peer, first)
        if session is None:
            log.info("closing %s: %s protocol is not served on this port", conn.peer,
                     verdict.protocol)
            conn.close_reason = "protocol"
            return None
        conn.session = session
        now = trio.current_time()
        session.last_recv = now
        ob = session.outbox
        if isinstance(conn.stream, trio.SocketStream) and cfg.direct_send:
            # trio keeps its sockets non-blocking, so the reader of another
            # connection may write straight to this one while its writer is
            # idle (Outbox.push); TLS streams always go through the writer.
            raw = getattr(conn.stream.socket, "_sock", None)
            if raw is not None:
                # With the fast path, through the relay thread's mutex while it writes too.
                if self.fast is None:
                    conn.raw_send = raw.send
                    conn.counters = self.hub.counters
                    ob.direct = conn.direct
                else:
                    ob.direct = self.fast.open(session, raw, self.hub.counters)
        # The writer task starts only when something has to wait for the socket.
        ob.wake = conn.start_writer
        ob.on_close = conn.on_close
        if refusal is not None:
            # Told why where the protocol can say so (native ERROR), then closed.
            session.close("unauthorized", refusal)
        elif self._stopping or len(self.connections) > cfg.max_connections:
            reason = "shutting_down" if self._stopping else "limit"
            if reason == "limit":
                log.warning("refusing %s: %d connections (max_connections %d)", conn.peer,
                            len(self.connections) - 1, cfg.max_connections)
            session.close(reason, f"too many connections (max {cfg.max_connections})"
                          if reason == "limit" else "router is shutting down")
        else:  # the rest (initial) is counted by the Feeder
            self.hub.counters.bytes_in += verdict.consumed
        return first[verdict.consumed:] if not ob.closed else b""

    def _reader(self, conn: Connection, session: Session, feeder: Feeder
                ) -> Coroutine[Any, Any, None]:
        """What feeds the session what the socket delivers, until EOF or the session closes:
        the dispatcher's (or the fast path's) ``serve`` for plain TCP, else :meth:`_receive`.

        A plain function returning the coroutine that :meth:`_handle` awaits, so that an
        idle connection keeps no frame of its own here: only :meth:`_handle`'s and the
        dispatcher's (issue 24)."""
        stream = conn.stream
        if self.config.dispatcher and isinstance(stream, trio.SocketStream):
            fast = self.fast
            if fast is not None and fast.reads(session):
                return fast.serve(session, feeder, self._settle)
            raw = getattr(stream.socket, "_sock", None)
            if raw is not None:
                return self.dispatcher.serve(raw, feeder, self._settle)
        return self._receive(stream, feeder)

    async def _receive(self, stream: trio.SocketStream | ByteStream, feeder: Feeder) -> None:
        """The connection's own reader loop (TLS, or ``dispatcher`` off)."""
        while not feeder.closed:
            try:
                chunk = await stream.receive_some(RECV_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not chunk:
                feeder.eof()
                return
            step = feeder.feed(chunk)
            del chunk  # not held while waiting for the next one (thousands of idle readers)
            if not await self._settle(feeder, step):
                return

    async def _settle(self, feeder: Feeder, step: int) -> bool:
        """Do the wait ``feeder`` asked for (see the steps above Feeder), feeding on after
        it until the chunk is done. True: read the next chunk; False: the reader is over."""
        while True:
            if step == READ:
                return True
            if step == END:
                return False
            if step == THROTTLE:
                await self._throttle()
                return not feeder.closed
            if step == YIELD:
                await trio.lowlevel.checkpoint()
                feeder.turn = trio.current_time()
            else:
                assert step == PAUSE
                feeder.turn = await self._pause(feeder.session, feeder.turn)
            step = feeder.run()

    async def _pause(self, session: Session, turn: float) -> float:
        """The session paused and must wait: its share of this turn was spent after the
        turn's time (a checkpoint), or its control budget is spent (wait for the bucket,
        or close it when it stays over). Returns when its new turn starts."""
        counters = self.hub.counters
        if session.tokens >= 0:
            counters.turns_cut += 1
            await trio.lowlevel.checkpoint()
            return trio.current_time()
        counters.throttled_turns += 1
        cfg = self.config
        now = trio.current_time()
        since = session.over_since if session.over_since is not None else now
        if now - since >= cfg.control_grace:
            counters.rate_limited += 1
            self._refusals.warning(
                "closing %r: over its control budget (%g frames/s, burst %d) for %.1fs",
                session, cfg.control_rate, cfg.control_burst, now - since)
            session.close("rate_limited",
                          f"more than {cfg.control_rate:g} control frames per second "
                          f"(burst {cfg.control_burst}) for {cfg.control_grace:g}s")
            return now
        # Read nothing more from it until the bucket holds a turn's share again: TCP then
        # slows the client down to its budget.
        refill = min(TURN_CONTROLS, session.control_burst) - session.tokens
        await trio.sleep(refill / session.control_rate)
        return trio.current_time()

    def _handshake_expired(self, conn: Connection, session: Session) -> None:
        log.info("closing %r: handshake not done within %.1fs", session,
                 self.config.handshake_timeout)
        session.close("handshake_timeout",
                      f"handshake not done within {self.config.handshake_timeout:g}s")

    async def _throttle(self) -> None:
        """Pause this reader while a receiver it fed is congested but still draining."""
        congestion = self.hub.congestion
        end = trio.current_time() + MAX_STALL
        while True:
            now = trio.current_time()
            if now >= end or not congestion.draining(now, STALLED_AFTER):
                return
            await trio.sleep(STALL_STEP)

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
                try:  # failures per target are contained inside; this is the last resort
                    hub.flush_notices(hub.take_pending())
                except Exception as exc:
                    self._task_error("notifier", exc)
        finally:
            hub.defer = None

    # ------------------------------------------------------------------ reaper

    def _task_error(self, task: str, exc: Exception) -> None:
        """An exception in a router-wide task: logged and counted; the task carries on."""
        self.hub.counters.internal_errors += 1
        log.error("internal error in the %s (it carries on)", task, exc_info=exc)

    async def _reaper(self) -> None:
        """Idle connections, expired entries, ended reconnect graces."""
        cfg = self.config
        idle = cfg.idle_timeout
        write_timeout = cfg.write_timeout
        while True:
            try:
                await self._reap(idle, write_timeout)
            except Exception as exc:
                self._task_error("reaper", exc)
                await trio.sleep(1.0)

    async def _reap(self, idle: float, write_timeout: float) -> None:
        """One round of the reaper, then sleep until the next thing to reap."""
        self.hub.sync()  # what the relay thread received counts for the idle timeout
        now = trio.current_time()
        wake = now + 1.0
        for conn in list(self.connections):
            s = conn.session
            if s is None or s.outbox.closed:
                continue
            if not s.established:
                if now >= conn.handshake_deadline:
                    self._handshake_expired(conn, s)
                    continue
                wake = min(wake, conn.handshake_deadline)
            if idle > 0:
                if now - s.last_recv >= idle:
                    log.info("closing %r: idle for %.1fs", s, now - s.last_recv)
                    s.close("idle_timeout", f"nothing received for {idle:g}s")
                    continue
                wake = min(wake, s.last_recv + idle)
            if write_timeout > 0 and s.outbox.chunks:
                if now - s.outbox.last_progress >= write_timeout:
                    self._write_timeout(s, now)
                else:
                    wake = min(wake, s.outbox.last_progress + write_timeout)
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

    def _write_timeout(self, s: Session, now: float) -> None:
        """NATS' write deadline: data queued for ``s`` and its socket took nothing for
        write_timeout seconds. Its slow-consumer policy applies: ``disconnect`` closes it
        (ERROR slow_consumer); ``drop`` discards what is queued (counted in
        drops{reason="write_timeout"}) and keeps the connection, which the idle timeout
        still covers."""
        ob = s.outbox
        counters = self.hub.counters
        counters.write_timeouts += 1
        stalled = now - ob.last_progress
        if ob.policy == "drop":
            # The first chunk may be the tail of a frame whose start is on the wire: it
            # stays, so the stream remains whole.
            dropped = len(ob.chunks) - 1
            if dropped:
                ob.dropped += dropped
                counters.drop("write_timeout", dropped)
                ob.nbytes = len(ob.chunks[0])
                del ob.chunks[1:]
            ob.last_progress = now
            self._refusals.warning("%r: socket took nothing for %.1fs (write_timeout): "
                                   "%d queued chunks dropped", s, stalled, dropped)
            return
        counters.slow_consumer_disconnects += 1
        log.warning("closing %r: slow consumer (socket took nothing for %.1fs, "
                    "write_timeout %gs)", s, stalled, self.config.write_timeout)
        ob.close("slow_consumer",
                 s.farewell("slow_consumer", f"nothing written for {stalled:.1f}s "
                            f"(write_timeout {self.config.write_timeout:g}s)"),
                 discard=True)


# What Feeder.feed / Feeder.run ask of the connection's task (besides READ: read the next
# chunk, and END: the reader is over, from gossiprouter.server.dispatch). The dispatcher handles
# READ itself and hands the connection back to its task for everything else (Server._settle).
YIELD = 2  # the turn's time (TURN) is used: a checkpoint, then Feeder.run
PAUSE = 3  # the session paused and must wait (Server._pause), then Feeder.run
THROTTLE = 4  # a receiver it fed is congested: Server._throttle, then the next chunk


class Feeder:
    """The one place that processes a received chunk for a session, whoever read it (the
    connection's reader task or the dispatcher): it counts the bytes, feeds the session in
    slices of SLICE bytes within a turn of TURN seconds, withholds the session's replies to
    itself and flushes them once per slice (:meth:`_flush_own`), honours the session's pause
    (its share of control frames per turn, or its control budget), contains the session's
    exceptions (Hub.contain) and checks the handshake deadline. It never waits: where a
    wait is due it returns a step (YIELD, PAUSE, THROTTLE) and keeps its place; the
    connection's task waits (Server._settle) and calls :meth:`run` to go on."""

    __slots__ = ("clock", "conn", "data", "hub", "outbox", "pos", "resume", "server", "session",
                 "turn")

    def __init__(self, server: Server, conn: Connection, session: Session) -> None:
        self.server = server
        self.hub = server.hub
        self.conn = conn
        self.session = session
        self.outbox = session.outbox
        self.data = b""  # the chunk being fed, from pos on
        self.pos = 0
        self.turn = 0.0  # when the current turn started (after the last checkpoint)
        self.resume = False  # the session paused: go on with on_data(b"")
        # The run's clock itself: trio.current_time() is two more calls to reach it, and
        # a light-load message reads the clock twice (issue 16, Step 3). The server's, one
        # bound method for every connection (issue 24).
        self.clock = server.clock

    @property
    def closed(self) -> bool:
        return self.outbox.closed

    def feed(self, data: bytes) -> int:
        """A chunk was received (right after a read, which was a checkpoint)."""
        self.hub.counters.bytes_in += len(data)
        self.data = data
        self.pos = 0
        now = self.turn = self.clock()
        return self.run(now)

    def eof(self) -> None:
        """The peer closed its side."""
        try:
            self.session.on_eof()
        except Exception as exc:  # see "Errors" above: this connection only
            self.hub.contain(self.session, exc, "handling its end of stream")

    def run(self, now: float = -1.0) -> int:
        """Feed the chunk on from where it stopped, until it is done or a wait is due
        (``now``: the time, when the caller just read the clock)."""
        session = self.session
        ob = self.outbox
        if ob.closed:
            self.data = b""
            return END
        clock = self.clock
        data = self.data
        size = len(data)
        pos = self.pos
        resume = self.resume
        self.resume = False
        # The session's replies to itself (PONG, OK, echoed HEARTBEATs, its own
        # multicasts) are queued while it runs and written once afterwards, not
        # with one send() each.
        held = ob.direct, ob.wake
        ob.direct, ob.wake = None, _nothing_to_wake
        try:
            while True:
                session.new_turn()
                if resume:
                    resume = False
                    session.on_data(b"", clock())
                else:
                    piece = data if size <= SLICE else data[pos:pos + SLICE]
                    pos += SLICE
                    session.on_data(piece, now if now >= 0.0 else clock())
                    now = -1.0
                if session.paused and not ob.closed:
                    # Its share of this turn's control frames is spent: it goes on at once
                    # while the turn's time is not used up; otherwise it waits.
                    if session.tokens >= 0 and clock() - self.turn < TURN:
                        resume = True
                        continue
                    self.pos, self.resume = pos, True
                    self._flush_own(held)
                    return PAUSE
                if ob.closed or pos >= size:
                    break
                if clock() - self.turn >= TURN:
                    self.hub.counters.turns_cut += 1
                    self.pos = pos
                    self._flush_own(held)
                    return YIELD
        except Exception as exc:  # see "Errors" above: this connection only
            self.hub.contain(session, exc, "handling received data")
            self.data = b""
            self._flush_own(held)  # gives back the wake-up: the farewell goes out
            return END
        self.data = b""
        if ob.chunks or ob.closed:
            self._flush_own(held)
        else:  # nothing for itself (most chunks under light load): no call
            ob.direct, ob.wake = held
        if not session.established and not ob.closed and clock() >= (
                self.conn.handshake_deadline):
            self.server._handshake_expired(self.conn, session)
        congestion = self.hub.congestion
        if congestion.pending:
            congestion.pending = False
            return THROTTLE
        return END if ob.closed else READ

    def _flush_own(self, held: tuple[Callable[[bytes], int] | None, Callable[[], None]]
                   ) -> None:
        """Give the outbox back the direct send and the wake-up withheld while the session
        ran, and write what the session queued for its own connection meanwhile (PONG, OK,
        echoed HEARTBEATs, its own multicasts) in one send instead of one per reply.
        Outbox.push sends directly when the writer is idle, else wakes it."""
        ob = self.outbox
        ob.direct, ob.wake = held
        if ob.closed:
            ob.wake()  # the farewell queued by close() must be written
            return
        ob.flush()  # held for the round's WriteBatch, if one is open


def _drop_unread(stream: trio.SocketStream) -> None:
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


def _nothing_to_wake() -> None:
    pass


def _native_factory(hub: Hub, peer: str, first: bytes) -> Session:
    return NativeSession(hub, peer)
