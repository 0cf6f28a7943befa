"""RouterStub: the client library applications use to talk to gossiprouters, on asyncio or
trio (one implementation, on AnyIO: it runs on whichever loop calls it).

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

This module ties the pieces together: the options, and the calls the application makes,
which change the desired state (:class:`~gossiprouter.client.local.Local`) and wait for the
connections (:class:`~gossiprouter.client.link.Links`) to follow it. The life cycle (running,
closing, the routers' connection states) and its error policy are RouterStub's base,
:class:`~gossiprouter.client.lifecycle.StubLifecycle`.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
from anyio.lowlevel import checkpoint

from gossiprouter.client.channel import Carrier, Channel
from gossiprouter.client.connection import Connection, RouterSlot
from gossiprouter.client.errors import (
    ChannelClosedError,
    FrameTooLargeError,
    LinkDown,
    ModeError,
    RequestTimeoutError,
    StubError,
)
from gossiprouter.client.lifecycle import StubLifecycle
from gossiprouter.client.link import Links
from gossiprouter.client.local import Local
from gossiprouter.client.merge import merge_members
from gossiprouter.client.model import (
    CLIENT_NAME,
    Member,
    Mode,
    Policy,
    _check_addr,
    _check_group,
    _physical,
    check_options,
    fmt_router,
    parse_routers,
)
from gossiprouter.client.status import RouterAddress, StubEvent
from gossiprouter.client.streams import Watch
from gossiprouter.core.topics import TopicId
from gossiprouter.protocol import native as wire


class RouterStub(StubLifecycle):
    """A client of one or more gossiprouters: shared transport, reconnect, failover.

    Run it in one of three ways (:mod:`~gossiprouter.client.lifecycle` gives the error policy):

    * ``async with RouterStub(routers) as stub:`` or ``async with open_router_stub(routers)
      as stub:`` starts connecting to every router in the background (TCP + HELLO; no group
      is joined yet) and returns at once; leaving the block leaves every group and closes;
    * ``stub = await nursery.start(RouterStub(routers).run)`` (trio) or ``stub = await
      task_group.start(RouterStub(routers).run)`` (an AnyIO task group, on asyncio or trio)
      runs it in the caller's nursery and returns once a router is connected;
      :meth:`aclose` (or cancelling) ends it.

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
            Must exceed ``heartbeat_interval``. Only whole frames count: a router
            that sends a frame byte by byte and never ends it is dropped too.
        max_frame: the largest frame this client takes or sends (default 8 MiB): a
            router that announces more is capped at it (one WARNING), and a frame
            past it ends the connection, so a router cannot make the client buffer
            more than this for one frame.
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
        on_state: called (in the event loop's thread, must not block) with every
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
        max_frame: int = wire.DEFAULT_MAX_FRAME,
        receive_buffer: int = 1024,
        event_buffer: int = 256,
        client_name: str = CLIENT_NAME,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        on_state: Callable[[StubEvent], None] | None = None,
    ) -> None:
        addrs = parse_routers(routers)
        check_options(mode=mode, policy=policy, connect_timeout=connect_timeout,
                      request_timeout=request_timeout, send_timeout=send_timeout,
                      reconnect_initial=reconnect_initial, reconnect_max=reconnect_max,
                      reconnect_reset=reconnect_reset, heartbeat_interval=heartbeat_interval,
                      heartbeat_timeout=heartbeat_timeout, max_frame=max_frame)
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
        self.max_frame = max_frame
        self.receive_buffer = receive_buffer
        self.event_buffer = event_buffer
        self.client_name = client_name
        self.token = token
        self.ssl_context = ssl_context
        self.server_hostname = server_hostname
        self.on_state = on_state

        self._slots = [RouterSlot(a) for a in addrs]
        self._local = Local()
        self.stats = self._local.stats
        self._links = Links(self, self._slots, self._local, self._emit)
        super().__init__()  # the life cycle's own state

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
        ch = Channel(self, group, a, name, _physical(physical), self.receive_buffer,
                     self.event_buffer)
        self._local.add_channel(ch)
        self._wake_registrars()
        if not wait:
            return ch
        ch._waiting = True

        def accepted() -> list[Carrier]:
            refusals = [r for r in ch._results.values() if r is not None]
            if refusals:
                raise refusals[0]
            ok = [lk for lk, r in ch._results.items() if r is None and not lk.dead]
            return ok if ok and all(lk in ch._results for lk in self._links.ready()) else []

        try:
            if await self._until(anyio.current_time() + self.send_timeout, accepted) is None \
                    and not any(r is None and not lk.dead for lk, r in ch._results.items()):
                raise self._timeout("CONNECT", group)
            return ch
        except BaseException:
            self._local.remove_channel(ch)
            self._wake_registrars()
            raise
        finally:
            ch._waiting = False
            ch._results.clear()

    def _timeout(self, request: str, group: str) -> StubError:
        """No answer in ``send_timeout``: from a connected router, or no router connected."""
        if self._links.ready():
            return RequestTimeoutError(
                f"no answer to {request} {group!r} within {self.send_timeout:g}s")
        return self._not_connected(self.send_timeout)

    async def _disconnect(self, ch: Channel) -> None:
        if ch._closed:
            await checkpoint()
            return
        self._local.remove_channel(ch)
        self._wake_registrars()
        # Bounded wait for the DISCONNECTs: the member is gone locally either way.
        await self._until(anyio.current_time() + self.request_timeout, lambda: not any(
            lk.held.registered.get(ch.key) is ch or ch in lk.held.leaving
            for lk in self._links.live()))

    def channels(self) -> list[Channel]:
        """The open channels, in creation order."""
        return list(self._local.channels.values())

    async def members(self, group: str) -> list[Member]:
        """GET_MEMBERS on every connected router; the union, deduplicated by address.

        Works without joining the group (TCPGOSSIP-style discovery) and for
        the JGroups namespaces (``jgroups2:``/``jgroups5:``). Routers that fail
        are skipped as long as one answers.
        """
        self._check_open()
        _check_group(group)
        links = await self._until(anyio.current_time() + self.send_timeout, self._links.ready)
        if not links:
            raise self._not_connected(self.send_timeout)
        answers: list[wire.Ok | StubError] = []

        async def ask(lk: Connection) -> None:
            answers.append(await self._links.request(
                lk, wire.GetMembers(self._links.next_req(), group)))

        async with anyio.create_task_group() as asking:
            for lk in links:
                asking.start_soon(ask, lk)
        return merge_members(answers)

    async def watch(self, group: str) -> Watch:
        """WATCH ``group`` on every router: a :class:`Watch` stream of ``join``/``leave``.

        The stub need not be a member. Channels of the group also receive the
        events while a Watch is open. WATCH is re-sent after every reconnect.
        """
        self._check_open()
        _check_group(group)
        w = Watch(self, group, self.event_buffer)
        self._local.add_watch(w)
        self._wake_registrars()
        def acked() -> bool:
            ready = self._links.ready()
            return bool(ready) and all(group in lk.held.watch_acked for lk in ready)

        try:
            if await self._until(anyio.current_time() + self.send_timeout, acked) is None \
                    and not any(group in lk.held.watch_acked for lk in self._links.ready()):
                raise self._timeout("WATCH", group)
            return w
        except BaseException:
            self._unwatch(w)
            raise

    def _unwatch(self, w: Watch) -> None:
        if self._local.remove_watch(w):
            self._wake_registrars()

    async def _subscribe(self, ch: Channel, pat: TopicId) -> None:
        if ch._closed:
            raise ChannelClosedError(f"{ch!r} is closed")
        if self.mode == "discovery":
            raise ModeError("topics need a relay-mode stub")
        ch._sub_errors.pop(pat, None)
        ch._patterns.add(pat)
        self._wake_registrars()

        def answered() -> bool:
            err = ch._sub_errors.pop(pat, None)
            if err is not None:
                # Withdrawn everywhere, like a refused CONNECT.
                self._wake_registrars()
                raise err
            ready = self._links.registered(ch)
            return bool(ready) and all(pat in lk.held.sub_acked.get(ch.key, ()) for lk in ready)

        if await self._until(anyio.current_time() + self.send_timeout, answered) is None \
                and not any(pat in lk.held.sub_acked.get(ch.key, ()) for lk in
                            self._links.registered(ch)):
            ch._patterns.discard(pat)
            self._wake_registrars()
            if self._links.registered(ch):
                raise RequestTimeoutError(f"no answer to SUBSCRIBE within {self.send_timeout:g}s")
            raise self._not_connected(self.send_timeout)

    # ------------------------------------------------------------------ sending

    async def _send(self, ch: Channel, data: bytes) -> None:
        self._check_open()
        deadline: float | None = None  # read the clock only when the send has to wait
        last_error: str | None = None
        while True:
            changed = self._links.changed
            if ch._closed:
                raise ChannelClosedError(f"{ch!r} is closed")
            for lk in self._links.carriers(ch, self.policy):
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
            now = anyio.current_time()
            if deadline is None:
                deadline = now + self.send_timeout
            elif now >= deadline:
                err = self._not_connected(self.send_timeout)
                if last_error and err.last_error is None:
                    err.last_error = last_error
                raise err
            with anyio.CancelScope(deadline=deadline):
                await changed.wait()

@asynccontextmanager
async def open_router_stub(routers: Sequence[str | tuple[str, int]],
                           **options: Any) -> AsyncIterator[RouterStub]:
    """``async with open_router_stub(routers, **options) as stub:``: a :class:`RouterStub`
    (same arguments) running in a task group for the length of the block; what ``async with
    RouterStub(...)`` does. Returns at once, connecting in the background."""
    async with RouterStub(routers, **options)._running() as stub:
        yield stub
