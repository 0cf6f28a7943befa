"""RouterStub in plain asyncio code, on asyncio's own loop and on uvloop (issue 23).

The rest of the stub suite runs on trio and asyncio through AnyIO (tests/stubkit.py); these
tests use asyncio's own forms, as an asyncio application would: ``asyncio.TaskGroup``,
``task.cancel()``, ``asyncio.timeout``, ``asyncio.create_task(stub.run())``, and a small
asyncio server that embeds a stub and keeps serving while its router restarts. One test runs
a plain-asyncio program in a subprocess and checks that it never loads trio.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from typing import Any

import anyio
import pytest

from gossiprouter import (
    ChannelClosedError,
    ConnectionState,
    NotConnectedError,
    RouterStub,
    StubTaskError,
    open_router_stub,
)
from tests.procs import REPO, RouterProcess, refused_port
from tests.stubkit import (
    FAST,
    Opener,
    RouterThread,
    break_delivery,
    caused_by_boom,
    eventually,
    router,
)

__all__ = ["router"]

pytestmark = pytest.mark.anyio

try:
    import uvloop  # noqa: F401
    LOOPS = [pytest.param("asyncio", id="asyncio"),
             pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")]
except ImportError:  # pragma: no cover - uvloop is in the test extra where it installs
    LOOPS = [pytest.param("asyncio", id="asyncio")]


@pytest.fixture(params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


OPENERS = [pytest.param(RouterStub, id="RouterStub"),
           pytest.param(open_router_stub, id="open_router_stub")]


async def test_the_loop_is_the_one_asked_for(anyio_backend: Any) -> None:
    loop = type(asyncio.get_running_loop()).__module__
    assert loop.startswith("uvloop") == (anyio_backend != "asyncio"), loop


# ------------------------------------------------------------------------------ the forms


async def test_task_group_start_returns_the_stub_once_connected(router: RouterThread) -> None:
    """AnyIO's TaskGroup.start is asyncio's nursery.start."""
    async with anyio.create_task_group() as tg:
        stub = await tg.start(RouterStub([router.address], **FAST).run)
        assert [s.state for s in stub.status()] == [ConnectionState.CONNECTED]
        chan = await stub.connect("g", b"A")
        assert [m.addr for m in await chan.members()] == [b"A"]
        await stub.aclose()  # run() returns, and the task group with it
    assert stub.closed and router.members("g") == set()


async def test_a_plain_task_runs_the_stub(router: RouterThread) -> None:
    """No task group at all: ``asyncio.create_task(stub.run())``, then wait_connected."""
    stub = RouterStub([router.address], **FAST)
    task = asyncio.create_task(stub.run())
    await asyncio.sleep(0)  # the task's first step starts the stub (a nursery.start does it)
    await stub.wait_connected()
    await stub.connect("g", b"A")
    assert router.members("g") == {b"A"}
    await stub.aclose()
    await asyncio.wait_for(task, 5)
    assert router.members("g") == set()


async def test_task_group_start_raises_not_connected() -> None:
    with refused_port() as port:
        stub = RouterStub([("127.0.0.1", port)], **{**FAST, "send_timeout": 0.3})
        async with anyio.create_task_group() as tg:
            with pytest.raises(NotConnectedError, match="connection refused"):
                await tg.start(stub.run)
    assert stub.closed


# ------------------------------------------------------------------------------ cancellation


async def test_task_cancel_closes_the_connections(router: RouterThread) -> None:
    """``task.cancel()`` on the task in ``async with RouterStub``: no DISCONNECT (the others
    see ``suspect``), the stub is closed and the task ends cancelled."""
    async with RouterStub([router.address], **FAST) as watcher:
        w = await watcher.connect("g", b"W")
        joined = asyncio.Event()
        stubs: list[RouterStub] = []

        async def app() -> None:
            async with RouterStub([router.address], **FAST) as stub:
                stubs.append(stub)
                await stub.connect("g", b"A")
                joined.set()
                await asyncio.sleep(3600)

        task = asyncio.create_task(app())
        await asyncio.wait_for(joined.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert stubs[0].closed
        assert all(s.state is ConnectionState.CLOSED for s in stubs[0].status())
        async with asyncio.timeout(3):
            ev = await w.events().receive()
        assert (ev.kind, ev.member.addr) == ("suspect", b"A")


async def test_asyncio_timeout_cancels_one_call_only(router: RouterThread) -> None:
    """``asyncio.timeout`` around a receive: TimeoutError, nothing lost, the stub goes on;
    around the whole block: TimeoutError out of it, the stub closed."""
    async with RouterStub([router.address], **FAST) as stub:
        a = await stub.connect("g", b"A")
        b = await stub.connect("g", b"B")
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await b.receive()
        await a.send(b"after the timeout")
        async with asyncio.timeout(3):
            assert (await b.receive()).payload == b"after the timeout"
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            async with RouterStub([router.address], **FAST) as stub2:
                await stub2.connect("g", b"C")
                await asyncio.sleep(3600)
    assert stub2.closed


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize("opener", OPENERS)
async def test_a_failing_task_raises_one_stub_task_error(
        router: RouterThread, monkeypatch: pytest.MonkeyPatch, opener: Opener) -> None:
    async with RouterStub([router.address], **FAST) as other:
        sender = await other.connect("g", b"B")
        with pytest.raises(StubTaskError) as info:
            async with asyncio.timeout(5), opener([router.address], **FAST) as stub:
                await stub.connect("g", b"A")
                break_delivery(stub, monkeypatch)
                await sender.send(b"hello")
                await asyncio.sleep(3600)  # cancelled by the failure
        assert caused_by_boom(info.value)
        with pytest.raises(ChannelClosedError, match="a task failed"):
            await stub.connect("g", b"C")


@pytest.mark.parametrize("opener", OPENERS)
async def test_the_blocks_own_exception_comes_out_as_it_went_in(
        router: RouterThread, opener: Opener) -> None:
    mine = KeyError("mine")
    with pytest.raises(KeyError) as info:
        async with opener([router.address], **FAST) as stub:
            await stub.connect("g", b"A")
            raise mine
    assert info.value is mine and stub.closed


async def test_asyncio_task_group_gathers_the_applications_errors(router: RouterThread) -> None:
    """In an ``asyncio.TaskGroup``, an application task's error cancels the task that runs
    the stub, and the group raises it in an ExceptionGroup, as asyncio does."""
    stub = RouterStub([router.address], **FAST)

    async def failing() -> None:
        await stub.wait_connected()
        await stub.connect("g", b"A")
        raise ValueError("the application's own")

    with pytest.raises(ExceptionGroup) as info:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(stub.run())
            await asyncio.sleep(0)  # run() starts before wait_connected is called
            tg.create_task(failing())
    assert info.group_contains(ValueError, match="the application's own")
    assert stub.closed
    await eventually(lambda: router.members("g") == set())


# ------------------------------------------------------------------------------ an application


class App:
    """A small asyncio server that embeds a stub: each request line ``ask WORD`` is sent to
    the group ``svc`` and answered with the first reply that comes back (a worker, another
    member of the group, answers it)."""

    def __init__(self, stub: RouterStub) -> None:
        self.stub = stub
        self.pending: dict[bytes, asyncio.Future[bytes]] = {}
        self.n = 0

    async def run(self, *, task_status: anyio.abc.TaskStatus[int]) -> None:
        self.chan = await self.stub.connect("svc", b"app", wait=False)
        server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        async with server, asyncio.TaskGroup() as tg:
            tg.create_task(self.replies())
            task_status.started(server.sockets[0].getsockname()[1])
            await server.serve_forever()

    async def replies(self) -> None:
        async for msg in self.chan:
            fut = self.pending.pop(msg.payload.split(b" ", 1)[0], None)
            if fut is not None and not fut.done():
                fut.set_result(msg.payload.split(b" ", 1)[1])

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        self.n += 1
        ticket = b"%d" % self.n
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.pending[ticket] = fut
        try:
            await self.chan.send(ticket + b" " + line.strip(), dest=b"worker")
            async with asyncio.timeout(5):
                writer.write(await fut + b"\n")
        except (TimeoutError, NotConnectedError) as e:
            writer.write(f"error: {e}\n".encode())
        await writer.drain()
        writer.close()


async def worker(stub: RouterStub) -> None:
    chan = await stub.connect("svc", b"worker", wait=False)
    async for msg in chan:
        ticket, text = msg.payload.split(b" ", 1)
        await chan.send(ticket + b" " + text.upper(), dest=msg.sender)


async def ask(port: int, text: str) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(text.encode() + b"\n")
    await writer.drain()
    answer = await reader.readline()
    writer.close()
    return answer.decode().strip()


async def test_an_asyncio_app_keeps_serving_across_a_router_restart(
        router: RouterThread) -> None:
    """The app answers through the router, the router restarts on the same port under it,
    and the next requests are answered again: the app itself never restarts."""
    async with RouterStub([router.address], **FAST) as app_stub, \
            RouterStub([router.address], **FAST) as worker_stub, \
            anyio.create_task_group() as tg:
        tg.start_soon(worker, worker_stub)
        port = await tg.start(App(app_stub).run)
        await eventually(lambda: router.members("svc") == {b"app", b"worker"})
        assert await ask(port, "ask hello") == "ASK HELLO"

        await router.astop()
        await eventually(lambda: not any(s.state is ConnectionState.CONNECTED
                                         for s in app_stub.status()))
        await router.astart()
        await eventually(lambda: router.members("svc") == {b"app", b"worker"})
        assert [await ask(port, f"ask again {i}") for i in range(3)] == [
            f"ASK AGAIN {i}" for i in range(3)]
        assert app_stub.status()[0].connections == 2
        tg.cancel_scope.cancel()


# ------------------------------------------------------------------------------ installed


PROGRAM = textwrap.dedent("""
    import asyncio, sys
    from gossiprouter import RouterStub

    async def main(port):
        async with RouterStub([("127.0.0.1", port)]) as stub:
            a = await stub.connect("demo", b"a")
            b = await stub.connect("demo", b"b")
            await a.send(b"hello")
            async with asyncio.timeout(5):
                print((await b.receive()).payload.decode())
        print("trio loaded:", "trio" in sys.modules)

    asyncio.run(main(int(sys.argv[1])))
""")


def test_a_plain_asyncio_program_never_loads_trio() -> None:
    """What an asyncio user writes: asyncio and gossiprouter, nothing of trio (or AnyIO)."""
    with RouterProcess() as r:
        out = subprocess.run([sys.executable, "-c", PROGRAM, str(r.port)], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["hello", "trio loaded: False"]
