"""One router's connection kept up: connect, read, heartbeat, register, dispatch.

:class:`Links` runs, for every router, :meth:`Links.keep_connected`: connection attempts with
backoff and, while a connection is up, its three tasks:

* the **reader** cuts what arrives into frames and :meth:`dispatches <Links.dispatch>` each:
  answers to the pending requests, PING/PONG, ROUTE / PUBLISH / EVENT to the stub's own side
  (:class:`~gossiprouter.client.local.Local`); it never waits, since it serves every channel;
* the **heartbeat** answers PINGs, sends its own, and drops a connection that stayed silent for
  ``heartbeat_timeout`` (half-open detection);
* the **registrar** keeps the connection's registrations equal to the stub's channels and
  watches (:func:`gossiprouter.client.registrar.plan`) and marks the router CONNECTED once the
  first pass is answered.

Errors: a network failure (refused, reset, timed out, a bad handshake, a write that cannot make
progress, heartbeat silence) kills that one connection (:meth:`Connection.kill`) and the loop
tries again after the backoff; it is never raised. Anything else a task raises is a bug: it
ends the connection's tasks and propagates to the stub (see :mod:`gossiprouter.client.lifecycle`).
"""

from __future__ import annotations

import itertools
import logging
import math
import random
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import anyio

from gossiprouter.client import registrar
from gossiprouter.client.channel import Channel
from gossiprouter.client.connection import (
    STREAM_ERRORS,
    Connection,
    HandshakeError,
    PendingRequest,
    ReplyTooLarge,
    RouterSlot,
    describe_error,
    open_connection,
)
from gossiprouter.client.errors import (
    ConnectionLostError,
    LinkDown,
    RequestTimeoutError,
    RouterError,
    StubError,
    router_error,
)
from gossiprouter.client.local import Local
from gossiprouter.client.model import (
    CLOSING_CODES,
    MAX_QUEUED_PONGS,
    RECV_SIZE,
    WARN_INTERVAL,
    GroupEvent,
    Key,
    Policy,
    fmt_router,
)
from gossiprouter.client.status import ConnectionState
from gossiprouter.client.streams import Waiters
from gossiprouter.core.ratelog import RateLimitedLog
from gossiprouter.core.topics import TopicId
from gossiprouter.protocol import native as wire
from gossiprouter.protocol.errors import ProtocolError

log = logging.getLogger("gossiprouter.stub")

# RouterStub._emit: a router's new state, with the error and the backoff delay if any.
Emit = Callable[[RouterSlot, ConnectionState, "str | None", "float | None"], None]


class LinkSettings(Protocol):
    """The options that shape a connection; :class:`RouterStub` is one (see it for each)."""

    connect_timeout: float
    request_timeout: float
    reconnect_initial: float
    reconnect_max: float
    reconnect_reset: float
    heartbeat_interval: float
    heartbeat_timeout: float
    max_frame: int
    client_name: str
    token: str | None
    ssl_context: ssl.SSLContext | None
    server_hostname: str | None


def write_timeout(s: LinkSettings) -> float:
    """How long a write may block: a router that took no bytes for the heartbeat timeout is
    as dead as a silent one (30 s when heartbeats are off)."""
    return s.heartbeat_timeout if s.heartbeat_timeout > 0 else 30.0


@dataclass
class Op:
    """One request the registrar sends to bring a connection in line with the stub."""

    frame: wire.Connect | wire.Disconnect | wire.Watch | wire.Unwatch | wire.Subscribe \
        | wire.Unsubscribe
    on_written: Callable[[], None]
    on_result: Callable[[wire.Ok | StubError], None]


def _nothing() -> None:
    pass


def _ignore(result: wire.Ok | StubError) -> None:
    pass


def _left(link: Connection, ch: Channel, result: wire.Ok | StubError) -> None:
    link.held.leaving.discard(ch)


class Links:
    """Every router's connection, kept up for one stub."""

    def __init__(self, settings: LinkSettings, slots: Sequence[RouterSlot], local: Local,
                 emit: Emit) -> None:
        self.settings = settings
        self.slots = slots
        self.local = local
        self.emit = emit
        self._req = itertools.count(1)
        self._nonce = itertools.count(1)
        self._rr = itertools.count()  # the round-robin position
        self._changed = Waiters()
        # What a router can make the stub log at will (bad frames, ERRORs without a request):
        # one line per kind per WARN_INTERVAL, however many routers and connections.
        self._warn = RateLimitedLog(log, WARN_INTERVAL)

    @property
    def changed(self) -> anyio.Event:
        """Set at the next change of connection or registration state: take it, check the
        state, then wait on it."""
        return self._changed.event()

    def notify_changed(self) -> None:
        """Wake every call waiting for a change of connection or registration state (they
        re-read the state, then wait on the new :attr:`changed`)."""
        self._changed.wake()

    def live(self) -> list[Connection]:
        """The connections that are up (registered or not yet)."""
        return [t.link for t in self.slots if t.link is not None and not t.link.dead]

    def ready(self) -> list[Connection]:
        """The CONNECTED connections (the first registration pass answered)."""
        return [lk for lk in self.live() if lk.ready]

    def registered(self, ch: Channel) -> list[Connection]:
        """The CONNECTED connections that hold ``ch`` (CONNECT written, not refused)."""
        return [lk for lk in self.ready() if ch.key in lk.held.registered]

    def carriers(self, ch: Channel, policy: Policy) -> list[Connection]:
        """The connections that may carry ``ch``'s messages, in the order to try them."""
        links = [lk for lk in self.ready() if ch in lk.held.routable]
        if len(links) < 2:
            return links
        if policy == "round-robin":
            i = next(self._rr) % len(links)
            return links[i:] + links[:i]
        random.shuffle(links)
        return links

    def next_req(self) -> int:
        return next(self._req)

    def wake_registrars(self) -> None:
        """Ask every connection's registrar to compare itself with the desired state."""
        for lk in self.live():
            lk.kick.set()

    # ------------------------------------------------------------------ connecting

    def _backoff(self, n: int) -> float:
        s = self.settings
        cap = min(s.reconnect_max, s.reconnect_initial * 2.0 ** min(n, 62))
        return random.uniform(0.0, cap)

    async def keep_connected(self, t: RouterSlot) -> None:
        """Connect to ``t``'s router, run the connection, and reconnect, until cancelled."""
        s = self.settings
        n = 0  # consecutive failures, for the backoff
        while True:
            t.attempts += 1
            self.emit(t, ConnectionState.CONNECTING, None, None)
            try:
                link = await open_connection(
                    t, connect_timeout=s.connect_timeout, ssl_context=s.ssl_context,
                    server_hostname=s.server_hostname, client_name=s.client_name,
                    token=s.token, write_timeout=write_timeout(s), max_frame=s.max_frame)
            except (*STREAM_ERRORS, TimeoutError, HandshakeError) as e:
                t.failures += 1
                t.last_error = describe_error(e) if not isinstance(e, HandshakeError) else str(e)
                log.debug("cannot connect to %s: %s", fmt_router(t.address), t.last_error)
            else:
                if link.max_frame < link.announced_max_frame:
                    self.warn("router %s announces max_frame %d, more than this client's "
                              "max_frame option (%d): frames past it end the connection",
                              fmt_router(t.address), link.announced_max_frame,
                              link.max_frame)
                started = anyio.current_time()
                await self._run_link(t, link)
                t.last_error = link.error
                if anyio.current_time() - started >= s.reconnect_reset:
                    n = 0
            delay = self._backoff(n)
            n += 1
            self.emit(t, ConnectionState.RECONNECTING, t.last_error, delay)
            await anyio.sleep(delay)

    async def _run_link(self, t: RouterSlot, link: Connection) -> None:
        t.link = link
        try:
            with link.scope:
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._reader, link)
                    tasks.start_soon(self._heartbeat, link)
                    tasks.start_soon(self._registrar, link)
        finally:
            link.kill(link.error or "closed")
            t.link = None
            self.local.presence.forget_router(t.address)
            with anyio.CancelScope(shield=True):
                await anyio.aclose_forcefully(link.stream)
            self.notify_changed()

    def warn(self, fmt: str, *args: object) -> None:
        """A WARNING a router can cause at will: rate-limited (:data:`WARN_INTERVAL`)."""
        self._warn.warning(fmt, *args, now=anyio.current_time())

    async def _reader(self, link: Connection) -> None:
        dec = link.decoder
        stream = link.stream
        while True:
            framed = False
            # Nothing more is handed on once the connection is dead (killed by a frame here,
            # or by another task): what the router sent after that is not news, and not logged.
            while not link.dead:
                try:
                    f = dec.next_frame()
                    if f is not None:
                        # A frame the state table refuses now (a second WELCOME, a CONNECT)
                        # is a bad frame like an undecodable one: counted, logged, dropped.
                        link.proto.receive(type(f))
                except ProtocolError as e:
                    self.local.stats.bad_frames += 1  # an unframed stream too (framing check)
                    if e.code == "frame_too_large":
                        link.kill(link.too_large(e))
                        return
                    framed = True  # a whole frame, if a bad one
                    self.warn("dropping a bad frame from %s: %s", fmt_router(link.router), e)
                    continue
                if f is None:
                    break
                framed = True
                self.dispatch(link, f)
            if link.dead:
                return
            if framed:
                # Life is whole frames, not bytes: a router that drips a frame one byte at a
                # time and never ends it is dropped at the heartbeat timeout.
                link.last_recv = anyio.current_time()
            try:
                data = await stream.receive(RECV_SIZE)
            except anyio.EndOfStream:
                link.kill("router closed the connection")
                return
            except STREAM_ERRORS as e:
                link.kill(f"connection broken: {describe_error(e)}")
                return
            dec.feed(data)

    async def _heartbeat(self, link: Connection) -> None:
        interval = self.settings.heartbeat_interval
        if interval > 0 and link.router_heartbeat > 0:
            # Never ping less often than the router asks, or its idle timeout would close us.
            interval = min(interval, link.router_heartbeat)
        if interval > 0 and link.router_idle > 0:
            # Nor less than twice per idle timeout, whatever heartbeat_ms says.
            interval = min(interval, link.router_idle / 2)
        timeout = self.settings.heartbeat_timeout
        next_ping = anyio.current_time() + interval if interval > 0 else math.inf
        try:
            while True:
                link.wake = anyio.Event()
                now = anyio.current_time()
                if timeout > 0 and now - link.last_recv >= timeout:
                    link.kill(f"nothing received for {timeout:g}s (heartbeat timeout)")
                    return
                if link.pongs:
                    pongs, link.pongs = link.pongs, []
                    await link.write(b"".join(wire.encode(wire.Pong(x)) for x in pongs),
                                     bounded=True)
                if now >= next_ping:
                    await link.write(wire.encode(wire.Ping(next(self._nonce))), bounded=True)
                    next_ping = now + interval
                # The others' writes are watched here, so they need no timer of their own.
                watch = link.watch_write(anyio.current_time())
                if link.dead:
                    return
                wake_at = min(next_ping, watch,
                              link.last_recv + timeout if timeout > 0 else math.inf)
                with anyio.CancelScope(deadline=wake_at):
                    await link.wake.wait()
        except LinkDown:
            return

    # ------------------------------------------------------------------ registering

    async def _registrar(self, link: Connection) -> None:
        """Keep this connection's registrations equal to the stub's channels and watches.

        On a new connection the first pass re-sends CONNECT for every channel
        (creation order) and WATCH for every watched group; only when it is
        done does the connection become CONNECTED and carry ROUTE frames.
        """
        t = link.transport
        try:
            while True:
                link.kick = anyio.Event()
                ops = self._plan(link)
                if ops:
                    await self._run_ops(link, ops)
                    self.notify_changed()
                    continue
                if not link.ready:
                    link.ready = True
                    t.connections += 1
                    t.last_error = None
                    log.info("connected to %s (%s)", fmt_router(t.address), link.welcome.router_id)
                    self.emit(t, ConnectionState.CONNECTED, None, None)
                await link.kick.wait()
        except LinkDown:
            return

    def _plan(self, link: Connection) -> list[Op]:
        """The registrar's plan (:func:`registrar.plan`) for this connection, as frames
        (request ids in plan order) with what to do when each is written and answered."""
        ops: list[Op] = []
        local = self.local
        for step in registrar.plan(link.held, local.channels, local.watchers.keys()):
            req = self.next_req()
            ch = step.channel
            if step.kind == "watch":
                ops.append(Op(wire.Watch(req, step.group), _nothing,
                              partial(self._watch_result, link, step.group)))
            elif step.kind == "unwatch":
                ops.append(Op(wire.Unwatch(req, step.group), _nothing, _ignore))
            elif ch is None:
                raise AssertionError(f"registrar step without a channel: {step}")
            elif step.kind == "connect":
                ops.append(Op(wire.Connect(req, ch.group, ch.addr, ch.name, ch.physical),
                              partial(link.held.routable.add, ch),
                              partial(self._connect_result, link, ch.key, ch)))
            elif step.kind == "disconnect":
                ops.append(Op(wire.Disconnect(req, ch.group, ch.addr), _nothing,
                              partial(_left, link, ch)))
            else:
                assert step.pattern is not None
                if step.kind == "subscribe":
                    ops.append(Op(wire.Subscribe(req, ch.group, ch.addr, *step.pattern),
                                  _nothing,
                                  partial(self._subscribe_result, link, ch, step.pattern)))
                else:
                    ops.append(Op(wire.Unsubscribe(req, ch.group, ch.addr, *step.pattern),
                                  _nothing, _ignore))
        return ops

    def _subscribe_result(self, link: Connection, ch: Channel, pat: TopicId,
                          r: wire.Ok | StubError) -> None:
        if isinstance(r, wire.Ok):
            link.held.sub_acked.setdefault(ch.key, set()).add(pat)
            return
        if not isinstance(r, RouterError):
            return  # lost connection or timeout: the next connection re-subscribes
        link.held.subscribed.get(ch.key, set()).discard(pat)
        ch._patterns.discard(pat)
        ch._sub_errors[pat] = r
        log.warning("%s refused a subscription of %r: %s", fmt_router(link.router), ch, r)

    def _connect_result(self, link: Connection, key: Key, ch: Channel,
                        r: wire.Ok | StubError) -> None:
        if isinstance(r, wire.Ok):
            if ch._waiting:
                ch._results[link] = None
            return
        if not isinstance(r, RouterError):
            return  # timeout or lost connection: the heartbeat / reconnect deals with it
        link.held.refuse(key, ch)
        if ch._waiting:
            ch._results[link] = r
        elif not ch._closed:
            log.warning("%s refused %r: %s", fmt_router(link.router), ch, r)
            ch._put_event(GroupEvent(ch.group, "refused", ch.member(), link.router, r,
                                     next(self.local.seq)))

    def _watch_result(self, link: Connection, group: str, r: wire.Ok | StubError) -> None:
        if isinstance(r, wire.Ok) and group in link.held.watching:
            link.held.watch_acked.add(group)

    # ------------------------------------------------------------------ requests

    def _timed_out(self, link: Connection) -> RequestTimeoutError:
        return RequestTimeoutError(f"no answer from {fmt_router(link.router)} within "
                                   f"{self.settings.request_timeout:g}s")

    async def _run_ops(self, link: Connection, ops: list[Op]) -> None:
        """Write the requests in one go (order kept), then wait for every answer."""
        pendings: list[tuple[Op, PendingRequest]] = []
        for op in ops:
            p = PendingRequest()
            link.pending[op.frame.req] = p
            pendings.append((op, p))
        try:
            await link.write(b"".join(wire.encode(op.frame) for op in ops))
            for op in ops:
                op.on_written()
            with anyio.move_on_after(self.settings.request_timeout):
                for _, p in pendings:
                    await p.event.wait()
        finally:
            for op in ops:
                link.pending.pop(op.frame.req, None)
        for op, p in pendings:
            op.on_result(p.result if p.result is not None else self._timed_out(link))

    async def request(self, link: Connection, frame: wire.GetMembers) -> wire.Ok | StubError:
        """Send one request on ``link`` and wait for its answer; errors are returned."""
        p = PendingRequest()
        link.pending[frame.req] = p
        try:
            try:
                await link.write(wire.encode(frame))
            except LinkDown as e:
                return ConnectionLostError(f"connection to {fmt_router(link.router)} lost: {e}")
            with anyio.move_on_after(self.settings.request_timeout):
                await p.event.wait()
        finally:
            link.pending.pop(frame.req, None)
        if p.result is None:
            return self._timed_out(link)
        return p.result

    # ------------------------------------------------------------------ receiving

    def dispatch(self, link: Connection, f: wire.Frame) -> None:
        """Hand one received frame on. Never waits: the reader serves every channel."""
        local = self.local
        match f:
            case wire.Route():
                local.deliver_route(f)
            case wire.Publish(flags=flags):
                if flags & wire.PUB_GLOBAL and not self._global_source(link):
                    local.stats.federated_duplicates += 1
                    return
                local.deliver_publish(f)
            case wire.Ok(req):
                p = link.pending.get(req)
                if p is not None:
                    try:
                        p.ok(f)
                    except ReplyTooLarge as e:
                        link.kill(f"protocol violation: {e}")
            case wire.Error(req, code, message):
                p = None if req is None else link.pending.get(req)
                if p is not None:
                    p.set(router_error(code, message, link.router))
                elif code in CLOSING_CODES:
                    # The router closes the connection next; remember why.
                    link.farewell = f"router closed the connection: {code}: {message}"
                else:
                    counts = local.stats.async_errors
                    counts[code] = counts.get(code, 0) + 1
                    self.warn("router %s: %s: %s", fmt_router(link.router), code, message)
            case wire.Ping(nonce):
                if len(link.pongs) >= MAX_QUEUED_PONGS:
                    link.kill(f"protocol violation: router sent more than {MAX_QUEUED_PONGS} "
                              "PINGs without reading the PONGs")
                    return
                link.pongs.append(nonce)
                link.wake.set()
            case wire.Pong():
                pass  # last_recv is already updated: every frame counts as life
            case wire.Event():
                local.deliver_event(link.router, f, anyio.current_time())
            # Nothing else gets here: the reader ran ``f`` through the state table, which lets
            # a router send an open connection exactly the types above.

    def _global_source(self, link: Connection) -> bool:
        """Whether global publications are taken from ``link``.

        Routers of one federation (same ``federation`` in WELCOME) each deliver every
        global publication, so a stub on several of them takes those from one only: the
        first connected one in the order the routers were given. Local publications, and
        routers outside any federation, are always taken.
        """
        fed = link.welcome.settings.get("federation")
        if not fed:
            return True
        for t in self.slots:
            lk = t.link
            if lk is not None and lk.ready and not lk.dead \
                    and lk.welcome.settings.get("federation") == fed:
                return lk is link
        return True
