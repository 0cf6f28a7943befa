"""The stub's life cycle: how a :class:`~gossiprouter.client.front.RouterStub` runs, reports
the state of its routers' connections, and stops; and what happens when something fails.

:class:`StubLifecycle` is RouterStub's base: the ways to run a stub (``async with``, which
``open_router_stub`` uses, and ``nursery.start`` / ``task_group.start(stub.run)``), closing
it, the state of each router's connection (:meth:`~StubLifecycle.status`,
:meth:`~StubLifecycle.state_changes`, :meth:`~StubLifecycle.wait_connected`) and the wait
for a change of that state that every call of the application shares. RouterStub adds the
options and those calls (:mod:`gossiprouter.client.front`).

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

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from types import TracebackType
from typing import Protocol, Self, TypeVar

import anyio

from gossiprouter.client.connection import RouterSlot, not_connected
from gossiprouter.client.errors import ChannelClosedError, NotConnectedError, StubTaskError
from gossiprouter.client.link import Links, log
from gossiprouter.client.local import Local
from gossiprouter.client.status import ConnectionState, RouterStatus, StubEvent
from gossiprouter.client.streams import EventStream

T = TypeVar("T")
V = TypeVar("V", contravariant=True)


class TaskStatus(Protocol[V]):
    """What ``run`` is started with: trio's ``TaskStatus`` (``nursery.start``) or AnyIO's
    (``task_group.start``); both are one of these for the type checker."""

    def started(self, value: V) -> None: ...


def _nothing() -> None:
    pass


class StubLifecycle:
    """Running, observing and closing a stub: the base of :class:`RouterStub`, which sets the
    attributes below in its ``__init__`` (the options read here, the routers' slots, the
    stub's own side and its connections) before it calls this ``__init__``."""

    request_timeout: float
    send_timeout: float
    event_buffer: int
    on_state: Callable[[StubEvent], None] | None
    _slots: list[RouterSlot]
    _local: Local
    _links: Links

    def __init__(self) -> None:
        self._state_streams: list[EventStream[StubEvent]] = []
        # The stub's tasks: closing cancels them, not the caller. Made when the stub runs
        # (AnyIO makes a scope for the loop that runs it).
        self._scope: anyio.CancelScope | None = None
        self._started = False
        self._closed = False
        self._failure: BaseExceptionGroup[Exception] | None = None  # what a task of ours raised
        self._context: AbstractAsyncContextManager[Self] | None = None

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: TaskStatus[Self] = anyio.TASK_STATUS_IGNORED
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
                     task_status: TaskStatus[Self]) -> NotConnectedError | None:
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
    async def _running(self) -> AsyncIterator[Self]:
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

    async def __aenter__(self) -> Self:
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
