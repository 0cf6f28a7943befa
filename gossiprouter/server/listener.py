"""The trio server: listeners, a reader task per connection, a writer task when needed.

The server package is the only one that touches the clients' sockets. A connection's first
bytes say which protocol it speaks (:func:`sniff`); a session of that protocol then
turns what the reader receives into bytes queued on other connections'
outboxes, and each connection's writer drains its own outbox with one
``send_all`` per wake-up. A receiver that cannot keep up is handled by its
outbox's policy; nothing here ever waits on another connection's socket.

:class:`Server` is built in parts, one module each, each part over the one below it:
:mod:`gossiprouter.server.connection` (the :class:`~gossiprouter.server.connection.Connection`
and its writer), :mod:`gossiprouter.server.shutdown` (the shutdown, the reaper and the
notifier), :mod:`gossiprouter.server.feeder` (reading: the
:class:`~gossiprouter.server.feeder.Feeder` and the waits it asks for), and this module, the
accept path: listening, the connection limits, the protocol sniffed from the first bytes, the
handshake, and each connection's task from accept to close.

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
import socket as _stdsocket
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import trio

from gossiprouter.core.addresses import format_hostport
from gossiprouter.core.config import Config, ConfigError
from gossiprouter.core.ratelog import RateLimitedLog
from gossiprouter.federation.bridge import Bridge
from gossiprouter.protocol import native as wire
from gossiprouter.server import snapshot
from gossiprouter.server.connection import Connection, drop_unread, nothing_to_wake
from gossiprouter.server.dispatch import Dispatcher
from gossiprouter.server.fastpath import FastPath, status
from gossiprouter.server.feeder import RECV_SIZE, Feeder, ReadPart
from gossiprouter.server.hooks import NoHooks, ServerHooks, needs_hooks
from gossiprouter.sessions import jgroups2 as _jgroups2
from gossiprouter.sessions import jgroups5 as _jgroups5
from gossiprouter.sessions.base import Hub, Session
from gossiprouter.sessions.native import NativeSession

log = logging.getLogger("gossiprouter")

# The first read only has to tell the protocol; a small buffer keeps the
# allocator from fragmenting on thousands of connections that say little.
SNIFF_SIZE = 4096
CONNECTION_TASK = "gossiprouter connection"
# Connections accepted beyond max_connections, at most this many at once, get a short
# handshake so that a native client can be told why (ERROR limit); beyond them, new
# connections are closed at accept without reading a byte.
REFUSAL_SLOTS = 16
REFUSAL_HANDSHAKE = 1.0

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


class Server(ReadPart):
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
        if self.fast is not None and self.bridge is not None:
            # The remote share of learned routes published by the relay thread itself.
            self.bridge.attach_link(self.fast.link)

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
        # Bound now (a taken port fails at once), listening only once the hooks' endpoint
        # (metrics, admin) and the bridge are started: whoever finds the port accepting
        # finds them up too.
        try:
            sock = await self._bind(cfg.host, cfg.port)
        except OSError as e:
            raise ListenError(cfg.host, cfg.port, e) from e
        sockname = sock.getsockname()
        self.address = (sockname[0], sockname[1])
        listener: trio.SocketListener | None = None
        refused: OSError | None = None
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
                try:
                    sock.listen(cfg.backlog)
                except OSError as e:
                    # Raised after the nursery, bare as the bind's is: from in here it
                    # would come out wrapped in the nursery's exception group.
                    refused = e
                    nursery.cancel_scope.cancel()
                else:
                    listener = trio.SocketListener(sock)
                    await self._serve_listening(listener, nursery, task_status)
            if refused is not None:
                raise ListenError(*self.address, refused) from refused
        finally:
            with trio.CancelScope(shield=True):
                if listener is not None:
                    await listener.aclose()
                else:
                    sock.close()
            self._closed.set()
            log.info("stopped")

    async def _serve_listening(
        self, listener: trio.SocketListener, nursery: trio.Nursery,
        task_status: trio.TaskStatus[tuple[str, int]],
    ) -> None:
        """Accept on ``listener`` until :meth:`shutdown`, then let the connections flush."""
        assert self.address is not None
        log.info("listening on %s:%d (native, JGroups 2.12 and 5.x on one port); "
                 "fast path: %s", *self.address, self._fast_status)
        task_status.started(self.address)
        with self._accept_scope:
            await self._accept_loop(listener, nursery)
        await listener.aclose()
        # Shutdown: wait for connections to flush, then cut what is left; the bridge's
        # leave (published in shutdown()) within the same time.
        with trio.move_on_after(self.config.shutdown_timeout + 0.5):
            while self.connections:
                await trio.sleep(0.02)
            if self.bridge is not None:
                await self.bridge.left.wait()
        nursery.cancel_scope.cancel()

    @staticmethod
    async def _bind(host: str, port: int) -> trio.socket.SocketType:
        """The router's socket, bound to (host, port) and not yet listening."""
        family = _stdsocket.AF_INET6 if ":" in host else _stdsocket.AF_INET
        sock = trio.socket.socket(family, _stdsocket.SOCK_STREAM)
        try:
            sock.setsockopt(_stdsocket.SOL_SOCKET, _stdsocket.SO_REUSEADDR, 1)
            await sock.bind((host, port))
        except BaseException:
            sock.close()
            raise
        return sock

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
                        ob.wake = nothing_to_wake
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
                    drop_unread(stream)
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


def _native_factory(hub: Hub, peer: str, first: bytes) -> Session:
    return NativeSession(hub, peer)
