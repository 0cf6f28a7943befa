"""The router speaking the JGroups 2.12 GossipRouter protocol over real sockets: CONNECT,
GOSSIP_GET, forwarding re-wrapped, DISCONNECT, reconnects, refusals and bad input.
Test names carry their black-box scenario (``bbNN``: tests/test_jgroups_router.py).
"""

from __future__ import annotations

import trio
import trio.testing

from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol.jgroups_address import JAddress
from gossiprouter.server.listener import Server
from tests.conftest import RouterFactory
from tests.jgroups_clients import (
    A2,
    B2,
    C2,
    V2,
    ip,
    j2_client,
    j2_member,
    settle,
)
from tests.quiet import nothing_more

# =========================================================================== JGroups 2.12


async def test_bb29_j2_connect_ok_is_the_first_byte(router: Server) -> None:
    """29. CONNECT is answered by the single byte 0e, before any routed message, even while
    the group is being flooded with multicasts."""
    a = await j2_member(router, "demo", A2, "A")
    flood = j2.message("demo", None, b"z" * 50) * 200
    async with trio.open_nursery() as n:
        n.start_soon(a.send_raw, flood * 5)
        b = await j2_client(router)
        await b.send_raw(j2.connect("demo", B2, "B", [ip(7801, V2)]))
        with trio.fail_after(5):
            first = await b.stream.receive_some(1)
        assert first == b"\x0e"
    # What follows on b are whole multicasts (group null), nothing else.
    with trio.move_on_after(0.3):
        while True:
            ev = await b.recv(timeout=1)
            assert ev == j2.Message(None, None, b"z" * 50), ev


async def test_bb01_bb14_j2_gossip_get(router: Server) -> None:
    """1, 14, 29. GOSSIP_GET: a raw short count + PingData per member (own address, name,
    physical list, is_server), written as one block; an unknown group gets ``0000``."""
    a = await j2_member(router, "demo", A2, "A")
    b = await j2_client(router)
    assert (await b.connect("demo", B2, "B", [ip(7801, V2), ip(7802, V2, "::1")])).ok
    members = await a.gossip_get("demo")
    assert members == (
        j2.Member(A2, "A", (ip(7800, V2),)),
        j2.Member(B2, "B", (ip(7801, V2), ip(7802, V2, "::1"))),
    )
    await a.send_raw(j2.gossip_get("nosuchgroup"))
    with trio.fail_after(5):
        assert await a.stream.receive_some(2) == b"\x00\x00"
    # Byte layout of one entry (reference §1.5.3).
    c = await j2_client(router)
    await c.send_raw(j2.gossip_get("demo"))
    expected = j2.gossip_get_reply(list(members))
    got = b""
    with trio.fail_after(5):
        while len(got) < len(expected):
            got += await c.stream.receive_some(65536)
    assert got == expected
    assert got.startswith(b"\x00\x02" + A2.raw + b"\x00\x00\x01\x01\x00\x01A\x00\x01" +
                          ip(7800, V2).raw)


async def test_bb02_j2_unicast_and_multicast_rewrapped(router: Server) -> None:
    """2, 29. Unicast to B only; multicast to everyone, the sender included; the group is
    rewritten to null, the destination kept (reference §1.5.4 bytes)."""
    a = await j2_member(router, "demo", A2, "A")
    b = await j2_member(router, "demo", B2, "B")
    c = await j2_member(router, "demo", C2, "C")
    await a.message("demo", B2, b"\xca\xfe")
    got = await b.stream.receive_some(65536)
    assert got == bytes.fromhex("0a00") + B2.raw + bytes.fromhex("00ffffffff0100000002cafe")
    await a.message("demo", None, b"\x01\x02\x03")
    for x in (a, b, c):
        with trio.fail_after(5):
            assert await x.stream.receive_some(65536) == bytes.fromhex(
                "0a000100ffffffff0100000003010203")
    await nothing_more(c, 0.05)


async def test_bb29_j2_disconnect_ok(router: Server) -> None:
    """3, 29. DISCONNECT → DISCONNECT_OK (a full GossipData, all null); the member is gone; an
    abrupt close afterwards suspects nobody (2.12 would still send SUSPECT)."""
    a = await j2_member(router, "demo", A2, "A")
    b = await j2_member(router, "demo", B2, "B")
    await a.send_raw(j2.disconnect("demo", A2))
    with trio.fail_after(5):
        assert await a.stream.receive_some(65536) == bytes.fromhex("10000100ffffffff00")
    assert [m.name for m in await b.gossip_get("demo")] == ["B"]
    await a.aclose()
    await nothing_more(b, 0.1)


async def test_bb05_j2_abrupt_close_suspect_with_trailing_address(router: Server) -> None:
    """5, 29. An abrupt close (no CLOSE) sends SUSPECT with the trailing address to the rest."""
    a = await j2_member(router, "demo", A2, "A")
    b = await j2_member(router, "demo", B2, "B")
    await a.aclose()
    with trio.fail_after(5):
        got = await b.stream.receive_some(65536)
    assert got == bytes.fromhex("0b000100ffffffff00") + A2.raw  # 27 bytes, §1.5.5
    assert [m.name for m in await b.gossip_get("demo")] == ["B"]


async def test_bb06_bb29_j2_close_removes_without_suspect(router: Server) -> None:
    """6, 29. CLOSE removes every address of the connection (several groups) without SUSPECT,
    then the router closes the connection."""
    a = await j2_client(router)
    assert (await a.connect("demo", A2, "A")).ok
    assert (await a.connect("other", A2, "A")).ok
    b = await j2_member(router, "demo", B2, "B")
    c = await j2_member(router, "other", C2, "C")
    await a.send_raw(j2.close())
    assert await a.recv_until_closed() == []
    await nothing_more(b, 0.1)
    await nothing_more(c, 0.05)
    assert [m.name for m in await b.gossip_get("demo")] == ["B"]
    assert [m.name for m in await c.gossip_get("other")] == ["C"]


async def test_bb29_j2_ping_accepted_without_reply(router: Server) -> None:
    """29. PING: no reply; the connection stays usable."""
    a = await j2_member(router, "demo", A2, "A")
    await a.send_raw(j2.ping() * 3)
    await nothing_more(a, 0.1)
    assert [m.name for m in await a.gossip_get("demo")] == ["A"]


async def test_bb15_j2_reconnect_on_new_connection(router: Server) -> None:
    """15. The same address CONNECTs on a new connection (a client reconnecting before the
    router noticed): no SUSPECT to anyone (2.12 suspects it to itself), traffic goes to the new
    connection, and the old connection's death changes nothing."""
    old = await j2_member(router, "demo", A2, "A")
    b = await j2_member(router, "demo", B2, "B")
    new = await j2_member(router, "demo", A2, "A")
    await nothing_more(new, 0.05)
    await b.message("demo", A2, b"hi")
    assert await new.recv() == j2.Message(None, A2, b"hi")
    await old.aclose()
    await nothing_more(b, 0.1)
    await nothing_more(new, 0.05)
    assert [m.name for m in await b.gossip_get("demo")] == ["A", "B"]
    # CLOSE from a connection whose address a newer one also holds removes nothing either.
    newest = await j2_member(router, "demo", A2, "A")
    await new.send_raw(j2.close())
    assert await new.recv_until_closed() == []
    await nothing_more(b, 0.1)
    assert [m.name for m in await b.gossip_get("demo")] == ["A", "B"]
    await b.message("demo", A2, b"still")
    assert await newest.recv() == j2.Message(None, A2, b"still")


async def test_bb29_j2_connect_refusals(start_router: RouterFactory) -> None:
    """29. CONNECT without a group or an address: OP_FAIL (0f), then the connection is closed
    (2.12 closes without a word for a null address). CONNECT over a registration limit: OP_FAIL,
    and the connection stays usable (routing rule R14). GOSSIP_GET for group null: ``0000``
    (2.12 closes the connection)."""
    router = await start_router(addresses_per_connection=1)
    for group, addr in ((None, A2), ("demo", None)):
        c = await j2_client(router)
        assert await c.connect(group, addr) == j2.ConnectReply(j2.OP_FAIL)
        assert await c.recv_until_closed() == []
    c = await j2_member(router, "demo", A2, "A")
    assert await c.connect("demo", B2, "B") == j2.ConnectReply(j2.OP_FAIL)
    assert [m.name for m in await c.gossip_get("demo")] == ["A"]
    assert await c.gossip_get(None) == ()


async def test_bb22_j2_address_kinds(router: Server) -> None:
    """22. 2.12 TopologyUUID, UUID with additional data and IpAddress members: listed, routed
    (the header cache takes any address class) and suspected with their exact bytes."""
    topo = JAddress.parse(b"\x00\x00\x54" + A2.raw[1:17] + b"\x00" + b"\x01\x00\x02s1"
                          + b"\x00" + b"\x01\x00\x01m", version=V2)
    extra = JAddress.parse(b"\x02" + B2.raw[1:17] + b"\x01\x00\x03abc", version=V2)
    ipa = ip(9000, V2)
    assert topo is not None and extra is not None
    t = await j2_member(router, "k", topo, "T")
    e = await j2_member(router, "k", extra, "E")
    i = await j2_member(router, "k", ipa, "I")
    assert [(m.addr.raw if m.addr else b"", m.name) for m in await t.gossip_get("k")] == [
        (topo.raw, "T"), (extra.raw, "E"), (ipa.raw, "I")]
    for _ in range(3):  # the first through the decoder, then from the header cache
        await i.message("k", topo, b"to-t")
        assert await t.recv() == j2.Message(None, topo, b"to-t")
        await t.message("k", extra, b"to-e")
        assert await e.recv() == j2.Message(None, extra, b"to-e")
    await t.aclose()
    assert await e.recv() == j2.Suspect(topo)
    assert await i.recv() == j2.Suspect(topo)


async def test_bb24_j2_message_without_membership_dropped(router: Server) -> None:
    """24. 2.12 messages have no sender: a connection must have CONNECTed at least one address
    in the group to send into it; otherwise dropped and counted."""
    a = await j2_member(router, "demo", A2, "A")
    stranger = await j2_client(router)
    before = router.hub.counters.drops.get("not_member", 0)
    await stranger.message("demo", None, b"spam")
    await stranger.message("demo", A2, b"spam")
    await settle()
    assert router.hub.counters.drops.get("not_member", 0) == before + 2
    await nothing_more(a, 0.05)


async def test_bb17_j2_bad_input_closes_only_that_connection(router: Server) -> None:
    """17. A 2.12 object that does not parse closes that connection (the stream cannot be
    resynchronised); other clients are unaffected. Unknown types are parsed and ignored."""
    a = await j2_member(router, "demo", A2, "A")
    b = await j2_member(router, "demo", B2, "B")
    await a.send_raw(j2.encode_gossip_data(0x07, "demo"))  # unknown type: ignored
    assert [m.name for m in await a.gossip_get("demo")] == ["A", "B"]
    await a.send_raw(b"\x0a\x07garbage")  # bad presence byte for the group
    assert await a.recv_until_closed() == []
    assert await b.recv() == j2.Suspect(A2)
    # An empty MESSAGE is dropped (2.12 does too), the connection stays.
    await b.send_raw(j2.message("demo", None, b""))
    assert [m.name for m in await b.gossip_get("demo")] == ["B"]


async def test_bb13_j2_oversize_refused_before_connect(start_router: RouterFactory) -> None:
    """13. Before its first CONNECT, an object longer than preauth_max_frame (here a declared
    buffer length) closes the connection at once, before the bytes arrive."""
    router = await start_router(preauth_max_frame=4096)
    a = await j2_client(router)
    await a.send_raw(j2.message("demo", None, b"x" * 10)[:-14] + (1 << 30).to_bytes(4, "big"))
    assert await a.recv_until_closed() == []
    assert router.hub.counters.partial_bytes == 0


async def test_bb13_j2_oversize_message_skipped_after_connect(
        start_router: RouterFactory) -> None:
    """13. After CONNECT, a message above jgroups_max_frame is skipped as it streams past
    (its buffer length is known from its header), counted; the connection stays in sync and
    the next message is routed. 2.12's other objects have no length: they cannot be skipped."""
    router = await start_router(jgroups_max_frame=4096)
    a = await j2_member(router, "demo", A2, "A")
    b = await j2_member(router, "demo", B2, "B")
    big = j2.message("demo", B2, b"x" * 100_000)
    await a.send_raw(big[:50_000])
    await a.send_raw(big[50_000:] + j2.message("demo", B2, b"after"))
    assert await b.recv() == j2.Message(None, B2, b"after")
    assert router.hub.counters.drops.get("frame_too_large") == 1
    assert router.hub.counters.partial_bytes == 0
    assert [m.name for m in await b.gossip_get("demo")] == ["A", "B"]


async def test_bb19_j2_fragmented_and_coalesced(router: Server) -> None:
    """19. Objects in 1-byte segments (as the unbuffered 2.12 stream sends them), and many
    objects in one segment, mixed with PINGs and a GOSSIP_GET."""
    a = await j2_client(router)
    data = j2.connect("demo", A2, "A", [ip(7800, V2)])
    a.decoder.expect_connect_reply()
    for i in range(len(data)):
        await a.send_raw(data[i : i + 1])
    assert await a.recv() == j2.ConnectReply(j2.CONNECT_OK)
    b = await j2_member(router, "demo", B2, "B")
    msgs = [j2.message("demo", B2 if i % 3 else None, bytes([i % 256]) * (i % 50 + 1))
            for i in range(300)]
    await a.send_raw(b"".join(msgs[:150]) + j2.ping() + b"".join(msgs[150:]))
    expected = [j2.Message(None, B2 if i % 3 else None, bytes([i % 256]) * (i % 50 + 1))
                for i in range(300)]
    assert [await b.recv() for _ in expected] == expected
    m = j2.message("demo", B2, b"split")
    for i in range(len(m)):
        await a.send_raw(m[i : i + 1])
    assert await b.recv() == j2.Message(None, B2, b"split")
