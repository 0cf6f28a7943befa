"""RouterStub: the trio client library applications use to talk to gossiprouters.

One :class:`RouterStub` keeps **one** TCP connection per router (the shared
transport) and carries any number of :class:`Channel` objects over it: a
channel is one logical address registered in one group. The stub

* sends ``HELLO`` on every new connection and ``CONNECT`` for every channel,
  in the order the channels were created, before anything else goes out on
  that connection, so a router restart is invisible to the application;
* reconnects a broken connection with exponential backoff and full jitter
  (never a tight loop, JGRP-2266), and notices a hung router with
  application-level heartbeats (JGRP-2633): every received frame counts as
  life, and a connection silent for ``heartbeat_timeout`` is dropped;
* with several routers, registers with all of them, sends each message
  through one healthy router (``policy``), failing over to the next on a write
  error, receives from all, and merges member lists and membership events;
* matches every request (``req``) to its OK/ERROR and turns an ERROR into a
  typed :class:`RouterError` subclass.

Receive buffers are bounded and **drop the oldest** entry when full (counted
in :attr:`Channel.dropped`): the reader of a shared connection must never
wait for one slow application task, or heartbeats would stall and every other
channel would starve. ``docs/stub.md`` describes the behaviour in prose; the
wire protocol is ``docs/protocol.md``.
"""

from __future__ import annotations

import itertools
import logging
import math
import random
import ssl
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Any

import trio

from gossiprouter.client import registrar
from gossiprouter.client.channel import Channel
from gossiprouter.client.connection import (
    FOREIGN,
    Connection,
    HandshakeError,
    PendingRequest,
    RouterSlot,
    _peer_error,
    describe_error,
    open_connection,
)
from gossiprouter.client.errors import (
    ChannelClosedError,
    ConnectionLostError,
    FrameTooLargeError,
    LinkDown,
    ModeError,
    NotConnectedError,
    RequestTimeoutError,
    RouterError,
    StubError,
    router_error,
)
from gossiprouter.client.merge import Presence, SuspectFilter, merge_members
from gossiprouter.client.model import (
    CLIENT_NAME,
    CLOSING_CODES,
    RECV_SIZE,
    SUSPECT_DEDUPE_WINDOW,
    ConnectionState,
    GroupEvent,
    Key,
    Member,
    Message,
    Mode,
    Policy,
    Publication,
    RouterAddress,
    RouterStatus,
    StubEvent,
    StubStats,
    _check_addr,
    _check_group,
    _physical,
    fmt_router,
    parse_router,
)
from gossiprouter.client.streams import EventStream, Watch
from gossiprouter.protocol import native as wire
from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.topics import TopicId, matches

log = logging.getLogger("gossiprouter.stub")


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

class RouterStub:
    """A client of one or more gossiprouters: shared transport, reconnect, failover.

    Use as ``async with RouterStub([("127.0.0.1", 12001)]) as stub:``; entering
    starts connecting to every router in the background (TCP + HELLO; no
    group is joined yet) and returns at once.

    Args:
        routers: ``(host, port)`` tuples or ``"host:port"`` strings.
        mode: ``"relay"`` (TUNNEL-style: messages are routed through the
            routers) or ``"discovery"`` (TCPGOSSIP-style: CONNECT only to be
            listed, GET_MEMBERS to list; :meth:`Channel.send` raises ModeError).
        policy: which connected router carries each message: ``"random"`` or
            ``"round-robin"``; on a write error the next one is tried.
        connect_timeout: bound on TCP connect + HELLO/WELCOME, per attempt.
        request_timeout: how long to wait for the OK/ERROR of a request.
        send_timeout: how long send / connect / members / watch wait for a
            connected router before raising :class:`NotConnectedError`.
        reconnect_initial, reconnect_max: the backoff between connection
            attempts to one router: attempt *n* (from 0) waits a uniformly random
            time in ``[0, min(reconnect_max, reconnect_initial * 2**n)]`` (full
            jitter, so restarted routers are not stormed).
        reconnect_reset: a connection that stayed up this long resets *n* to 0;
            one that breaks sooner keeps growing the backoff (a router that
            accepts and drops at once is not hammered).
        heartbeat_interval: PING every connection this often (never less often
            than the router's ``heartbeat_ms``); 0 disables.
        heartbeat_timeout: a connection from which nothing was received for this
            long is dropped and reconnected (half-open detection); 0 disables.
            Must exceed ``heartbeat_interval``.
        receive_buffer: messages buffered per channel; when full the oldest is
            dropped and counted in :attr:`Channel.dropped`.
        event_buffer: events buffered per channel, per watch and per
            :meth:`state_changes` stream (oldest dropped when full).
        client_name, token: sent in HELLO. A router that refuses the token
            (ERROR ``unauthorized``) is retried with the usual backoff (its
            tokens file may be reloaded); sends meanwhile raise
            :class:`NotConnectedError` naming the refusal.
        ssl_context: connect with TLS using this context (see
            :func:`gossiprouter.client.tls.client_context`; give it a client
            certificate for mutual TLS). None: plain TCP.
        server_hostname: the name the router's certificate must be valid for
            (default: the host connected to).
        on_state: called (in the trio thread, must not block) with every
            :class:`StubEvent`.
    """

    def __init__(
        self,
        routers: Sequence[str | tuple[str, int]],
        *,
        mode: Mode = "relay",
        policy: Policy = "random",
        connect_timeout: float = 3.0,
        request_timeout: float = 5.0,
        send_timeout: float = 5.0,
        reconnect_initial: float = 0.5,
        reconnect_max: float = 30.0,
        reconnect_reset: float = 30.0,
        heartbeat_interval: float = 5.0,
        heartbeat_timeout: float = 15.0,
        receive_buffer: int = 1024,
        event_buffer: int = 256,
        client_name: str = CLIENT_NAME,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        on_state: Callable[[StubEvent], None] | None = None,
    ) -> None:
        if isinstance(routers, str):
            routers = [r.strip() for r in routers.split(",")]
        addrs = [parse_router(r) for r in routers]
        if not addrs:
            raise ValueError("at least one router is needed")
        if len(set(addrs)) != len(addrs):
            raise ValueError("a router is listed twice")
        if mode not in ("relay", "discovery"):
            raise ValueError(f"mode {mode!r}: expected 'relay' or 'discovery'")
        if policy not in ("random", "round-robin"):
            raise ValueError(f"policy {policy!r}: expected 'random' or 'round-robin'")
        for name, value in (("connect_timeout", connect_timeout),
                            ("request_timeout", request_timeout),
                            ("send_timeout", send_timeout),
                            ("reconnect_max", reconnect_max)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0")
        for name, value in (("reconnect_initial", reconnect_initial),
                            ("reconnect_reset", reconnect_reset),
                            ("heartbeat_interval", heartbeat_interval),
                            ("heartbeat_timeout", heartbeat_timeout)):
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0")
        if heartbeat_timeout and heartbeat_timeout <= heartbeat_interval:
            raise ValueError("heartbeat_timeout must be greater than heartbeat_interval")
        if heartbeat_timeout and not heartbeat_interval:
            # Without PINGs an idle but healthy connection would look dead.
            raise ValueError("heartbeat_timeout needs heartbeat_interval > 0")
        self.routers: tuple[RouterAddress, ...] = tuple(addrs)
        self.mode: Mode = mode
        self.policy: Policy = policy
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.send_timeout = send_timeout
        self.reconnect_initial = reconnect_initial
        self.reconnect_max = reconnect_max
        self.reconnect_reset = reconnect_reset
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_timeout = heartbeat_timeout
        self.receive_buffer = receive_buffer
        self.event_buffer = event_buffer
        self.client_name = client_name
        self.token = token
        self.ssl_context = ssl_context
        self.server_hostname = server_hostname
        self.on_state = on_state
        self.stats = StubStats()

        self._transports = [RouterSlot(a) for a in addrs]
        # The desired state, in creation order; each connection's registrar follows it.
        self._channels: dict[Key, Channel] = {}
        self._by_group: dict[str, list[Channel]] = {}
        self._watchers: dict[str, list[Watch]] = {}
        self._presence = Presence()  # join/leave of watched groups, merged over routers
        self._suspects = SuspectFilter(SUSPECT_DEDUPE_WINDOW)
        self._state_streams: list[EventStream[StubEvent]] = []
        self._req = itertools.count(1)
        self._nonce = itertools.count(1)
        self._seq = itertools.count(1)
        self._rr = itertools.count()
        self._changed = trio.Event()
        self._nursery_cm: Any = None
        self._nursery: trio.Nursery | None = None
        self._scope = trio.CancelScope()
        self._closed = False
        self._write_timeout = heartbeat_timeout if heartbeat_timeout > 0 else 30.0

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> RouterStub:
        if self._nursery is not None or self._closed:
            raise RuntimeError("a RouterStub can be entered once")
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()
        self._nursery.start_soon(self._supervise)
        return self

    async def _supervise(self) -> None:
        # The internal tasks live in their own cancel scope: closing the stub must not
        # cancel the application code running in the body of ``async with``.
        with self._scope:
            async with trio.open_nursery() as n:
                for t in self._transports:
                    n.start_soon(self._run_transport, t)

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        if et is None and not self._closed:
            try:
                await self._leave_all()
            except BaseException as e:
                self._stop()
                await self._exit_nursery(e)
                raise
        self._stop()
        await self._exit_nursery(ev)

    async def _exit_nursery(self, ev: BaseException | None) -> None:
        # The internal nursery would wrap the application's own exception (say a
        # ForbiddenError raised inside the ``async with``) in an ExceptionGroup;
        # hand it back unwrapped, as if there were no nursery.
        try:
            await self._nursery_cm.__aexit__(
                None if ev is None else type(ev), ev, None if ev is None else ev.__traceback__)
        except BaseExceptionGroup as eg:
            if ev is not None and len(eg.exceptions) == 1 and eg.exceptions[0] is ev:
                raise ev from ev.__cause__
            raise

    async def aclose(self) -> None:
        """Leave every group (DISCONNECT, bounded), close every connection, end all streams.
        Leaving the ``async with`` block does the same."""
        if self._closed:
            return
        await self._leave_all()
        self._stop()

    async def _leave_all(self) -> None:
        # A clean DISCONNECT lets the other members see ``leave`` instead of ``suspect``.
        for ch in list(self._channels.values()):
            self._remove_channel(ch)
        for ws in list(self._watchers.values()):
            for w in ws:
                w._close()
        self._watchers.clear()
        self._kick()
        with trio.move_on_after(min(self.request_timeout, 2.0)):
            while True:
                changed = self._changed
                busy = [lk for lk in self._links() if lk.held.registered or lk.held.leaving]
                if not busy:
                    break
                await changed.wait()

    def _stop(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._scope.cancel()
        for t in self._transports:
            if t.link is not None:
                t.link.kill("stub closed")
            self._emit(t, ConnectionState.CLOSED)
        for ch in list(self._channels.values()):
            self._remove_channel(ch)
        for ws in self._watchers.values():
            for w in ws:
                w._close()
        for s in self._state_streams:
            s._close()
        self._bump()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosedError("the RouterStub is closed")
        if self._nursery is None:
            raise RuntimeError("use the RouterStub in 'async with' first")

    # ------------------------------------------------------------------ observing

    def status(self) -> list[RouterStatus]:
        """One :class:`RouterStatus` per router, in the order given."""
        return [t.status() for t in self._transports]

    def state_changes(self) -> EventStream[StubEvent]:
        """A new stream of every :class:`StubEvent` from now on (bounded; oldest dropped)."""
        s: EventStream[StubEvent] = EventStream(self.event_buffer)
        if self._closed:
            s._close()
        else:
            self._state_streams.append(s)
        return s

    async def wait_connected(self, timeout: float | None = None, *, fail_fast: bool = False,
                             all_routers: bool = False) -> None:
        """Wait until a router (every router with ``all_routers``) is CONNECTED.

        Raises :class:`NotConnectedError` after ``timeout`` (default
        ``send_timeout``). With ``fail_fast`` (command-line tools) it does not
        wait for routers that have already failed an attempt: it raises as soon
        as every router has failed once and none is connected, and with
        ``all_routers`` it returns once every router is connected or has failed.
        """
        self._check_open()
        deadline = trio.current_time() + (self.send_timeout if timeout is None else timeout)
        while True:
            changed = self._changed
            up = [t for t in self._transports if t.state is ConnectionState.CONNECTED]
            if (all_routers and len(up) == len(self._transports)) or (not all_routers and up):
                return
            down = [t for t in self._transports if t not in up]
            if fail_fast and all(t.failures for t in down):
                if up:
                    return
                raise self._not_connected(None)
            if trio.current_time() >= deadline:
                raise self._not_connected(timeout if timeout is not None else self.send_timeout)
            with trio.move_on_at(deadline):
                await changed.wait()

    def _not_connected(self, waited: float | None) -> NotConnectedError:
        down = [t for t in self._transports if t.state is not ConnectionState.CONNECTED]
        why = [_peer_error(t.address, t.last_error or self._pending_error(t)) for t in down]
        if len(down) == 1:
            msg = why[0] if why[0].startswith("the peer at") else f"cannot reach router at {why[0]}"
        else:
            msg = "cannot reach any router (" + "; ".join(why) + ")"
        if waited is not None and not msg.startswith("the peer at"):
            msg = f"no router connection within {waited:g}s: {msg}"
        errors = [t.last_error for t in down if t.last_error]
        return NotConnectedError(msg, self.status(), errors[-1] if errors else None)

    def _pending_error(self, t: RouterSlot) -> str:
        """Why a router whose first attempt is still under way is not connected."""
        if t.hello_sent_at is None:
            return "not connected yet"
        waited = trio.current_time() - t.hello_sent_at
        return f"{FOREIGN} (got no reply to HELLO in {waited:.1f}s)"

    # ------------------------------------------------------------------ groups

    async def connect(
        self,
        group: str,
        addr: bytes,
        *,
        name: str | None = None,
        physical: Iterable[tuple[str, int] | str] = (),
        wait: bool = True,
    ) -> Channel:
        """Register ``addr`` in ``group`` on every router and return its :class:`Channel`.

        With ``wait`` (default) this returns once every connected router has
        answered and at least one accepted; a refusal raises the typed
        :class:`RouterError` (and the registration is withdrawn everywhere);
        with no router connected within ``send_timeout`` it raises
        :class:`NotConnectedError`. With ``wait=False`` it returns at once and
        the channel is registered whenever a router connects; refusals then
        arrive as ``refused`` events.
        """
        self._check_open()
        _check_group(group)
        a = _check_addr(addr)
        if name is not None and not isinstance(name, str):
            raise TypeError("name must be a string or None")
        key = (group, a)
        if key in self._channels:
            raise ValueError(f"this stub already has a channel for {a.hex()} in {group!r}")
        ch = Channel(self, group, a, name, _physical(physical), self.receive_buffer,
                     self.event_buffer)
        self._channels[key] = ch
        self._by_group.setdefault(group, []).append(ch)
        self._kick()
        if not wait:
            return ch
        ch._waiting = True
        deadline = trio.current_time() + self.send_timeout
        try:
            while True:
                changed = self._changed
                refusals = [r for r in ch._results.values() if r is not None]
                if refusals:
                    raise refusals[0]
                ok = [lk for lk, r in ch._results.items() if r is None and not lk.dead]
                ready = [lk for lk in self._links() if lk.ready]
                if ok and all(lk in ch._results for lk in ready):
                    return ch
                if trio.current_time() >= deadline:
                    if ok:
                        return ch
                    if ready:
                        raise RequestTimeoutError(
                            f"no answer to CONNECT {group!r} within {self.send_timeout:g}s")
                    raise self._not_connected(self.send_timeout)
                with trio.move_on_at(deadline):
                    await changed.wait()
        except BaseException:
            self._remove_channel(ch)
            self._kick()
            raise
        finally:
            ch._waiting = False
            ch._results.clear()

    async def _disconnect(self, ch: Channel) -> None:
        if ch._closed:
            await trio.lowlevel.checkpoint()
            return
        self._remove_channel(ch)
        self._kick()
        # Bounded wait for the DISCONNECTs: the member is gone locally either way.
        with trio.move_on_after(self.request_timeout):
            while True:
                changed = self._changed
                if not any(lk.held.registered.get(ch.key) is ch or ch in lk.held.leaving
                           for lk in self._links()):
                    return
                await changed.wait()

    def _remove_channel(self, ch: Channel) -> None:
        if self._channels.get(ch.key) is ch:
            del self._channels[ch.key]
        chans = self._by_group.get(ch.group)
        if chans is not None and ch in chans:
            chans.remove(ch)
            if not chans:
                del self._by_group[ch.group]
        ch._close()

    def channels(self) -> list[Channel]:
        """The open channels, in creation order."""
        return list(self._channels.values())

    async def members(self, group: str) -> list[Member]:
        """GET_MEMBERS on every connected router; the union, deduplicated by address.

        Works without joining the group (TCPGOSSIP-style discovery) and for
        the JGroups namespaces (``jgroups2:``/``jgroups5:``). Routers that fail
        are skipped as long as one answers.
        """
        self._check_open()
        _check_group(group)
        links = await self._wait_ready(trio.current_time() + self.send_timeout)
        answers: list[wire.Ok | StubError] = []

        async def ask(lk: Connection) -> None:
            answers.append(await self._request(lk, wire.GetMembers(next(self._req), group)))

        async with trio.open_nursery() as n:
            for lk in links:
                n.start_soon(ask, lk)
        return merge_members(answers)

    async def watch(self, group: str) -> Watch:
        """WATCH ``group`` on every router: a :class:`Watch` stream of ``join``/``leave``.

        The stub need not be a member. Channels of the group also receive the
        events while a Watch is open. WATCH is re-sent after every reconnect.
        """
        self._check_open()
        _check_group(group)
        w = Watch(self, group, self.event_buffer)
        self._watchers.setdefault(group, []).append(w)
        self._kick()
        deadline = trio.current_time() + self.send_timeout
        try:
            while True:
                changed = self._changed
                ready = [lk for lk in self._links() if lk.ready]
                if ready and all(group in lk.held.watch_acked for lk in ready):
                    return w
                if trio.current_time() >= deadline:
                    if any(group in lk.held.watch_acked for lk in ready):
                        return w
                    if ready:
                        raise RequestTimeoutError(
                            f"no answer to WATCH {group!r} within {self.send_timeout:g}s")
                    raise self._not_connected(self.send_timeout)
                with trio.move_on_at(deadline):
                    await changed.wait()
        except BaseException:
            self._unwatch(w)
            raise

    def _unwatch(self, w: Watch) -> None:
        w._close()
        ws = self._watchers.get(w.group)
        if ws is not None and w in ws:
            ws.remove(w)
            if not ws:
                del self._watchers[w.group]
                self._presence.forget_group(w.group)
                self._kick()

    # ------------------------------------------------------------------ sending

    def _links(self) -> list[Connection]:
        return [t.link for t in self._transports if t.link is not None and not t.link.dead]

    async def _wait_ready(self, deadline: float) -> list[Connection]:
        while True:
            changed = self._changed
            ready = [lk for lk in self._links() if lk.ready]
            if ready:
                return ready
            if trio.current_time() >= deadline:
                raise self._not_connected(self.send_timeout)
            with trio.move_on_at(deadline):
                await changed.wait()

    def _order(self, links: list[Connection]) -> list[Connection]:
        if len(links) < 2:
            return links
        if self.policy == "round-robin":
            i = next(self._rr) % len(links)
            return links[i:] + links[:i]
        links = links[:]
        random.shuffle(links)
        return links

    async def _send(self, ch: Channel, data: bytes) -> None:
        self._check_open()
        deadline = trio.current_time() + self.send_timeout
        last_error: str | None = None
        while True:
            changed = self._changed
            if ch._closed:
                raise ChannelClosedError(f"{ch!r} is closed")
            candidates = [lk for lk in self._links() if lk.ready and ch in lk.held.routable]
            for lk in self._order(candidates):
                if len(data) - 4 > lk.max_frame:
                    raise FrameTooLargeError(
                        f"message of {len(data) - 4} bytes exceeds the router's max_frame "
                        f"{lk.max_frame}")
                try:
                    await lk.write(data)
                    return
                except LinkDown as e:
                    # Fail over: try the next connected router at once.
                    last_error = f"{fmt_router(lk.router)}: {e}"
            if trio.current_time() >= deadline:
                err = self._not_connected(self.send_timeout)
                if last_error and err.last_error is None:
                    err.last_error = last_error
                raise err
            with trio.move_on_at(deadline):
                await changed.wait()

    # ------------------------------------------------------------------ internals: signals

    def _bump(self) -> None:
        """Wake everything waiting for a change of connection or registration state."""
        ev, self._changed = self._changed, trio.Event()
        ev.set()

    def _kick(self) -> None:
        """Ask every connection's registrar to compare itself with the desired state."""
        for lk in self._links():
            lk.kick.set()

    def _emit(self, t: RouterSlot, state: ConnectionState, error: str | None = None,
              delay: float | None = None) -> None:
        if self._closed and state is not ConnectionState.CLOSED:
            return  # a transport task still unwinding after close()
        t.state = state
        ev = StubEvent(t.address, state, t.attempts, error, delay)
        if self.on_state is not None:
            try:
                self.on_state(ev)
            except Exception:
                log.exception("on_state callback failed")
        for s in self._state_streams:
            s._put(ev)
        self._bump()

    # ------------------------------------------------------------------ internals: connections

    def _backoff(self, n: int) -> float:
        cap = min(self.reconnect_max, self.reconnect_initial * 2.0 ** min(n, 62))
        return random.uniform(0.0, cap)

    async def _run_transport(self, t: RouterSlot) -> None:
        n = 0  # consecutive failures, for the backoff
        while True:
            t.attempts += 1
            self._emit(t, ConnectionState.CONNECTING)
            try:
                link = await open_connection(
                    t, connect_timeout=self.connect_timeout, ssl_context=self.ssl_context,
                    server_hostname=self.server_hostname, client_name=self.client_name,
                    token=self.token, write_timeout=self._write_timeout)
            except (OSError, trio.TooSlowError, HandshakeError, trio.BrokenResourceError) as e:
                t.failures += 1
                t.last_error = describe_error(e) if not isinstance(e, HandshakeError) else str(e)
                log.debug("cannot connect to %s: %s", fmt_router(t.address), t.last_error)
            else:
                started = trio.current_time()
                await self._run_link(t, link)
                t.last_error = link.error
                if trio.current_time() - started >= self.reconnect_reset:
                    n = 0
            delay = self._backoff(n)
            n += 1
            self._emit(t, ConnectionState.RECONNECTING, t.last_error, delay)
            await trio.sleep(delay)

    async def _run_link(self, t: RouterSlot, link: Connection) -> None:
        t.link = link
        try:
            with link.scope:
                async with trio.open_nursery() as n:
                    n.start_soon(self._reader, link)
                    n.start_soon(self._heartbeat, link)
                    n.start_soon(self._registrar, link)
        finally:
            link.kill(link.error or "closed")
            t.link = None
            self._presence.forget_router(t.address)
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(link.stream)
            self._bump()

    async def _reader(self, link: Connection) -> None:
        dec = link.decoder
        stream = link.stream
        while True:
            while True:
                try:
                    f = dec.next_frame()
                    if f is not None:
                        # A frame the state table refuses now (a second WELCOME, a CONNECT)
                        # is a bad frame like an undecodable one: counted, logged, dropped.
                        link.proto.receive(type(f))
                except ProtocolError as e:
                    if e.code == "frame_too_large":
                        link.kill(f"router sent an unframed stream: {e}")
                        return
                    self.stats.bad_frames += 1
                    log.warning("dropping a bad frame from %s: %s", fmt_router(link.router), e)
                    continue
                if f is None:
                    break
                self._dispatch(link, f)
            try:
                data = await stream.receive_some(RECV_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
                link.kill(f"connection broken: {describe_error(e)}")
                return
            if not data:
                link.kill("router closed the connection")
                return
            link.last_recv = trio.current_time()
            dec.feed(data)

    async def _heartbeat(self, link: Connection) -> None:
        interval = self.heartbeat_interval
        if interval > 0 and link.router_heartbeat > 0:
            # Never ping less often than the router asks, or its idle timeout would close us.
            interval = min(interval, link.router_heartbeat)
        if interval > 0 and link.router_idle > 0:
            # Nor less than twice per idle timeout, whatever heartbeat_ms says.
            interval = min(interval, link.router_idle / 2)
        timeout = self.heartbeat_timeout
        next_ping = trio.current_time() + interval if interval > 0 else math.inf
        try:
            while True:
                link.wake = trio.Event()
                now = trio.current_time()
                if timeout > 0 and now - link.last_recv >= timeout:
                    link.kill(f"nothing received for {timeout:g}s (heartbeat timeout)")
                    return
                if link.pongs:
                    pongs, link.pongs = link.pongs, []
                    await link.write(b"".join(wire.encode(wire.Pong(x)) for x in pongs))
                if now >= next_ping:
                    await link.write(wire.encode(wire.Ping(next(self._nonce))))
                    next_ping = now + interval
                wake_at = min(next_ping, link.last_recv + timeout if timeout > 0 else math.inf)
                with trio.move_on_at(wake_at):
                    await link.wake.wait()
        except LinkDown:
            return

    async def _registrar(self, link: Connection) -> None:
        """Keep this connection's registrations equal to the stub's channels and watches.

        On a new connection the first pass re-sends CONNECT for every channel
        (creation order) and WATCH for every watched group; only when it is
        done does the connection become CONNECTED and carry ROUTE frames.
        """
        t = link.transport
        try:
            while True:
                link.kick = trio.Event()
                ops = self._plan(link)
                if ops:
                    await self._run_ops(link, ops)
                    self._bump()
                    continue
                if not link.ready:
                    link.ready = True
                    t.connections += 1
                    t.last_error = None
                    log.info("connected to %s (%s)", fmt_router(t.address), link.welcome.router_id)
                    self._emit(t, ConnectionState.CONNECTED)
                await link.kick.wait()
        except LinkDown:
            return

    def _plan(self, link: Connection) -> list[Op]:
        """The registrar's plan (:func:`registrar.plan`) for this connection, as frames
        (request ids in plan order) with what to do when each is written and answered."""
        ops: list[Op] = []
        for step in registrar.plan(link.held, self._channels, self._watchers.keys()):
            req = next(self._req)
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

    async def _subscribe(self, ch: Channel, pat: TopicId) -> None:
        if ch._closed:
            raise ChannelClosedError(f"{ch!r} is closed")
        if self.mode == "discovery":
            raise ModeError("topics need a relay-mode stub")
        ch._sub_errors.pop(pat, None)
        ch._patterns.add(pat)
        self._kick()
        deadline = trio.current_time() + self.send_timeout
        while True:
            changed = self._changed
            err = ch._sub_errors.pop(pat, None)
            if err is not None:
                # Withdrawn everywhere, like a refused CONNECT.
                self._kick()
                raise err
            ready = [lk for lk in self._links() if lk.ready and ch.key in lk.held.registered]
            acked = [lk for lk in ready if pat in lk.held.sub_acked.get(ch.key, ())]
            if ready and len(acked) == len(ready):
                return
            if trio.current_time() >= deadline:
                if acked:
                    return
                ch._patterns.discard(pat)
                self._kick()
                if ready:
                    raise RequestTimeoutError(
                        f"no answer to SUBSCRIBE within {self.send_timeout:g}s")
                raise self._not_connected(self.send_timeout)
            with trio.move_on_at(deadline):
                await changed.wait()

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
                                     next(self._seq)))

    def _watch_result(self, link: Connection, group: str, r: wire.Ok | StubError) -> None:
        if isinstance(r, wire.Ok) and group in link.held.watching:
            link.held.watch_acked.add(group)

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
            with trio.move_on_after(self.request_timeout):
                for _, p in pendings:
                    await p.event.wait()
        finally:
            for op in ops:
                link.pending.pop(op.frame.req, None)
        for op, p in pendings:
            op.on_result(p.result if p.result is not None else RequestTimeoutError(
                f"no answer from {fmt_router(link.router)} within {self.request_timeout:g}s"))

    async def _request(self, link: Connection, frame: wire.GetMembers) -> wire.Ok | StubError:
        p = PendingRequest()
        link.pending[frame.req] = p
        try:
            try:
                await link.write(wire.encode(frame))
            except LinkDown as e:
                return ConnectionLostError(f"connection to {fmt_router(link.router)} lost: {e}")
            with trio.move_on_after(self.request_timeout):
                await p.event.wait()
        finally:
            link.pending.pop(frame.req, None)
        if p.result is None:
            return RequestTimeoutError(
                f"no answer from {fmt_router(link.router)} within {self.request_timeout:g}s")
        return p.result

    # ------------------------------------------------------------------ internals: receiving

    def _dispatch(self, link: Connection, f: wire.Frame) -> None:
        """Hand one received frame on. Never waits: the reader serves every channel."""
        match f:
            case wire.Route(group, dest, sender, payload):
                msg = Message(group, sender, dest, payload, next(self._seq))
                if dest is None:
                    # One copy per connection: every local channel of the group but the sender.
                    delivered = False
                    for ch in self._by_group.get(group, ()):
                        if ch.addr != sender:
                            ch._put_message(msg)
                            delivered = True
                    if not delivered:
                        self.stats.undeliverable += 1
                else:
                    target = self._channels.get((group, dest))
                    if target is None:
                        self.stats.undeliverable += 1
                    else:
                        target._put_message(msg)
            case wire.Publish(group, sender, provider, broadcast, partition, flags, payload):
                if flags & wire.PUB_GLOBAL and not self._global_source(link):
                    self.stats.federated_duplicates += 1
                    return
                tid = (provider, broadcast, partition)
                echo = bool(flags & wire.PUB_ECHO)
                pub = Publication(group, sender, None, payload, next(self._seq), tid,
                                  "global" if flags & wire.PUB_GLOBAL else "local")
                # One copy per connection: every local channel whose patterns match.
                got = False
                for ch in self._by_group.get(group, ()):
                    if (ch.addr != sender or echo) and any(matches(p, tid)
                                                           for p in ch._patterns):
                        ch._put_message(pub)
                        got = True
                if not got:
                    self.stats.undeliverable += 1
            case wire.Ok(req):
                p = link.pending.get(req)
                if p is not None:
                    p.ok(f)
            case wire.Error(req, code, message):
                p = None if req is None else link.pending.get(req)
                if p is not None:
                    p.set(router_error(code, message, link.router))
                elif code in CLOSING_CODES:
                    # The router closes the connection next; remember why.
                    link.farewell = f"router closed the connection: {code}: {message}"
                else:
                    counts = self.stats.async_errors
                    counts[code] = counts.get(code, 0) + 1
                    log.warning("router %s: %s: %s", fmt_router(link.router), code, message)
            case wire.Ping(nonce):
                link.pongs.append(nonce)
                link.wake.set()
            case wire.Pong():
                pass  # last_recv is already updated: every frame counts as life
            case wire.Event():
                self._on_event(link, f)
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
        for t in self._transports:
            lk = t.link
            if lk is not None and lk.ready and not lk.dead \
                    and lk.welcome.settings.get("federation") == fed:
                return lk is link
        return True

    def _on_event(self, link: Connection, f: wire.Event) -> None:
        member = Member(f.addr, f.name, f.physical)
        router = link.router
        if f.kind == "suspect":
            if not self._suspects.first(f.group, f.addr, trio.current_time()):
                self.stats.events_merged += 1
                return
            ev = GroupEvent(f.group, "suspect", member, router, seq=next(self._seq))
            for ch in self._by_group.get(f.group, ()):
                if ch.addr != f.addr:
                    ch._put_event(ev)
            return
        # join / leave go to watchers only; merge them over the routers.
        if f.group not in self._watchers:
            return
        news = (self._presence.join if f.kind == "join" else self._presence.leave)(
            f.group, f.addr, router)
        if not news:
            self.stats.events_merged += 1
            return
        ev = GroupEvent(f.group, f.kind, member, router, seq=next(self._seq))
        for w in self._watchers.get(f.group, ()):
            w._put(ev)
        for ch in self._by_group.get(f.group, ()):
            if ch.addr != f.addr:
                ch._put_event(ev)

