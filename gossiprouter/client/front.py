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

This module ties the pieces together: the options, the life cycle, and the calls the
application makes, which change the desired state (:class:`~gossiprouter.client.local.Local`)
and wait for the connections (:class:`~gossiprouter.client.link.Links`) to follow it.

Errors (the policy; tests/test_client_lifecycle.py checks the last three points, the
reconnect and failover tests in tests/test_stub*.py the first):

* **A connection to a router fails** (refused, reset, TLS or handshake refused, a write
  blocked, heartbeat silence): never raised by the stub's tasks. That connection closes,
  its state goes RECONNECTING (a :class:`StubEvent` with the reason) and it is retried with
  backoff, for ever. A call that needs a connected router waits up to ``send_timeout`` for
  one and then raises :class:`NotConnectedError` naming every router and why it is down; a
  send fails over to another connected router; a request in flight on the lost connection
  fails with :class:`ConnectionLostError` (``members()`` skips it while another router
  answers). A router's ERROR answer raises the typed :class:`RouterError` in the call that
  made the request.
* **A task of the stub raises** anything else (a bug): the stub closes at once (every
  connection, channel and stream ends; later calls raise :class:`ChannelClosedError`
  naming the failure) and the caller gets one :class:`StubTaskError` whose ``__cause__`` is
  the ExceptionGroup the tasks raised: from ``run()`` (and so from ``nursery.start``), or,
  in ``async with``, at the end of the block, which is cancelled.
* **An exception leaves the ``async with`` block** (the application's own, a
  ``ForbiddenError`` say): the stub closes without DISCONNECT and the exception propagates
  unchanged, never wrapped in an ExceptionGroup: it is the caller's own, not concurrent
  with anything, so it is kept out of the stub's nursery. Leaving the block normally leaves
  every group first (DISCONNECT, bounded by ``request_timeout``, 2 s at most).
* **The caller is cancelled** (the task running ``run()`` or the ``async with`` block, or
  its nursery or task group; ``task.cancel()`` or ``asyncio.timeout`` on asyncio): the
  connections close at once (no DISCONNECT: the routers report the members as
  ``suspect``), every stream ends, and the cancellation propagates as the loop's always
  does (``trio.Cancelled``, ``asyncio.CancelledError`` / ``TimeoutError``). Cancelling one
  call (``send``, ``connect``, ``members``, ...) cancels that call only: a ``connect``
  withdraws its registration; a write already started completes (shielded, bounded by the
  write timeout), so no frame is ever cut in half.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from types import TracebackType
from typing import Any, Protocol, TypeVar

import anyio
from anyio.lowlevel import checkpoint

from gossiprouter.client.channel import Carrier, Channel
from gossiprouter.client.connection import Connection, RouterSlot, not_connected
from gossiprouter.client.errors import (
    ChannelClosedError,
    FrameTooLargeError,
    LinkDown,
    ModeError,
    NotConnectedError,
    RequestTimeoutError,
    StubError,
    StubTaskError,
)
from gossiprouter.client.link import Links, log
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
from gossiprouter.client.status import ConnectionState, RouterAddress, RouterStatus, StubEvent
from gossiprouter.client.streams import EventStream, Watch
from gossiprouter.core.topics import TopicId
from gossiprouter.protocol import native as wire

T = TypeVar("T")
V = TypeVar("V", contravariant=True)


class TaskStatus(Protocol[V]):
    """What ``run`` is started with: trio's ``TaskStatus`` (``nursery.start``) or AnyIO's
    (``task_group.start``); both are one of these for the type checker."""

    def started(self, value: V) -> None: ...


def _nothing() -> None:
    pass


class RouterStub:
    """A client of one or more gossiprouters: shared transport, reconnect, failover.

    Run it in one of three ways (the module docstring gives the error policy):

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
                      heartbeat_timeout=heartbeat_timeout)
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

        self._slots = [RouterSlot(a) for a in addrs]
        self._local = Local()
        self.stats = self._local.stats
        self._links = Links(self, self._slots, self._local, self._emit)
        self._state_streams: list[EventStream[StubEvent]] = []
        # The stub's tasks: closing cancels them, not the caller. Made when the stub runs
        # (AnyIO makes a scope for the loop that runs it).
        self._scope: anyio.CancelScope | None = None
        self._started = False
        self._closed = False
        self._failure: BaseExceptionGroup[Exception] | None = None  # what a task of ours raised
        self._context: AbstractAsyncContextManager[RouterStub] | None = None

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: TaskStatus[RouterStub] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Run the stub until :meth:`aclose` or cancellation: ``stub = await
        nursery.start(RouterStub(routers).run)`` (trio) or ``await
        task_group.start(RouterStub(routers).run)`` (AnyIO) returns once a router is
        connected.

        Before that, raises :class:`NotConnectedError` if no router is connected within
        ``send_timeout`` (the stub is then closed). Raises :class:`StubTaskError` if a task of
        the stub fails. Cancelling it closes every connection at once.
        """
        self._begin()
        error = await self._serve(wait_connected=True, on_failure=_nothing,
                                  task_status=task_status)
        if error is not None:
            raise error  # raised before started(): it never was in a nursery
        self._raise_failure()

    def _begin(self) -> None:
        if self._started or self._closed:
            raise RuntimeError("a RouterStub can be run (or entered) once")
        self._started = True

    async def _serve(self, *, wait_connected: bool, on_failure: Callable[[], None],
                     task_status: TaskStatus[RouterStub]) -> NotConnectedError | None:
        """Keep every router connected until the stub closes; return why it never started
        (no router connected in time) if ``wait_connected``. A failing task is recorded in
        ``_failure`` (and ``on_failure`` called), not raised: the caller raises it, outside
        any nursery, as one StubTaskError."""
        not_started: NotConnectedError | None = None
        try:
            # The stub's tasks live in their own cancel scope: closing the stub must not
            # cancel the application code running in the body of ``async with``.
            self._scope = anyio.CancelScope()
            if self._closed:
                self._scope.cancel()
            with self._scope:
                async with anyio.create_task_group() as tasks:
                    for t in self._slots:
                        tasks.start_soon(self._links.keep_connected, t)
                    if wait_connected:
                        try:
                            await self.wait_connected()
                        except NotConnectedError as e:
                            not_started = e
                            self._stop()  # ends the tasks (the scope swallows its cancel)
                    if not_started is None:
                        task_status.started(self)
        except* Exception as failure:
            # Network failures never get here (each connection handles its own): a bug.
            self._failure = failure
            log.error("a task of the RouterStub failed; the stub is closed",
                      exc_info=failure)
            on_failure()
        finally:
            self._stop()
        return not_started

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise StubTaskError(f"a task of the RouterStub failed: {self._failure!r}") \
                from self._failure

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[RouterStub]:
        """The ``async with`` form: the stub's tasks in a task group around the caller's
        block."""
        self._begin()
        block_error: BaseException | None = None
        async with anyio.create_task_group() as group:
            # A failing task cancels the block; StubTaskError is raised below, after it.
            await group.start(partial(self._serve, wait_connected=False,
                                      on_failure=group.cancel_scope.cancel))
            try:
                yield self
            except anyio.get_cancelled_exc_class():
                raise  # belongs to a cancel scope, which knows to catch it in a group
            except BaseException as e:
                # The caller's own exception is not concurrent with anything: keep it out
                # of the nursery (which would wrap it) and raise it as it came, below.
                block_error = e
            else:
                if not self._closed:
                    await self._leave_all()
            finally:
                self._stop()
        if block_error is not None:
            raise block_error
        self._raise_failure()

    async def __aenter__(self) -> RouterStub:
        self._context = self._running()
        return await self._context.__aenter__()

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        # A thin wrapper: the caller's exception goes to the context manager as it came.
        assert self._context is not None
        return await self._context.__aexit__(et, ev, tb)

    async def aclose(self) -> None:
        """Leave every group (DISCONNECT, bounded), close every connection, end all streams.
        Leaving the ``async with`` block does the same; ``run()`` returns."""
        if self._closed:
            return
        await self._leave_all()
        self._stop()

    async def _leave_all(self) -> None:
        # A clean DISCONNECT lets the other members see ``leave`` instead of ``suspect``.
        self._local.close_all()
        self._wake_registrars()
        await self._until(anyio.current_time() + min(self.request_timeout, 2.0), lambda: not any(
            lk.held.registered or lk.held.leaving for lk in self._links.live()))

    def _stop(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._scope is not None:
            self._scope.cancel()
        for t in self._slots:
            if t.link is not None:
                t.link.kill("stub closed")
            self._emit(t, ConnectionState.CLOSED)
        self._local.close_all()
        for s in self._state_streams:
            s._close()
        self._links.notify_changed()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._failure is not None:
            raise ChannelClosedError(f"the RouterStub is closed: a task failed: "
                                     f"{self._failure!r}")
        if self._closed:
            raise ChannelClosedError("the RouterStub is closed")
        if not self._started:
            raise RuntimeError("run the RouterStub first: 'async with', open_router_stub() "
                               "or nursery.start(stub.run)")

    async def _until(self, deadline: float, done: Callable[[], T]) -> T | None:
        """Call ``done()`` at every change of connection or registration state until it
        gives a true value (returned) or ``deadline`` passes (None). ``done`` may raise."""
        while True:
            changed = self._links.changed
            result = done()
            if result:
                return result
            if anyio.current_time() >= deadline:
                return None
            with anyio.CancelScope(deadline=deadline):
                await changed.wait()

    def _not_connected(self, waited: float | None) -> NotConnectedError:
        return not_connected(self._slots, waited)

    # ------------------------------------------------------------------ observing

    def status(self) -> list[RouterStatus]:
        """One :class:`RouterStatus` per router, in the order given."""
        return [t.status() for t in self._slots]

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
        waited = self.send_timeout if timeout is None else timeout

        def connected() -> bool:
            up = [t for t in self._slots if t.state is ConnectionState.CONNECTED]
            if len(up) == len(self._slots) or (up and not all_routers):
                return True
            if fail_fast and all(t.failures for t in self._slots if t not in up):
                if up:
                    return True
                raise self._not_connected(None)
            return False  # wait for the next change

        if not await self._until(anyio.current_time() + waited, connected):
            raise self._not_connected(waited)

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

    # ------------------------------------------------------------------ signals

    def _wake_registrars(self) -> None:
        """The desired state changed: every connection's registrar compares itself with it."""
        self._links.wake_registrars()

    def _emit(self, t: RouterSlot, state: ConnectionState, error: str | None = None,
              delay: float | None = None) -> None:
        if self._closed and state is not ConnectionState.CLOSED:
            return  # a connection task still unwinding after close()
        t.state = state
        ev = StubEvent(t.address, state, t.attempts, error, delay)
        if self.on_state is not None:
            try:
                self.on_state(ev)
            except Exception:
                log.exception("on_state callback failed")
        for s in self._state_streams:
            s._put(ev)
        self._links.notify_changed()


@asynccontextmanager
async def open_router_stub(routers: Sequence[str | tuple[str, int]],
                           **options: Any) -> AsyncIterator[RouterStub]:
    """``async with open_router_stub(routers, **options) as stub:``: a :class:`RouterStub`
    (same arguments) running in a task group for the length of the block; what ``async with
    RouterStub(...)`` does. Returns at once, connecting in the background."""
    async with RouterStub(routers, **options)._running() as stub:
        yield stub
