"""The RouterStub holds a router to the state table (protocol/native_state.py).

Each test runs a fake router on 127.0.0.1: a script that reads the stub's frames and
answers with frames a real router would never send at that point (a second WELCOME, an
EVENT before WELCOME, a CONNECT). The stub must treat them as the protocol errors they are,
reported as it reports other bad frames: refused handshakes name the peer as no gossiprouter;
after the handshake the frame is dropped, counted in ``stats.bad_frames`` and logged, and
the connection goes on. The stub runs on asyncio and trio; the fake router on trio, on a
thread (tests/stubkit.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator

import anyio
import pytest
import trio

from gossiprouter import RouterStub
from gossiprouter.protocol import native as wire
from tests.nclient import NativeClient
from tests.stubkit import FAST, TrioThread, anyio_backend, connected, eventually

__all__ = ["anyio_backend"]

pytestmark = pytest.mark.anyio

WELCOME = wire.Welcome(1, "fake", {})


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


async def _illegal_after_welcome(fake_router: FakeRouter, caplog: pytest.LogCaptureFixture,
                                 bad: wire.Frame, message: str) -> None:
    """The router sends ``bad`` right after WELCOME: the stub drops it as a bad frame and
    goes on (a channel registers and receives a message afterwards)."""
    hellos: list[wire.Frame] = []

    async def script(link: FakeLink) -> None:
        hellos.append(await link.recv())
        await link.send(WELCOME, bad)
        await link.serve_requests(
            lambda c: [wire.Route(c.group, c.addr, b"R", b"after the bad frame")])

    addr = fake_router(script)
    with caplog.at_level(logging.WARNING, logger="gossiprouter.stub"):
        async with RouterStub([addr], **FAST) as stub:
            await stub.wait_connected(timeout=5)
            ch = await stub.connect("g", b"A")
            with anyio.fail_after(5):
                msg = await ch.receive()
            assert msg.payload == b"after the bad frame"
            # The bad frame came before the OK on the same stream: counted by now.
            assert stub.stats.bad_frames == 1
            assert connected(stub) and stub.status()[0].connections == 1
    assert [m for m in caplog.messages if "bad frame" in m] == [
        f"dropping a bad frame from 127.0.0.1:{addr[1]}: {message}"]
    assert len(hellos) == 1 and isinstance(hellos[0], wire.Hello)


async def test_a_second_welcome_is_a_bad_frame(fake_router: FakeRouter,
                                               caplog: pytest.LogCaptureFixture) -> None:
    await _illegal_after_welcome(fake_router, caplog, WELCOME, "second WELCOME")


async def test_a_client_frame_from_the_router_is_a_bad_frame(
        fake_router: FakeRouter, caplog: pytest.LogCaptureFixture) -> None:
    await _illegal_after_welcome(fake_router, caplog, wire.Connect(1, "g", b"X"),
                                 "a router may not send Connect")


async def test_an_event_before_welcome_fails_the_handshake(fake_router: FakeRouter) -> None:
    attempts: list[int] = []

    async def script(link: FakeLink) -> None:
        assert isinstance(await link.recv(), wire.Hello)
        attempts.append(1)
        await link.send(wire.Event("g", "join", b"A"), WELCOME)
        await trio.sleep_forever()  # the stub must not wait for the WELCOME behind it

    addr = fake_router(script)
    async with RouterStub([addr], **FAST) as stub:
        await eventually(lambda: stub.status()[0].last_error is not None)
        status = stub.status()[0]
        assert status.last_error == ("does not speak the gossiprouter protocol "
                                     "(got Event instead of WELCOME)")
        assert status.connections == 0 and not connected(stub)
    assert attempts


async def test_an_error_before_welcome_is_a_refused_hello(fake_router: FakeRouter) -> None:
    async def script(link: FakeLink) -> None:
        assert isinstance(await link.recv(), wire.Hello)
        await link.send(wire.Error(None, "unauthorized", "no token"))
        await trio.sleep_forever()

    addr = fake_router(script)
    async with RouterStub([addr], **FAST) as stub:
        await eventually(lambda: stub.status()[0].last_error is not None)
        assert stub.status()[0].last_error == "router refused HELLO: unauthorized: no token"
        assert not connected(stub)
