"""The router over real sockets: registration, routing, errors (issue 2, acceptance 4 and 5)."""

from __future__ import annotations

import struct

import msgpack
import pytest
import trio

from gossiprouter.protocol import native as wire
from gossiprouter.server.listener import Server
from tests.nclient import NativeClient
from tests.quiet import nothing_more


async def test_get_members_lists_names_and_physical(router: Server) -> None:
    a, b = await NativeClient.several(router, 2)
    assert await a.connect("g", b"A", "alpha", (("10.0.0.1", 7800),)) == wire.Ok(1)
    assert await b.connect("g", b"B", "beta", (("10.0.0.2", 7801), ("::1", 7802))) == wire.Ok(1)
    reply = await a.request(wire.GetMembers(a.req(), "g"))
    assert isinstance(reply, wire.Ok)
    assert reply.members == (
        wire.MemberInfo(b"A", "alpha", (("10.0.0.1", 7800),)),
        wire.MemberInfo(b"B", "beta", (("10.0.0.2", 7801), ("::1", 7802))),
    )
    empty = await a.request(wire.GetMembers(a.req(), "nobody-here"))
    assert empty == wire.Ok(empty.req, ()) if isinstance(empty, wire.Ok) else False


async def test_unicast_is_forwarded_byte_for_byte(router: Server) -> None:
    a, b = await NativeClient.several(router, 2)
    await a.connect("g", b"A")
    await b.connect("g", b"B")
    # A deliberately non-minimal msgpack encoding (bin32 payload, str8 group):
    # a router that re-encoded frames would send different bytes.
    body = (b"\x95\x06" + b"\xd9\x01g" + b"\xc4\x01B" + b"\xc4\x01A"
            + b"\xc6\x00\x00\x00\x05hello")
    frame = struct.pack(">I", len(body)) + body
    await a.send_raw(frame)
    got = b""
    with trio.fail_after(5):
        while len(got) < len(frame):
            got += await b.stream.receive_some(65536)
    assert got == frame


async def test_multicast_reaches_each_other_connection_once(router: Server) -> None:
    a, b, c = await NativeClient.several(router, 3)
    await a.connect("g", b"A")
    await b.connect("g", b"B")
    # c carries two members of g (shared transport): one copy for the connection.
    await c.connect("g", b"C1")
    await c.connect("g", b"C2")
    await a.send(wire.Route("g", None, b"A", b"to-all"))
    assert await b.recv() == wire.Route("g", None, b"A", b"to-all")
    assert await c.recv() == wire.Route("g", None, b"A", b"to-all")
    # c's own multicast: c still gets one copy, since it carries another member (C2).
    await c.send(wire.Route("g", None, b"C1", b"from-c1"))
    assert await a.recv() == wire.Route("g", None, b"C1", b"from-c1")
    assert await b.recv() == wire.Route("g", None, b"C1", b"from-c1")
    assert await c.recv() == wire.Route("g", None, b"C1", b"from-c1")
    await nothing_more(a)
    await nothing_more(b)
    await nothing_more(c)


async def test_disconnect_and_abrupt_close_remove_the_member(router: Server) -> None:
    a, b, c = await NativeClient.joined(router, "g", b"A", b"B", b"C")
    assert await b.request(wire.Disconnect(b.req(), "g", b"B")) == wire.Ok(2)
    await c.aclose()
    # C vanished without DISCONNECT: A is told; B left cleanly: nobody is told.
    assert await a.recv() == wire.Event("g", "suspect", b"C", None, ())
    assert await a.member_addrs("g") == [b"A"]
    await nothing_more(a)


async def test_disconnect_of_unregistered_address_is_not_member(router: Server) -> None:
    a = await NativeClient.to(router)
    reply = await a.request(wire.Disconnect(a.req(), "g", b"X"))
    assert isinstance(reply, wire.Error) and reply.code == "not_member"
    assert await a.request(wire.GetMembers(a.req(), "g")) == wire.Ok(2, ())


async def test_route_from_unregistered_sender_is_not_member(router: Server) -> None:
    a, b = await NativeClient.several(router, 2)
    await b.connect("g", b"B")
    await a.send(wire.Route("g", b"B", b"A", b"spoof"))
    f = await a.recv()
    assert isinstance(f, wire.Error) and f.code == "not_member" and f.req is None
    await nothing_more(b)
    # The connection stays usable.
    assert await a.connect("g", b"A") == wire.Ok(1)


async def test_malformed_frame_closes_only_that_connection(router: Server) -> None:
    a, b, bad = await NativeClient.several(router, 3)
    await a.connect("g", b"A")
    await b.connect("g", b"B")
    await bad.connect("g", b"BAD")
    body = msgpack.packb([wire.FrameType.CONNECT, 7, "g"])  # too few fields
    await bad.send_raw(struct.pack(">I", len(body)) + body)
    rest = await bad.recv_until_closed()
    assert isinstance(rest[-1], wire.Error) and rest[-1].code == "protocol"
    assert "CONNECT takes 5 fields" in rest[-1].message
    # The others are told BAD is gone, and keep working.
    assert await b.recv() == wire.Event("g", "suspect", b"BAD", None, ())
    await a.send(wire.Route("g", b"B", b"A", b"still-works"))
    assert await b.recv() == wire.Route("g", b"B", b"A", b"still-works")


async def test_oversize_frame_is_refused(start_router: object) -> None:
    router = await start_router(max_frame=1024)  # type: ignore[operator]
    c = await NativeClient.to(router)
    assert c.welcome is not None and c.welcome.settings["max_frame"] == 1024
    await c.send_raw(struct.pack(">I", 2**31))  # claims 2 GiB; sends nothing more
    rest = await c.recv_until_closed()
    assert isinstance(rest[-1], wire.Error) and rest[-1].code == "frame_too_large"


async def test_hello_rules(router: Server) -> None:
    assert router.address is not None
    c = await NativeClient.open(*router.address, hello=False)
    await c.send(wire.Hello((7, 8), "future-client"))
    rest = await c.recv_until_closed()
    assert [type(f) for f in rest] == [wire.Error]
    assert isinstance(rest[0], wire.Error) and rest[0].code == "unsupported_version"

    c = await NativeClient.open(*router.address, hello=False)
    await c.send(wire.GetMembers(1, "g"))
    rest = await c.recv_until_closed()
    assert rest == [wire.Error(None, "protocol", "first frame must be HELLO, got GetMembers")]

    c = await NativeClient.open(*router.address, hello=False)
    await c.send(wire.Hello((1, 2), "x"))
    w = await c.recv()
    assert isinstance(w, wire.Welcome) and w.version == 1
    await c.send(wire.Hello((1,), "again"))
    rest = await c.recv_until_closed()
    assert rest == [wire.Error(None, "protocol", "second HELLO")]


# Before HELLO, every frame type but HELLO is refused by the state table, ROUTE and PUBLISH
# included: their fast paths only run once the connection is OPEN.
_BEFORE_HELLO: list[tuple[wire.Frame, str]] = [
    (wire.Route("g", None, b"A", b"x"), "Route"),
    (wire.Publish("g", b"A", "p", "b", (), 0, b"x"), "Publish"),
    (wire.Connect(1, "g", b"A"), "Connect"),
    (wire.Ping(1), "Ping"),
    (wire.Welcome(1, "me", {}), "Welcome"),
]


@pytest.mark.parametrize(("frame", "name"), _BEFORE_HELLO, ids=[n for _, n in _BEFORE_HELLO])
async def test_anything_but_hello_first_is_refused(router: Server, frame: wire.Frame,
                                                   name: str) -> None:
    assert router.address is not None
    c = await NativeClient.open(*router.address, hello=False)
    await c.send(frame)
    rest = await c.recv_until_closed()
    assert rest == [wire.Error(None, "protocol", f"first frame must be HELLO, got {name}")]
    assert router.hub.counters.routed == 0 and router.hub.table.members("g") == []


async def test_ping_pong(router: Server) -> None:
    c = await NativeClient.to(router)
    await c.send(wire.Ping(42))
    assert await c.recv() == wire.Pong(42)


_ROUTER_ONLY: list[wire.Frame] = [
    wire.Ok(1), wire.Error(None, "x", "y"), wire.Welcome(1, "me", {}),
    wire.Event("g", "join", b"A"),
]


@pytest.mark.parametrize("frame", _ROUTER_ONLY, ids=[type(f).__name__ for f in _ROUTER_ONLY])
async def test_a_frame_type_only_the_router_sends_is_refused(router: Server,
                                                             frame: wire.Frame) -> None:
    c = await NativeClient.to(router)
    await c.send(frame)
    rest = await c.recv_until_closed()
    assert rest == [wire.Error(None, "protocol",
                               f"a client may not send {type(frame).__name__}")]


async def test_unknown_preamble_is_closed(router: Server) -> None:
    assert router.address is not None
    s = await trio.open_tcp_stream(*router.address)
    await s.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    with trio.fail_after(5):
        assert await s.receive_some(100) == b""


async def test_unknown_destination_is_reported_and_rate_limited(router: Server) -> None:
    a = await NativeClient.to(router)
    await a.connect("g", b"A")
    for _ in range(5):
        await a.send(wire.Route("g", b"NOPE", b"A", b"x"))
    f = await a.recv()
    assert isinstance(f, wire.Error) and f.code == "unknown_destination"
    await nothing_more(a, 0.3)
    assert router.hub.counters.drops["unknown_destination"] == 5


async def test_per_sender_fifo_10000(router: Server) -> None:
    a, b, c = await NativeClient.several(router, 3)
    await a.connect("g", b"A")
    await b.connect("g", b"B")
    await c.connect("g", b"C")
    n = 10_000
    batch = b"".join(wire.encode_route("g", None, b"A", i.to_bytes(4, "big")) for i in range(n))

    async def expect(rx: NativeClient) -> None:
        for i in range(n):
            f = await rx.recv(timeout=20)
            assert isinstance(f, wire.Route) and int.from_bytes(f.payload, "big") == i

    async with trio.open_nursery() as nursery:
        nursery.start_soon(expect, b)
        nursery.start_soon(expect, c)
        for k in range(0, len(batch), 7919):  # odd-sized writes split frames anywhere
            await a.send_raw(batch[k : k + 7919])


async def test_direct_send_wakes_no_writer(router: Server) -> None:
    """Light load: routed frames go straight to an idle receiver's socket (Outbox.direct),
    so the receiver's writer task never has to send them."""
    a, b = await NativeClient.several(router, 2)
    await a.connect("g", b"A")
    await b.connect("g", b"B")
    conn_b = next(c for c in router.connections
                  if c.session is not None and c.session.hub.table.holds(c.session, "g", b"B"))
    parked_before = conn_b.lot.task
    for i in range(50):
        await a.send(wire.Route("g", b"B", b"A", b"%d" % i))
        assert await b.recv() == wire.Route("g", b"B", b"A", b"%d" % i)
    # B's writer task was never needed: nobody ever parked on its lot.
    assert parked_before is None and conn_b.lot.task is None
