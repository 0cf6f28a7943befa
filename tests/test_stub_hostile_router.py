"""RouterStub against a router that misbehaves, or a port that is no router (issue 31).

The stub is embedded in applications: nothing a router sends may take the application down,
hold its event loop, or fill its memory or its log. Each test runs on trio and asyncio
(tests/stubkit.py); the hostile router is a script on a trio thread (``fake_router``), or a
real router with a member that floods. No assertion is about time: they count work, frames,
log lines and bytes, and read the reason the stub gives for ending a connection; the waits
are event-driven (``eventually`` polls a condition, its timeout only guards against a hang).
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest
import trio

from gossiprouter import RouterStub
from gossiprouter.client.model import MAX_QUEUED_PONGS, MAX_REPLY_MEMBERS
from gossiprouter.ops.runtime import Operations
from gossiprouter.protocol import native as wire
from gossiprouter.stub import StubEvent
from tests.stubkit import (
    FAST,
    CountedTime,
    FakeLink,
    FakeRouter,
    RouterThreads,
    anyio_backend,
    buffered,
    eventually,
    fake_router,
    settle,
    start_router,
)

__all__ = ["anyio_backend", "fake_router", "start_router"]

pytestmark = pytest.mark.anyio

WELCOME = wire.Welcome(1, "fake", {})


_REASONS: dict[int, list[str]] = {}


def _stub(addr: tuple[str, int], **opts: Any) -> RouterStub:
    """A stub on ``addr`` that records every reason a connection of it ended (from
    ``on_state``), so a test sees the reason even if the stub has reconnected since."""
    reasons: list[str] = []

    def record(ev: StubEvent) -> None:
        if ev.error:
            reasons.append(ev.error)

    stub = RouterStub([addr], **opts, on_state=record)
    _REASONS[id(stub)] = reasons
    return stub


async def _lost(stub: RouterStub, *words: str) -> str:
    """Wait until a connection of the stub ended with a reason holding ``words``; the reason."""
    def found() -> str | None:
        return next((r for r in _REASONS[id(stub)] if all(w in r for w in words)), None)

    await eventually(lambda: found() is not None, timeout=20)
    reason = found()
    assert reason is not None
    return reason


# ------------------------------------------------------------------------ suspects


async def _register_and_drop(address: tuple[str, int], group: str, n: int) -> None:
    """A raw member registers ``n`` addresses in ``group`` (pipelined), then drops its
    connection without DISCONNECT: the router reports ``n`` suspects to the group."""
    stream = await anyio.connect_tcp(*address)
    await stream.send(wire.PREAMBLE + wire.encode(wire.Hello(wire.SUPPORTED_VERSIONS, "x")))
    await stream.send(b"".join(wire.encode(wire.Connect(i + 1, group, i.to_bytes(4, "big")))
                               for i in range(n)))
    dec = wire.Decoder()
    oks = 0
    with anyio.fail_after(30):
        while oks < n:
            dec.feed(await stream.receive())
            while (f := dec.next_frame()) is not None:
                assert not isinstance(f, wire.Error), f
                oks += isinstance(f, wire.Ok)
    await anyio.aclose_forcefully(stream)


async def test_a_flood_of_suspects_is_linear_work(start_router: RouterThreads,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """One member registers 16,384 addresses and drops its connection: a stub in the group
    gets every suspect, and its filter looks at each entry a bounded number of times (the
    work is counted through the time the reader hands it; the quadratic filter looked at
    n * n / 2 entries, holding the loop for seconds)."""
    n = 16_384
    router = start_router(addresses_per_connection=0, control_rate=0)
    async with RouterStub([router.address], **{**FAST, "event_buffer": 2 * n}) as stub:
        ch = await stub.connect("g", b"B")
        deliver = stub._local.deliver_event
        CountedTime.reset(budget=4 * n)
        monkeypatch.setattr(stub._local, "deliver_event",
                            lambda r, f, now: deliver(r, f, CountedTime(now)))
        await _register_and_drop(router.address, "g", n)
        got: list[Any] = []

        def all_in() -> bool:
            got.extend(buffered(ch.events()))
            return len(got) >= n or stub.closed

        await eventually(all_in, timeout=60)
        assert {e.kind for e in got} == {"suspect"} and len(got) == n
        assert len({e.member.addr for e in got}) == n
        assert CountedTime.calls <= 4 * n
        await settle(stub)  # the stub is still alive and answering


# ------------------------------------------------------------------------ max_frame


async def test_an_announced_max_frame_is_capped(fake_router: FakeRouter,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """A router announcing max_frame 2**40, then sending the header of a 1 GiB frame: the
    stub takes it as its own max_frame (8 MiB by default), says so, and ends the connection
    at the header, before buffering the frame."""
    sent: list[int] = []

    async def script(link: FakeLink) -> None:
        await link.recv()
        await link.send(wire.Welcome(1, "fake", {"max_frame": 2 ** 40}))
        body = (1 << 30).to_bytes(4, "big") + b"\x00" * 65536
        await link.send_raw(body)
        sent.append(len(body))
        await trio.sleep_forever()

    addr = fake_router(script)
    with caplog.at_level(logging.WARNING, logger="gossiprouter.stub"):
        async with _stub(addr, **FAST) as stub:
            assert stub.max_frame == wire.DEFAULT_MAX_FRAME
            reason = await _lost(stub, "max_frame")
    assert reason.startswith(f"router sent a frame longer than this client's max_frame of "
                             f"{wire.DEFAULT_MAX_FRAME} bytes (frame of {1 << 30} bytes")
    assert f"the router announced max_frame {2 ** 40}" in reason
    assert "RouterStub max_frame option" in reason
    assert any(f"announces max_frame {2 ** 40}, more than this client's max_frame option "
               f"({wire.DEFAULT_MAX_FRAME})" in m for m in caplog.messages)


async def test_the_max_frame_option_is_checked() -> None:
    with pytest.raises(ValueError, match="max_frame must be an int of at least 65536"):
        RouterStub([("127.0.0.1", 1)], max_frame=100)


# ------------------------------------------------------------------------ replies and PONGs


async def test_a_member_list_past_the_bound_ends_the_connection(
        fake_router: FakeRouter) -> None:
    """GET_MEMBERS answered by parts that never end: past MAX_REPLY_MEMBERS the connection
    ends as a protocol violation, and members() raises at once with that reason (before, the
    stub held every part until the request timed out)."""
    part = 4096
    parts_sent: list[int] = []

    async def script(link: FakeLink) -> None:
        await link.recv()
        await link.send(WELCOME)
        while True:
            f = await link.recv(timeout=60)
            if isinstance(f, wire.GetMembers):
                members = tuple(wire.MemberInfo(i.to_bytes(4, "big"), None, ())
                                for i in range(part))
                for _ in range(2 * MAX_REPLY_MEMBERS // part):  # bounded: twice the bound
                    await link.send(wire.Ok(f.req, members, more=True))
                    parts_sent.append(1)
            elif isinstance(f, wire.Ping):
                await link.send(wire.Pong(f.nonce))

    addr = fake_router(script)
    async with _stub(addr, **{**FAST, "request_timeout": 60}) as stub:
        await stub.wait_connected(timeout=10)
        with pytest.raises(Exception, match="protocol violation: router sent a member list"):
            await stub.members("g")
        reason = await _lost(stub, "protocol violation")
    assert f"bound of {MAX_REPLY_MEMBERS} members" in reason
    assert len(parts_sent) <= 2 * MAX_REPLY_MEMBERS // part


async def test_pings_without_reading_end_the_connection(fake_router: FakeRouter) -> None:
    """A router that sends PINGs and never reads the PONGs: past MAX_QUEUED_PONGS owed, the
    connection ends as a protocol violation (before, the PONGs queued without bound)."""
    async def script(link: FakeLink) -> None:
        await link.recv()
        await link.send(WELCOME)
        ping = wire.encode(wire.Ping(7))
        for _ in range(20):  # bounded: 20 x 10,000 PINGs
            await link.send_raw(ping * 10_000)
        await trio.sleep_forever()

    addr = fake_router(script)
    async with _stub(addr, **FAST) as stub:
        reason = await _lost(stub, "PINGs")
    assert reason == (f"protocol violation: router sent more than {MAX_QUEUED_PONGS} PINGs "
                      "without reading the PONGs")


# ------------------------------------------------------------------------ heartbeats


async def test_a_dripping_router_is_dropped_at_the_heartbeat_timeout(
        fake_router: FakeRouter) -> None:
    """After WELCOME the router sends a frame one byte at a time, never finishing it, and
    answers nothing: only whole frames count as life, so the heartbeat drops it (before,
    every byte counted and the connection was kept for ever)."""
    dripped: list[int] = []

    async def script(link: FakeLink) -> None:
        await link.recv()
        await link.send(WELCOME)
        frame = (1 << 20).to_bytes(4, "big") + b"\x00" * (1 << 20)
        for b in frame[:2000]:  # bounded: 2000 bytes, never a whole frame
            await link.send_raw(bytes([b]))
            dripped.append(b)
            await trio.sleep(0.02)

    addr = fake_router(script)
    opts = {**FAST, "heartbeat_interval": 0.2, "heartbeat_timeout": 0.5}
    async with _stub(addr, **opts) as stub:
        reason = await _lost(stub, "heartbeat timeout")
    assert reason == "nothing received for 0.5s (heartbeat timeout)"
    assert len(dripped) < 2000, "the drip ended before the stub gave up"


# ------------------------------------------------------------------------ logging


async def test_warnings_are_rate_limited_and_stop_with_the_connection(
        fake_router: FakeRouter, caplog: pytest.LogCaptureFixture) -> None:
    """A router sends 3,000 ERRORs without a request, an unframed length, and 3,000 more in
    one write: the stub counts the first 3,000 (nothing after the connection died) and logs
    one WARNING line for them, not 3,000."""
    n = 3000
    err = wire.encode(wire.Error(None, "unknown_destination", "no such member"))
    unframed = (1 << 31).to_bytes(4, "big")

    connections: list[FakeLink] = []

    async def script(link: FakeLink) -> None:
        connections.append(link)
        await link.recv()
        await link.send(WELCOME)
        if len(connections) == 1:  # the next connections stay quiet
            await link.send_raw(err * n + unframed + err * n)
        await trio.sleep_forever()

    addr = fake_router(script)
    with caplog.at_level(logging.WARNING, logger="gossiprouter.stub"):
        async with _stub(addr, **FAST) as stub:
            await _lost(stub, "unframed")
            assert stub.stats.async_errors == {"unknown_destination": n}
    lines = [m for m in caplog.messages if "unknown_destination" in m]
    assert lines == [f"router {addr[0]}:{addr[1]}: unknown_destination: no such member"]


# ------------------------------------------------------------------------ not a router


async def test_the_metrics_port_is_named(start_router: RouterThreads) -> None:
    """The router's own --metrics endpoint (an HTTP server) answers the HELLO at once: the
    stub says what answered, without waiting for the connect timeout."""
    router = start_router(metrics="127.0.0.1:0")
    assert router.server is not None and isinstance(router.server.hooks, Operations)
    admin = router.server.hooks.admin_address
    assert admin is not None
    stub = RouterStub([admin], **{**FAST, "connect_timeout": 60, "send_timeout": 60})
    async with stub:
        with pytest.raises(Exception) as err:
            await stub.wait_connected(fail_fast=True)
    assert str(err.value) == (
        f"the peer at 127.0.0.1:{admin[1]} does not speak the gossiprouter protocol: an HTTP "
        "server answered ('HTTP/1.1 400 Bad Request'): is this the metrics port?")


async def test_a_peer_that_closes_is_named(fake_router: FakeRouter) -> None:
    """A peer that takes HELLO and closes (an MQTT broker does): named, no class name."""
    async def script(link: FakeLink) -> None:
        await link.recv()  # then the connection closes

    addr = fake_router(script)
    stub = RouterStub([addr], **{**FAST, "connect_timeout": 60, "send_timeout": 60})
    async with stub:
        with pytest.raises(Exception) as err:
            await stub.wait_connected(fail_fast=True)
    message = str(err.value)
    assert message.startswith(
        f"the peer at 127.0.0.1:{addr[1]} closed the connection during the handshake: is "
        "this a gossiprouter or JGroups router port?"), message
    assert "Error" not in message
