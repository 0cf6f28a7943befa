"""What the stub tests share, on either loop: the router on a thread, AnyIO helpers.

The stub runs on asyncio and on trio (issue 23), so its tests run on both: a module marks
itself ``pytestmark = pytest.mark.anyio`` and imports :func:`anyio_backend` (trio and
asyncio; tests/conftest.py takes such tests away from pytest-trio's trio mode). The router
stays on trio: :class:`RouterThread` runs it in a trio loop of its own on a thread, so the
test's loop, whichever it is, only runs the stub, and the router can be stopped and started
again on the same port under it.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import anyio
import outcome
import pytest
import trio

from gossiprouter import ConnectionState, RouterStub
from gossiprouter.client.local import Local
from gossiprouter.core.config import Config
from gossiprouter.ops.runtime import Operations
from gossiprouter.protocol import native as wire
from gossiprouter.server.listener import Server
from gossiprouter.stub import Channel, EventStream, WouldBlock
from tests.nclient import NativeClient
from tests.procs import free_port as free_port  # for the stub tests, with this kit

R = TypeVar("R")

FAST: dict[str, Any] = {
    "reconnect_initial": 0.05,
    "reconnect_max": 0.3,
    "heartbeat_interval": 0.5,
    "heartbeat_timeout": 2.0,
    "send_timeout": 3.0,
    "request_timeout": 3.0,
    "connect_timeout": 2.0,
}

BACKENDS = [pytest.param("trio", id="trio"), pytest.param("asyncio", id="asyncio")]


@pytest.fixture(params=BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """The loops every stub test runs on (AnyIO's pytest plugin reads this fixture)."""
    return request.param


class TrioThread:
    """A trio loop of its own on a thread, running one task (a router, a fake router) that
    any test loop can talk to over 127.0.0.1."""

    def __init__(self) -> None:
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self, fn: Callable[..., Awaitable[Any]]) -> Any:
        """``await nursery.start(fn)`` in the new loop; returns what ``fn`` started with."""
        assert self._thread is None, "already running"
        ready = threading.Event()
        started: list[Any] = []
        self._error = None

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            with trio.CancelScope() as scope:
                self._scope = scope
                async with trio.open_nursery() as n:
                    started.append(await n.start(fn))
                    ready.set()

        def run() -> None:
            try:
                trio.run(main)
            except BaseException as e:
                self._error = e
            finally:
                ready.set()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        if not ready.wait(10) or self._error is not None or not started:
            raise RuntimeError(f"the task did not start: {self._error!r}")
        return started[0]

    def call(self, fn: Callable[[], R]) -> R:
        """``fn()`` run in the loop's thread. Blocks the caller for that short time
        (trio.from_thread refuses to be called from a trio task: the test's may be one)."""
        assert self._token is not None
        done = threading.Event()
        box: list[outcome.Outcome[R]] = []

        def job() -> None:
            box.append(outcome.capture(fn))
            done.set()

        self._token.run_sync_soon(job)
        if not done.wait(10):
            raise TimeoutError("the loop's thread did not run the call")
        return box[0].unwrap()

    def stop(self, cancel: bool = True) -> None:
        """Cancel the task (or, with ``cancel`` False, wait for it to end) and the loop."""
        if self._thread is None:
            return
        if cancel:
            scope = self._scope
            assert scope is not None
            self.call(scope.cancel)
        self._thread.join(10)
        assert not self._thread.is_alive(), "the loop's thread did not end"
        self._thread = self._scope = self._token = None


class RouterThread:
    """A router (server + ops hooks) in a :class:`TrioThread`, on 127.0.0.1.

    :meth:`start` / :meth:`stop` block for the little time a start or stop takes (call them
    from sync fixtures, or with ``await anyio.to_thread.run_sync``: :meth:`astart`,
    :meth:`astop`); :meth:`call` runs a function in the router's thread (read its table
    there, not from the test's thread)."""

    def __init__(self, port: int = 0, **config: Any) -> None:
        self.port = port
        self.config = config
        self.server: Server | None = None
        self._loop = TrioThread()

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def start(self) -> RouterThread:
        cfg = Config(host="127.0.0.1", port=self.port, **self.config)
        server = Server(cfg, hooks=Operations(cfg))
        self.port = self._loop.start(server.serve)[1]
        self.server = server
        return self

    def stop(self, graceful: bool = False) -> None:
        """Cancel the router (connections cut), or with ``graceful`` shut it down: clients
        get ERROR shutting_down, then the connections close."""
        if not self._loop.running:
            return
        server = self.server
        assert server is not None
        if graceful:
            self.call(server.shutdown)
        self._loop.stop(cancel=not graceful)
        self.server = None

    async def astart(self) -> RouterThread:
        return await anyio.to_thread.run_sync(self.start)

    async def astop(self, graceful: bool = False) -> None:
        await anyio.to_thread.run_sync(lambda: self.stop(graceful))

    def call(self, fn: Callable[[], R]) -> R:
        return self._loop.call(fn)

    @property
    def hub(self) -> Any:
        assert self.server is not None
        return self.server.hub

    def members(self, group: str) -> set[bytes]:
        return self.call(lambda: {e.addr for e in self.hub.table.members(group)})

    def member_list(self, group: str) -> list[bytes]:
        return self.call(lambda: [e.addr for e in self.hub.table.members(group)])

    def routed(self) -> int:
        """Frames routed so far (the compiled fast path's counted too)."""
        def read() -> int:
            self.hub.sync()
            n: int = self.hub.counters.routed
            return n
        return self.call(read)

    def connections(self) -> int:
        assert self.server is not None
        server = self.server
        return self.call(lambda: len(server.connections))

    def __enter__(self) -> RouterThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture
def router() -> Iterator[RouterThread]:
    """A router on a thread (overrides conftest's in-process trio one for the stub tests)."""
    with RouterThread() as r:
        yield r


RouterThreads = Callable[..., RouterThread]


@pytest.fixture
def start_router() -> Iterator[RouterThreads]:
    """Start routers with the given Config overrides; all stopped after the test."""
    started: list[RouterThread] = []

    def start(**overrides: Any) -> RouterThread:
        r = RouterThread(**overrides).start()
        started.append(r)
        return r

    yield start
    for r in started:
        r.stop()


async def eventually(cond: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
    with anyio.fail_after(timeout):
        while not cond():
            await anyio.sleep(0.01)


def buffered(ch: Channel | EventStream[Any]) -> list[Any]:
    """Everything buffered in ``ch`` now, taken out."""
    out: list[Any] = []
    while True:
        try:
            out.append(ch.receive_nowait())
        except WouldBlock:
            return out


async def drain(ch: Channel | EventStream[Any], wait: float = 0.3) -> list[Any]:
    """Everything buffered after a bounded ``wait`` (the "and nothing else" check)."""
    await anyio.sleep(wait)
    return buffered(ch)


async def settle(*stubs: RouterStub) -> None:
    """Return once every frame a router routed to ``stubs`` before now is in their buffers.

    A GET_MEMBERS round trip on every connection of each stub: the router answers it behind
    the frames already queued for that connection, and the stub's reader hands frames on in
    order. Two passes: the first makes the router read what each stub sent before (and queue
    the copies), the second brings those copies in. A drain after it counts a late message,
    which a short sleep would miss.
    """
    for _ in range(2):
        for stub in stubs:
            await stub.members("settle")


def connected(stub: RouterStub, router: tuple[str, int] | None = None) -> bool:
    return any(s.state is ConnectionState.CONNECTED and (router is None or s.router == router)
               for s in stub.status())


# What ``async with`` forms a stub: RouterStub itself, or open_router_stub.
Opener = Callable[..., AbstractAsyncContextManager[RouterStub]]


def break_delivery(stub: RouterStub, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the stub's reader raise on the next ROUTE: a bug inside one of its tasks."""

    def boom(self: Local, f: wire.Route) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(stub._local, "deliver_route", boom.__get__(stub._local))


def caused_by_boom(e: BaseException) -> bool:
    cause = e.__cause__
    return isinstance(cause, BaseExceptionGroup) and cause.subgroup(
        lambda x: isinstance(x, RuntimeError) and str(x) == "boom") is not None


class CountedTime(float):
    """A time whose subtractions are counted: the unit of work of the suspect filter
    (client/merge.py), which looks at an entry with one ``now - last``. Past the budget it
    raises, so a quadratic filter fails a test at once instead of running for minutes: the
    work is counted, never timed."""

    calls = 0
    budget = 0

    @classmethod
    def reset(cls, budget: int) -> None:
        cls.calls, cls.budget = 0, budget

    def __sub__(self, other: float) -> float:
        CountedTime.calls += 1
        if CountedTime.calls > CountedTime.budget:
            raise AssertionError(f"more than {CountedTime.budget} entries looked at")
        return float(self) - other


# --------------------------------------------------------------------------- fake routers


class FakeLink(NativeClient):
    """The router end of one connection: the test client's frame I/O, after the preamble."""

    @classmethod
    async def accept(cls, stream: trio.SocketStream) -> FakeLink:
        link = cls(stream, stream)
        got = b""
        with trio.fail_after(5):
            while len(got) < len(wire.PREAMBLE):
                data = await stream.receive_some(65536)
                if not data:
                    raise EOFError
                got += data
        assert got.startswith(wire.PREAMBLE), got
        link.decoder.feed(got[len(wire.PREAMBLE):])
        return link

    async def send(self, *frames: wire.Frame) -> None:  # one write for several frames
        await self.send_raw(b"".join(wire.encode(f) for f in frames))

    async def serve_requests(self, then: Callable[[wire.Connect], list[wire.Frame]]) -> None:
        """Answer CONNECT with OK (followed by ``then(connect)``), DISCONNECT with OK and
        PING with PONG."""
        while True:
            f = await self.recv()
            if isinstance(f, wire.Connect):
                await self.send(wire.Ok(f.req), *then(f))
            elif isinstance(f, wire.Disconnect):
                await self.send(wire.Ok(f.req))
            elif isinstance(f, wire.Ping):
                await self.send(wire.Pong(f.nonce))


Script = Callable[[FakeLink], Awaitable[None]]


FakeRouter = Callable[[Script], tuple[str, int]]


@pytest.fixture
def fake_router() -> Iterator[FakeRouter]:
    """Serve a script for every connection on a free 127.0.0.1 port, in a trio thread."""
    loops: list[TrioThread] = []

    def start(script: Script) -> tuple[str, int]:
        async def serve(*, task_status: trio.TaskStatus[int]) -> None:
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")

            async def handle(stream: trio.SocketStream) -> None:
                try:
                    await script(await FakeLink.accept(stream))
                except (EOFError, trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                finally:
                    await trio.aclose_forcefully(stream)

            task_status.started(listeners[0].socket.getsockname()[1])
            await trio.serve_listeners(handle, listeners)

        loop = TrioThread()
        loops.append(loop)
        return "127.0.0.1", loop.start(serve)

    yield start
    for loop in loops:
        loop.stop()
