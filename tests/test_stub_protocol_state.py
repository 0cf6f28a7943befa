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

import anyio
import pytest
import trio

from gossiprouter import RouterStub
from gossiprouter.protocol import native as wire
from tests.stubkit import (
    FAST,
    FakeLink,
    FakeRouter,
    anyio_backend,
    connected,
    eventually,
    fake_router,
)

__all__ = ["anyio_backend", "fake_router"]

pytestmark = pytest.mark.anyio

WELCOME = wire.Welcome(1, "fake", {})


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
