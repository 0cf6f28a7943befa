"""The trio forms of RouterStub and Router, and their error policy (issue 14, item 6).

``await nursery.start(stub.run)`` returns once connected; ``async with RouterStub(...)`` and
``async with open_router_stub(...)`` run the stub around a block. The policy in
gossiprouter/client/lifecycle.py's docstring, point by point: a failing task of the stub reaches
the caller as one StubTaskError (never a nested group), the block's own exception comes out
as it went in, and cancelling the caller closes the connections. Router: ``nursery.start
(router.run)`` returns the address once listening; a failing listener; cancellation.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest
import trio

from gossiprouter import ConnectionState, RouterStub, open_router_stub
from gossiprouter.client.errors import ChannelClosedError, NotConnectedError, StubTaskError
from gossiprouter.core.config import Config
from gossiprouter.protocol import native as wire
from gossiprouter.router import Router, open_router
from gossiprouter.server.listener import ListenError, Server
from tests.nclient import NativeClient
from tests.procs import refused_port
from tests.stubkit import Opener, break_delivery, caused_by_boom
from tests.test_stub import FAST

OPENERS: list[Opener] = [RouterStub, open_router_stub]


# ------------------------------------------------------------------------------ nursery.start


async def test_nursery_start_returns_the_stub_once_connected(router: Server) -> None:
    assert router.address is not None
    async with trio.open_nursery() as nursery:
        stub = await nursery.start(RouterStub([router.address], **FAST).run)
        # Connected when start() returns, not merely connecting.
        assert [s.state for s in stub.status()] == [ConnectionState.CONNECTED]
        chan = await stub.connect("g", b"A")
        assert [m.addr for m in await chan.members()] == [b"A"]
        await stub.aclose()  # run() returns, and the nursery with it
    assert stub.closed
    assert router.hub.table.members("g") == []  # aclose left the group cleanly


async def test_nursery_start_raises_not_connected_when_no_router_answers() -> None:
    with refused_port() as port:
        stub = RouterStub([("127.0.0.1", port)], **{**FAST, "send_timeout": 0.5})
        async with trio.open_nursery() as nursery:
            with trio.fail_after(5), pytest.raises(NotConnectedError,
                                                   match="connection refused"):
                await nursery.start(stub.run)
    assert stub.closed


async def test_a_stub_runs_once(router: Server) -> None:
    assert router.address is not None
    async with RouterStub([router.address], **FAST) as stub:
        with pytest.raises(RuntimeError, match="once"):
            await stub.run()


# ------------------------------------------------------------------------------ a task fails


async def test_a_failing_task_ends_run_with_one_stub_task_error(
        router: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    assert router.address is not None
    stub = RouterStub([router.address], **FAST)
    ended: list[BaseException] = []

    async def run(*, task_status: trio.TaskStatus[RouterStub]) -> None:
        try:
            await stub.run(task_status=task_status)
        except BaseException as e:  # what run() itself raises, before any nursery of ours
            ended.append(e)

    async with RouterStub([router.address], **FAST) as other, trio.open_nursery() as nursery:
        await nursery.start(run)
        await stub.connect("g", b"A")
        sender = await other.connect("g", b"B")
        break_delivery(stub, monkeypatch)
        await sender.send(b"hello")
        with trio.fail_after(5):
            while not ended:
                await trio.sleep(0.01)
    assert [type(e) for e in ended] == [StubTaskError]
    assert caused_by_boom(ended[0])
    assert stub.closed
    with pytest.raises(ChannelClosedError, match="a task failed"):
        await stub.connect("g", b"C")


@pytest.mark.parametrize("opener", OPENERS, ids=["RouterStub", "open_router_stub"])
async def test_a_failing_task_cancels_the_block_and_raises_stub_task_error(
        router: Server, monkeypatch: pytest.MonkeyPatch, opener: Opener) -> None:
    assert router.address is not None
    reached_the_end = False
    async with RouterStub([router.address], **FAST) as other:
        sender = await other.connect("g", b"B")
        with trio.fail_after(5), pytest.raises(StubTaskError) as info:
            async with opener([router.address], **FAST) as stub:
                await stub.connect("g", b"A")
                break_delivery(stub, monkeypatch)
                await sender.send(b"hello")
                await trio.sleep_forever()  # cancelled by the failure
                reached_the_end = True
    assert not reached_the_end
    assert caused_by_boom(info.value)
    assert stub.closed


# ------------------------------------------------------------------------------ the block


@pytest.mark.parametrize("opener", OPENERS, ids=["RouterStub", "open_router_stub"])
async def test_the_blocks_own_exception_comes_out_as_it_went_in(
        router: Server, opener: Opener) -> None:
    assert router.address is not None
    mine = KeyError("mine")
    with pytest.raises(KeyError) as info:
        async with opener([router.address], **FAST) as stub:
            await stub.connect("g", b"A")
            raise mine
    assert info.value is mine  # not an ExceptionGroup around it
    assert stub.closed


@pytest.mark.parametrize("opener", OPENERS, ids=["RouterStub", "open_router_stub"])
async def test_leaving_the_block_leaves_every_group(router: Server, opener: Opener) -> None:
    assert router.address is not None
    async with opener([router.address], **FAST) as stub:
        await stub.connect("g", b"A")
        assert [e.addr for e in router.hub.table.members("g")] == [b"A"]
    assert stub.closed
    assert router.hub.table.members("g") == []


# ------------------------------------------------------------------------------ cancellation


@pytest.mark.parametrize("form", ["nursery.start", "async with"])
async def test_cancelling_the_caller_closes_the_connections(router: Server, form: str) -> None:
    """No DISCONNECT is sent, so the other members see the connection close: ``suspect``
    at once (the router's idle timeout, the only other way, is far longer)."""
    assert router.address is not None
    async with RouterStub([router.address], **FAST) as watcher:
        w = await watcher.connect("g", b"W")
        with trio.CancelScope() as cancelled:
            if form == "nursery.start":
                async with trio.open_nursery() as nursery:
                    stub = await nursery.start(RouterStub([router.address], **FAST).run)
                    await stub.connect("g", b"A")
                    cancelled.cancel()
            else:
                async with RouterStub([router.address], **FAST) as stub:
                    await stub.connect("g", b"A")
                    cancelled.cancel()
                    await trio.sleep_forever()
        assert stub.closed
        assert all(s.state is ConnectionState.CLOSED for s in stub.status())
        with trio.fail_after(3):
            ev = await w.events().receive()
        assert (ev.kind, ev.member.addr) == ("suspect", b"A")
        assert [m.addr for m in await watcher.members("g")] == [b"W"]


# ------------------------------------------------------------------------------ Router


def _busy_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


async def test_router_run_returns_the_address_once_listening() -> None:
    router = Router(Config(host="127.0.0.1", port=0))
    async with trio.open_nursery() as nursery:
        address = await nursery.start(router.run)
        assert address == router.address
        client = await NativeClient.open(*address)  # accepted at once: it listens
        member = await router.register("g", b"M")
        await client.connect("g", b"C")
        await member.send(b"hi", dest=b"C")
        assert await client.recv() == wire.Route("g", b"C", b"M", b"hi")
        router.shutdown()  # run() returns after the graceful shutdown
        frames = await client.recv_until_closed()
    assert any(isinstance(f, wire.Error) and f.code == "shutting_down" for f in frames)


async def test_a_failing_listener() -> None:
    with _busy_port() as busy:
        port = busy.getsockname()[1]
        async with trio.open_nursery() as nursery:
            with pytest.raises(ListenError):  # from start() itself, before it returns
                await nursery.start(Router(Config(host="127.0.0.1", port=port)).run)
        # The async with forms too: bare, as before the trio forms existed.
        for opener in (Router, open_router):
            with pytest.raises(ListenError):
                async with opener(Config(host="127.0.0.1", port=port)):
                    pytest.fail("the block ran without a listener")


@pytest.mark.parametrize("opener", [Router, open_router], ids=["Router", "open_router"])
async def test_cancelling_a_router_closes_its_connections_at_once(opener: Any) -> None:
    with trio.CancelScope() as cancelled:
        async with opener(Config(host="127.0.0.1", port=0)) as router:
            client = await NativeClient.open(*router.address)
            cancelled.cancel()
            await trio.sleep_forever()
    # Closed without the graceful notice (that is shutdown()).
    frames = await client.recv_until_closed(timeout=3)
    assert not any(isinstance(f, wire.Error) for f in frames)
