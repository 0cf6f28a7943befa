"""The router speaking the JGroups 2.12 and 5.x GossipRouter protocols over real sockets.

Test names carry the number of the black-box scenario they pin (reference notes §6, items
1-30; ``bbNN``); docs/jgroups.md lists the scenarios that do not apply here and why. The
clients are the raw ones of tests/jgroups_clients.py; real JGroups JVMs are in tests/interop.
"""

from __future__ import annotations

import trio
import trio.testing

from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol import native as wire
from gossiprouter.protocol.jgroups_address import JAddress
from gossiprouter.server.listener import Server
from tests.conftest import RouterFactory
from tests.jgroups_clients import (
    V2,
    V5,
    J2Client,
    J5Client,
    capture_streams,
    ip,
    j5_registrations_settled,
    load_steps,
    replay,
    uuid,
)
from tests.nclient import NativeClient
from tests.quiet import nothing_more

A2, B2, C2 = uuid(1, V2), uuid(2, V2), uuid(3, V2)
A5, B5, C5 = uuid(1, V5), uuid(2, V5), uuid(3, V5)


async def _j2(router: Server) -> J2Client:
    assert router.address is not None
    return await J2Client.open(*router.address)


async def _j5(router: Server) -> J5Client:
    assert router.address is not None
    return await J5Client.open(*router.address)


async def _settle() -> None:
    """Let the in-process router handle everything already sent."""
    await trio.testing.wait_all_tasks_blocked(0.01)


async def _j5_member(router: Server, group: str, addr: JAddress, name: str) -> J5Client:
    c = await _j5(router)
    await c.register(group, addr, name, ip(7800, V5))
    await c.sync()
    return c


async def _j2_member(router: Server, group: str, addr: JAddress, name: str) -> J2Client:
    c = await _j2(router)
    assert (await c.connect(group, addr, name, [ip(7800, V2)])).ok
    return c


# =========================================================================== JGroups 5.x


async def test_bb01_bb30_j5_register_and_per_group_query(router: Server) -> None:
    """1, 30. REGISTER (no reply); a per-group GET_MBRS answers GET_MBRS_RSP (type 3, which
    every 3.6.5+ client accepts) with each member's exact address, name and physical address."""
    a = await _j5(router)
    b = await _j5(router)
    await a.register("demo", A5, "A", ip(7800, V5))
    await b.register("demo", B5, "B", ip(7801, V5))
    await a.sync()
    await b.sync()
    await nothing_more(a, 0.05)  # REGISTER has no reply
    [reply] = await a.get_members("demo")
    assert reply == j5.MembersReply("demo", (
        j5.Member(A5, "A", ip(7800, V5)), j5.Member(B5, "B", ip(7801, V5))), last=False)
    # The frame itself: type 3, router flags 01, mbrs null.
    await a.send_raw(j5.get_members("demo"))
    raw = b""
    with trio.fail_after(5):
        while len(raw) < 4 or len(raw) < 4 + int.from_bytes(raw[:4], "big"):
            raw += await a.stream.receive_some(65536)
    assert raw == j5.get_members_reply("demo", reply.members, last=False)
    assert raw[4] == j5.GET_MBRS_RSP


async def test_bb14_j5_unknown_group_and_all_groups(router: Server) -> None:
    """14. Unknown group: an empty GET_MBRS_RSP (5.5.6 sends nothing). Group null: one type-3
    frame per group named ``<<all-groups>>:G``, the last one GET_MBRS_RSP_LAST; with no group
    at all, one empty LAST frame."""
    q = await _j5(router)
    assert await q.get_members(None) == [j5.MembersReply("<<all-groups>>", (), last=True)]
    assert await q.get_members("nosuchgroup") == [j5.MembersReply("nosuchgroup", (), False)]
    keep = [await _j5_member(router, "demo", A5, "A"),  # (closed when collected)
            await _j5_member(router, "other", C5, "C"),
            await _j5_member(router, "demo", B5, "B")]
    replies = await q.get_members(None)
    assert [(r.group, [m.name for m in r.members], r.last) for r in replies] == [
        ("<<all-groups>>:demo", ["A", "B"], False),
        ("<<all-groups>>:other", ["C"], True),
    ]
    del keep


async def test_bb02_bb18_j5_unicast_and_multicast_forwarded_unchanged(router: Server) -> None:
    """2, 18. A unicast reaches only its destination and a multicast every member, the sender
    included, as the exact frame bytes received."""
    a = await _j5_member(router, "demo", A5, "A")
    b = await _j5_member(router, "demo", B5, "B")
    c = await _j5_member(router, "demo", C5, "C")
    uni = await a.message("demo", B5, A5, b"\xca\xfe")
    assert await b.recv() == j5.Message("demo", B5, A5, uni, len(uni) - 2)
    mc = await a.message("demo", None, A5, b"\x01\x02\x03")
    for x in (a, b, c):
        ev = await x.recv()
        assert isinstance(ev, j5.Message) and ev.raw == mc, ev
    await nothing_more(c, 0.05)


async def test_bb12_j5_heartbeat_echoed_exactly(router: Server) -> None:
    """12. HEARTBEAT is echoed with the exact bytes (any valid encoding of it)."""
    c = await _j5(router)
    hb = bytes.fromhex("0000000c050001010000000100000000")
    await c.send_raw(hb)
    ev = await c.recv()
    assert ev == j5.Heartbeat(hb)
    # A HEARTBEAT carrying a group and a payload is echoed as is, too.
    body = bytes([j5.HEARTBEAT]) + b"\x01\x00\x01x" + b"\x01\x01" + b"\x00\x00\x00\x01" \
        + b"\x00\x00\x00\x02hi"
    odd = len(body).to_bytes(4, "big") + body
    await c.send_raw(odd)
    assert await c.recv() == j5.Heartbeat(odd)


async def test_bb12_bb20_j5_idle_client_closed_heartbeating_kept(
    start_router: RouterFactory,
) -> None:
    """12, 20. With idle_timeout, a silent (e.g. half-open) client is closed with the -5 marker
    and its member suspected; a client sending HEARTBEATs stays."""
    router = await start_router(idle_timeout=0.6)
    silent = await _j5_member(router, "demo", A5, "A")
    alive = await _j5_member(router, "demo", B5, "B")
    with trio.fail_after(5):
        ev = None
        while not isinstance(ev, j5.Suspect):
            await trio.sleep(0.2)
            await alive.send_raw(j5.heartbeat())
            ev = await alive.recv()
    assert ev == j5.Suspect("demo", A5)
    assert await silent.recv_until_closed() == [j5.CloseMarker()]
    assert [m.name for m in (await alive.get_members("demo"))[0].members] == ["B"]


async def test_bb03_j5_unregister(router: Server) -> None:
    """3. UNREGISTER (no reply): the query shows only B; a unicast to A is dropped (counted,
    no reply); nobody is suspected."""
    a = await _j5_member(router, "demo", A5, "A")
    b = await _j5_member(router, "demo", B5, "B")
    await a.unregister("demo", A5)
    await a.sync()
    assert [m.name for m in (await b.get_members("demo"))[0].members] == ["B"]
    before = router.hub.counters.drops.get("unknown_destination", 0)
    await b.message("demo", A5, B5, b"x")
    await b.sync()
    assert router.hub.counters.drops.get("unknown_destination", 0) == before + 1
    await nothing_more(a, 0.05)
    await nothing_more(b, 0.05)


async def test_bb04_j5_reregister_in_another_group(router: Server) -> None:
    """4. Register in G1, unregister, register in G2, on the same connection and on a new one."""
    a = await _j5_member(router, "g1", A5, "A")
    await a.unregister("g1", A5)
    await a.register("g2", A5, "A", ip(7800, V5))
    await a.sync()
    assert (await a.get_members("g1"))[0].members == ()
    assert [m.name for m in (await a.get_members("g2"))[0].members] == ["A"]
    await a.unregister("g2", A5)
    await a.sync()
    n = await _j5_member(router, "g3", A5, "A")
    assert [m.name for m in (await n.get_members("g3"))[0].members] == ["A"]
    b = await _j5_member(router, "g3", B5, "B")
    await b.message("g3", None, B5, b"hi")
    assert isinstance(await n.recv(), j5.Message)


async def test_bb05_j5_abrupt_close_suspects(router: Server) -> None:
    """5. A connection closed without UNREGISTER: the others get SUSPECT(group, A); the query
    no longer lists A."""
    a = await _j5_member(router, "demo", A5, "A")
    b = await _j5_member(router, "demo", B5, "B")
    await a.aclose()
    ev = await b.recv()
    assert ev == j5.Suspect("demo", A5)
    raw = j5.suspect("demo", A5)
    assert raw == bytes.fromhex("00000022" "06" "01" "0004") + b"demo" + A5.raw \
        + bytes.fromhex("01" "00" "0000" "01" "00000000")
    assert [m.name for m in (await b.get_members("demo"))[0].members] == ["B"]


async def test_bb06_bb21_j5_close_marker(router: Server) -> None:
    """6, 21. The -5 marker closes the connection: after UNREGISTER nobody is suspected (as
    JGroups TUNNEL does it); what is still registered is suspected (as 5.5.6 does)."""
    a = await _j5_member(router, "demo", A5, "A")
    b = await _j5_member(router, "demo", B5, "B")
    c = await _j5_member(router, "demo", C5, "C")
    await a.unregister("demo", A5)
    await a.send_raw(j5.close_marker())
    assert await a.recv_until_closed() == []  # the router closes; no marker back
    await nothing_more(b, 0.1)
    await c.send_raw(j5.close_marker())
    assert await c.recv_until_closed() == []
    assert await b.recv() == j5.Suspect("demo", C5)


async def test_bb17_j5_bad_frames_skipped_in_sync(router: Server) -> None:
    """17. A 0-length frame, an unknown type, a type only the router sends, trailing bytes and
    a garbage body are each skipped and counted; the connection stays in sync and usable."""
    c = await _j5_member(router, "demo", A5, "A")
    bad = [
        b"",
        bytes([9]) + j5.heartbeat()[5:],
        j5.suspect("demo", B5)[4:],
        j5.heartbeat()[4:] + b"\x00\x00",
        b"GET / HTTP/1.0\r\n\r\n",
        bytes([j5.MESSAGE]) + b"\x01\x00\x04demo\x01\x02" + A5.raw[1:] + b"\x00\x00\x00\x09ab",
    ]
    before = router.hub.counters.drops.get("malformed", 0)
    await c.send_raw(b"".join(len(b).to_bytes(4, "big") + b for b in bad))
    await c.sync()
    # suspect() from a client is unexpected rather than malformed
    assert router.hub.counters.drops.get("malformed", 0) == before + len(bad) - 1
    assert [m.name for m in (await c.get_members("demo"))[0].members] == ["A"]


async def test_bb13_j5_oversize_frame_refused_before_register(
        start_router: RouterFactory) -> None:
    """13. Before its first REGISTER a connection may not send more than preauth_max_frame: a
    longer prefix closes it at once (-5, before any body byte is sent). A negative length other
    than -5 closes a registered connection too (the stream cannot be resynchronised)."""
    router = await start_router(preauth_max_frame=1024)
    a = await _j5(router)
    await a.send_raw((1025).to_bytes(4, "big"))  # only the prefix: refused without the body
    assert await a.recv_until_closed() == [j5.CloseMarker()]
    assert router.hub.counters.partial_bytes == 0
    b = await _j5_member(router, "demo", B5, "B")
    c = await _j5_member(router, "demo", C5, "C")
    await c.send_raw(b"\xff\xff\xff\xf0")
    assert await c.recv_until_closed() == [j5.CloseMarker()]
    assert await b.recv() == j5.Suspect("demo", C5)


async def test_bb16_j5_two_addresses_on_one_connection_both_suspected(router: Server) -> None:
    """16. One connection registers two addresses in one group and closes: both are removed and
    suspected (5.5.6 removes only one)."""
    a = await _j5(router)
    await a.register("demo", A5, "A")
    await a.register("demo", C5, "C")
    await a.sync()
    b = await _j5_member(router, "demo", B5, "B")
    await a.aclose()
    got = {await b.recv(), await b.recv()}
    assert got == {j5.Suspect("demo", A5), j5.Suspect("demo", C5)}
    assert [m.name for m in (await b.get_members("demo"))[0].members] == ["B"]


async def test_bb15_j5_duplicate_registration(router: Server) -> None:
    """15. The same address registered from a second connection: the newest carries its
    traffic; the old connection stays open; its later close neither removes nor suspects the
    member."""
    old = await _j5_member(router, "demo", A5, "A")
    new = await _j5_member(router, "demo", A5, "A")
    b = await _j5_member(router, "demo", B5, "B")
    await b.message("demo", A5, B5, b"to-a")
    assert isinstance(await new.recv(), j5.Message)
    await nothing_more(old, 0.05)
    await old.aclose()
    await nothing_more(b, 0.1)
    assert [m.name for m in (await b.get_members("demo"))[0].members] == ["A", "B"]
    await b.message("demo", A5, B5, b"again")
    assert isinstance(await new.recv(), j5.Message)


async def test_bb24_j5_sender_not_registered_dropped(router: Server) -> None:
    """24. A MESSAGE whose sender is not registered in that group on this connection is
    dropped and counted (JGroups routes it)."""
    a = await _j5_member(router, "demo", A5, "A")
    stranger = await _j5(router)
    before = router.hub.counters.drops.get("not_member", 0)
    await stranger.message("demo", None, C5, b"spam")
    await stranger.message("demo", A5, C5, b"spam")
    await stranger.message("demo", A5, None, b"spam")
    await stranger.sync()
    assert router.hub.counters.drops.get("not_member", 0) == before + 3
    await nothing_more(a, 0.05)


async def test_bb25_unicast_to_a_member_of_another_group_dropped(router: Server) -> None:
    """25. Lookups are per group: a unicast into G1 for a member of G2 is dropped."""
    a = await _j5_member(router, "g1", A5, "A")
    b = await _j5_member(router, "g2", B5, "B")
    await a.message("g1", B5, A5, b"x")
    await a.sync()
    await nothing_more(b, 0.05)
    a2 = await _j2_member(router, "g1", A2, "A")
    b2 = await _j2_member(router, "g2", B2, "B")
    await a2.message("g1", B2, b"x")
    await nothing_more(b2, 0.1)


async def test_bb19_j5_fragmented_and_coalesced(router: Server) -> None:
    """19. Frames split into 1-byte segments, and many frames in one segment."""
    a = await _j5_member(router, "demo", A5, "A")
    b = await _j5(router)
    frames = j5.register("demo", B5, "B", ip(7801, V5)) + j5.heartbeat()
    for i in range(len(frames)):
        await b.send_raw(frames[i : i + 1])
    assert isinstance(await b.recv(), j5.Heartbeat)
    msgs = [j5.message("demo", B5, A5, bytes([i]) * (i + 1)) for i in range(200)]
    await a.send_raw(b"".join(msgs))
    got = [await b.recv() for _ in msgs]
    assert [g.raw for g in got if isinstance(g, j5.Message)] == msgs
    # One message split byte by byte, between two others.
    m = j5.message("demo", None, A5, b"split")
    await a.send_raw(msgs[0] + m[:1])
    for i in range(1, len(m)):
        await a.send_raw(m[i : i + 1])
    assert [(await b.recv()), (await b.recv())] == [
        j5.Message("demo", B5, A5, msgs[0], len(msgs[0]) - 1),
        j5.Message("demo", None, A5, m, len(m) - 5),
    ]


async def test_bb22_j5_address_kinds_listed_and_routed(router: Server) -> None:
    """22. ExtendedUUID, FlagsUUID, SiteUUID and IpAddress members: listed and suspected with
    their exact bytes, routed by their identity (an ExtendedUUID equals the plain UUID)."""
    u = A5.raw[1:]  # lsb, msb
    ext = JAddress.parse(b"\x00\x00\x0c" + u + b"\x00" + b"\x01" + b"\x04site" + b"\x01x",
                         version=V5)
    flags = JAddress.parse(b"\x00\x00\x13" + B5.raw[1:] + b"\x01\x03", version=V5)
    site = JAddress.parse(b"\x04" + C5.raw[1:] + b"\x00\x00" + b"\x01\x00\x02s1" + b"\x00",
                          version=V5)
    ipa = ip(9000, V5)
    assert ext is not None and flags is not None and site is not None
    clients = {}
    for addr, name in ((ext, "E"), (flags, "F"), (site, "S"), (ipa, "I")):
        clients[name] = await _j5_member(router, "k", addr, name)
    [rep] = await clients["E"].get_members("k")
    assert [(m.addr.raw, m.name) for m in rep.members if m.addr is not None] == [
        (ext.raw, "E"), (flags.raw, "F"), (site.raw, "S"), (ipa.raw, "I")]
    # Routed: to the ExtendedUUID member by its plain UUID; from the SiteUUID member.
    frame = await clients["S"].message("k", A5, site, b"to-e")
    ev = await clients["E"].recv()
    assert isinstance(ev, j5.Message) and ev.raw == frame
    frame = await clients["I"].message("k", None, ipa, b"all")
    for c in clients.values():
        ev = await c.recv()
        assert isinstance(ev, j5.Message) and ev.raw == frame
    await clients["E"].aclose()
    assert await clients["F"].recv() == j5.Suspect("k", ext)


async def test_bb23_non_ascii_and_long_names(start_router: RouterFactory) -> None:
    """23. Non-ASCII (modified UTF-8: NUL, non-BMP) and long group and logical names (longer
    than the default max_group_bytes / max_name_bytes, which this router raises)."""
    router = await start_router(max_group_bytes=4096, max_name_bytes=2048)
    group = "grüppe-\x00-\U0001f600-" + "x" * 3000
    name = "nœud-\U0001f680" * 100
    a = await _j5_member(router, group, A5, name)
    [rep] = await a.get_members(group)
    assert rep.group == group and [m.name for m in rep.members] == [name]
    frame = await a.message(group, None, A5, b"hello")
    ev = await a.recv()
    assert isinstance(ev, j5.Message) and ev.raw == frame
    c2 = await _j2_member(router, group, A2, name)
    [m] = await c2.gossip_get(group)
    assert m.name == name
    await c2.message(group, None, b"hi")
    assert await c2.recv() == j2.Message(None, None, b"hi")


# =========================================================================== JGroups 2.12


async def test_bb29_j2_connect_ok_is_the_first_byte(router: Server) -> None:
    """29. CONNECT is answered by the single byte 0e, before any routed message, even while
    the group is being flooded with multicasts."""
    a = await _j2_member(router, "demo", A2, "A")
    flood = j2.message("demo", None, b"z" * 50) * 200
    async with trio.open_nursery() as n:
        n.start_soon(a.send_raw, flood * 5)
        b = await _j2(router)
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
    a = await _j2_member(router, "demo", A2, "A")
    b = await _j2(router)
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
    c = await _j2(router)
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
    a = await _j2_member(router, "demo", A2, "A")
    b = await _j2_member(router, "demo", B2, "B")
    c = await _j2_member(router, "demo", C2, "C")
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
    a = await _j2_member(router, "demo", A2, "A")
    b = await _j2_member(router, "demo", B2, "B")
    await a.send_raw(j2.disconnect("demo", A2))
    with trio.fail_after(5):
        assert await a.stream.receive_some(65536) == bytes.fromhex("10000100ffffffff00")
    assert [m.name for m in await b.gossip_get("demo")] == ["B"]
    await a.aclose()
    await nothing_more(b, 0.1)


async def test_bb05_j2_abrupt_close_suspect_with_trailing_address(router: Server) -> None:
    """5, 29. An abrupt close (no CLOSE) sends SUSPECT with the trailing address to the rest."""
    a = await _j2_member(router, "demo", A2, "A")
    b = await _j2_member(router, "demo", B2, "B")
    await a.aclose()
    with trio.fail_after(5):
        got = await b.stream.receive_some(65536)
    assert got == bytes.fromhex("0b000100ffffffff00") + A2.raw  # 27 bytes, §1.5.5
    assert [m.name for m in await b.gossip_get("demo")] == ["B"]


async def test_bb06_bb29_j2_close_removes_without_suspect(router: Server) -> None:
    """6, 29. CLOSE removes every address of the connection (several groups) without SUSPECT,
    then the router closes the connection."""
    a = await _j2(router)
    assert (await a.connect("demo", A2, "A")).ok
    assert (await a.connect("other", A2, "A")).ok
    b = await _j2_member(router, "demo", B2, "B")
    c = await _j2_member(router, "other", C2, "C")
    await a.send_raw(j2.close())
    assert await a.recv_until_closed() == []
    await nothing_more(b, 0.1)
    await nothing_more(c, 0.05)
    assert [m.name for m in await b.gossip_get("demo")] == ["B"]
    assert [m.name for m in await c.gossip_get("other")] == ["C"]


async def test_bb29_j2_ping_accepted_without_reply(router: Server) -> None:
    """29. PING: no reply; the connection stays usable."""
    a = await _j2_member(router, "demo", A2, "A")
    await a.send_raw(j2.ping() * 3)
    await nothing_more(a, 0.1)
    assert [m.name for m in await a.gossip_get("demo")] == ["A"]


async def test_bb15_j2_reconnect_on_new_connection(router: Server) -> None:
    """15. The same address CONNECTs on a new connection (a client reconnecting before the
    router noticed): no SUSPECT to anyone (2.12 suspects it to itself), traffic goes to the new
    connection, and the old connection's death changes nothing."""
    old = await _j2_member(router, "demo", A2, "A")
    b = await _j2_member(router, "demo", B2, "B")
    new = await _j2_member(router, "demo", A2, "A")
    await nothing_more(new, 0.05)
    await b.message("demo", A2, b"hi")
    assert await new.recv() == j2.Message(None, A2, b"hi")
    await old.aclose()
    await nothing_more(b, 0.1)
    await nothing_more(new, 0.05)
    assert [m.name for m in await b.gossip_get("demo")] == ["A", "B"]
    # CLOSE from a connection whose address a newer one also holds removes nothing either.
    newest = await _j2_member(router, "demo", A2, "A")
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
        c = await _j2(router)
        assert await c.connect(group, addr) == j2.ConnectReply(j2.OP_FAIL)
        assert await c.recv_until_closed() == []
    c = await _j2_member(router, "demo", A2, "A")
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
    t = await _j2_member(router, "k", topo, "T")
    e = await _j2_member(router, "k", extra, "E")
    i = await _j2_member(router, "k", ipa, "I")
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
    a = await _j2_member(router, "demo", A2, "A")
    stranger = await _j2(router)
    before = router.hub.counters.drops.get("not_member", 0)
    await stranger.message("demo", None, b"spam")
    await stranger.message("demo", A2, b"spam")
    await _settle()
    assert router.hub.counters.drops.get("not_member", 0) == before + 2
    await nothing_more(a, 0.05)


async def test_bb17_j2_bad_input_closes_only_that_connection(router: Server) -> None:
    """17. A 2.12 object that does not parse closes that connection (the stream cannot be
    resynchronised); other clients are unaffected. Unknown types are parsed and ignored."""
    a = await _j2_member(router, "demo", A2, "A")
    b = await _j2_member(router, "demo", B2, "B")
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
    a = await _j2(router)
    await a.send_raw(j2.message("demo", None, b"x" * 10)[:-14] + (1 << 30).to_bytes(4, "big"))
    assert await a.recv_until_closed() == []
    assert router.hub.counters.partial_bytes == 0


async def test_bb13_j2_oversize_message_skipped_after_connect(
        start_router: RouterFactory) -> None:
    """13. After CONNECT, a message above jgroups_max_frame is skipped as it streams past
    (its buffer length is known from its header), counted; the connection stays in sync and
    the next message is routed. 2.12's other objects have no length: they cannot be skipped."""
    router = await start_router(jgroups_max_frame=4096)
    a = await _j2_member(router, "demo", A2, "A")
    b = await _j2_member(router, "demo", B2, "B")
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
    a = await _j2(router)
    data = j2.connect("demo", A2, "A", [ip(7800, V2)])
    a.decoder.expect_connect_reply()
    for i in range(len(data)):
        await a.send_raw(data[i : i + 1])
    assert await a.recv() == j2.ConnectReply(j2.CONNECT_OK)
    b = await _j2_member(router, "demo", B2, "B")
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


async def test_bb10_j2_twenty_thousand_multicasts_return(router: Server) -> None:
    """10. 20,000 back-to-back multicasts from one client all come back to it, in order."""
    a = await _j2_member(router, "demo", A2, "A")
    b = await _j2_member(router, "demo", B2, "B")
    count = 20_000
    msgs = [j2.message("demo", None, i.to_bytes(4, "big") + b"." * 60) for i in range(count)]

    async def send() -> None:
        for i in range(0, count, 500):
            await a.send_raw(b"".join(msgs[i : i + 500]))

    async def drain(c: J2Client) -> list[int]:
        seen: list[int] = []
        while len(seen) < count:
            ev = await c.recv(timeout=10)
            assert isinstance(ev, j2.Message)
            seen.append(int.from_bytes(ev.payload[:4], "big"))
        return seen

    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            n.start_soon(send)
            got_a = await drain(a)
            got_b = await drain(b)
    assert got_a == list(range(count)) == got_b


async def test_bb10_j5_twenty_thousand_multicasts_return(router: Server) -> None:
    """10. The same for 5.x (frames forwarded unchanged)."""
    a = await _j5_member(router, "demo", A5, "A")
    count = 20_000
    msgs = [j5.message("demo", None, A5, i.to_bytes(4, "big") + b"." * 60)
            for i in range(count)]

    async def send() -> None:
        for i in range(0, count, 500):
            await a.send_raw(b"".join(msgs[i : i + 500]))

    seen: list[bytes] = []
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            n.start_soon(send)
            while len(seen) < count:
                ev = await a.recv(timeout=10)
                assert isinstance(ev, j5.Message)
                seen.append(ev.raw)
    assert seen == msgs


async def test_bb11_slow_member_does_not_stop_the_group(start_router: RouterFactory) -> None:
    """11. Under jgroups_slow_consumer_policy disconnect, a member that stops reading is cut
    off when its queue is full; the other members' multicasts keep flowing (JGroups' default
    blocks the whole group). The default, drop, is in tests/test_jgroups_limits.py."""
    router = await start_router(max_frame=64 * 1024, outbound_queue_bytes=256 * 1024,
                                jgroups_slow_consumer_policy="disconnect")
    a = await _j2_member(router, "demo", A2, "A")
    stalled = await _j2_member(router, "demo", B2, "B")
    c = await _j2_member(router, "demo", C2, "C")
    payload = b"p" * 60_000
    received = 0

    async def reader() -> None:
        nonlocal received
        while received < 100:
            ev = await c.recv(timeout=10)
            if isinstance(ev, j2.Message):
                received += 1

    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            n.start_soon(reader)
            for _ in range(100):
                await a.message("demo", None, payload)
                # a reads its own copies too, so only the stalled member falls behind
                while True:
                    ev = await a.recv(timeout=10)
                    if isinstance(ev, j2.Message):
                        break
    assert received == 100
    assert router.hub.counters.slow_consumer_disconnects >= 1
    assert [m.name for m in await c.gossip_get("demo")] == ["A", "C"]
    del stalled


async def test_bb21_bb26_shutdown_closes_jgroups_clients(start_router: RouterFactory) -> None:
    """21, 26. Shutdown: 5.x clients get the -5 marker, 2.12 clients a plain close; nobody is
    told SUSPECT while everyone is being closed."""
    router = await start_router(shutdown_timeout=1.0)
    a5 = await _j5_member(router, "demo", A5, "A")
    b5 = await _j5_member(router, "demo", B5, "B")
    a2 = await _j2_member(router, "demo", A2, "A")
    router.shutdown()
    assert await a5.recv_until_closed() == [j5.CloseMarker()]
    assert await b5.recv_until_closed() == [j5.CloseMarker()]
    assert await a2.recv_until_closed() == []
    with trio.fail_after(5):
        await router.wait_closed()


async def test_bb28_connection_storm(router: Server) -> None:
    """28. Hundreds of 2.12 and 5.x clients connecting at once all register."""
    n = 150
    done: list[J2Client | J5Client] = []

    async def one2(i: int) -> None:
        c = await _j2(router)
        assert (await c.connect("storm", uuid(100 + i, V2), f"n{i}")).ok
        done.append(c)

    async def one5(i: int) -> None:
        c = await _j5(router)
        await c.register("storm", uuid(100 + i, V5), f"n{i}")
        await c.sync()
        done.append(c)

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(one2, i)
                nursery.start_soon(one5, i)
    assert len(router.hub.table.members("jgroups2:storm")) == n
    assert len(router.hub.table.members("jgroups5:storm")) == n
    for c in done:
        await c.aclose()


# =========================================================================== golden replays


async def test_bb18_replay_2_12_capture(router: Server) -> None:
    """18. The client side of the 2.12 stub capture (cap212.log) replayed with its exact
    segmentation: every connection receives the bytes the real 2.12 router sent, except the
    SUSPECT 2.12 writes to the connection that just died (it was already closed)."""
    assert router.address is not None
    steps = load_steps("cap212.log")
    got = await replay(*router.address, steps)
    expected = capture_streams(steps)
    self_suspect = bytes.fromhex("0b000100ffffffff00") + JAddress.from_uuid(
        0x0102030405060708, 0x1112131415161718, version=V2).raw
    assert expected["conn1"].endswith(self_suspect)
    assert got["conn1"] == expected["conn1"][: -len(self_suspect)]
    assert got["conn2"] == expected["conn2"]


async def test_bb18_replay_2_12_tunnel_capture(router: Server) -> None:
    """18. The real 2.12 TUNNEL channels' traffic (captun212.log): identical replies."""
    assert router.address is not None
    steps = load_steps("captun212.log")
    assert await replay(*router.address, steps) == capture_streams(steps)


async def test_bb18_bb30_replay_5_5_6_capture(router: Server) -> None:
    """18, 30. The 5.5.6 stub capture (cap556.log) replayed: identical bytes except the
    deliberate differences: per-group replies are type 3 (not 7), the unknown group gets an
    empty reply (not silence), and the all-groups replies come in registration order."""
    assert router.address is not None
    steps = load_steps("cap556.log")
    # conn1's replies deliberately differ from the capture's bytes: not waited on by count
    # (its requests are answered in order on its own connection; the router's close is).
    got = await replay(*router.address, steps, wait_on={"conn2", "conn3"},
        settled=j5_registrations_settled(router.hub.table, steps),
    )
    expected = capture_streams(steps)
    assert got["conn2"] == expected["conn2"]
    assert got["conn3"] == expected.get("conn3", b"")
    dec = j5.Decoder()
    dec.feed(expected["conn1"])
    real = []
    while (ev := dec.next_event()) is not None:
        real.append(ev)
    demo7, other3, all7, mcast, hb = real
    assert isinstance(demo7, j5.MembersReply) and isinstance(other3, j5.MembersReply)
    assert isinstance(all7, j5.MembersReply) and isinstance(mcast, j5.Message)
    assert isinstance(hb, j5.Heartbeat)
    ours = b"".join([
        j5.get_members_reply("demo", demo7.members, last=False),
        j5.get_members_reply("nosuchgroup", (), last=False),
        j5.get_members_reply("<<all-groups>>:demo", all7.members, last=False),
        j5.get_members_reply("<<all-groups>>:other", other3.members, last=True),
        mcast.raw,
        hb.raw,
    ])
    assert got["conn1"] == ours


async def test_bb18_replay_5_5_6_tunnel_capture(router: Server) -> None:
    """18. The real 5.5.6 TUNNEL channels' traffic (captun556.log): identical bytes."""
    assert router.address is not None
    steps = load_steps("captun556.log")
    settled = j5_registrations_settled(router.hub.table, steps)
    assert await replay(*router.address, steps, settled=settled) == capture_streams(steps)


# =========================================================================== namespaces


async def test_namespaces_native_may_list_and_watch_not_join(router: Server) -> None:
    """JGroups groups are ``jgroups2:G`` / ``jgroups5:G`` in the table: a native client lists
    and watches them (join/leave events, names, physical addresses) but may not CONNECT."""
    assert router.address is not None
    n = await NativeClient.open(*router.address)
    assert await n.request(wire.Watch(n.req(), "jgroups5:demo")) == wire.Ok(1)
    a = await _j5_member(router, "demo", A5, "A")
    ev = await n.recv()
    assert ev == wire.Event("jgroups5:demo", "join", A5.key, "A", (("127.0.0.1", 7800),))
    b = await _j2_member(router, "demo", B2, "B")
    reply = await n.request(wire.GetMembers(n.req(), "jgroups2:demo"))
    assert reply == wire.Ok(reply.req, (wire.MemberInfo(B2.key, "B", (("127.0.0.1", 7800),)),)) \
        if isinstance(reply, wire.Ok) else False
    err = await n.connect("jgroups2:demo", b"N")
    assert isinstance(err, wire.Error) and err.code == "forbidden"
    await a.aclose()
    assert (await n.recv()) == wire.Event("jgroups5:demo", "leave", A5.key, "A",
                                          (("127.0.0.1", 7800),))
    await n.aclose()
    await b.aclose()


async def test_namespaces_2_12_and_5_x_do_not_see_each_other(router: Server) -> None:
    """A 2.12 and a 5.x client in the same group name are in different groups: no member
    lists, messages or SUSPECTs cross."""
    a2 = await _j2_member(router, "demo", A2, "A")
    b5 = await _j5_member(router, "demo", B5, "B")
    assert [m.name for m in await a2.gossip_get("demo")] == ["A"]
    assert [m.name for m in (await b5.get_members("demo"))[0].members] == ["B"]
    await a2.message("demo", None, b"from-2")
    assert await a2.recv() == j2.Message(None, None, b"from-2")
    await b5.message("demo", None, B5, b"from-5")
    assert isinstance(await b5.recv(), j5.Message)
    await nothing_more(a2, 0.05)
    await a2.aclose()
    await nothing_more(b5, 0.1)


async def test_suspect_events_off(start_router: RouterFactory) -> None:
    """``--no-suspect-events``: no SUSPECT to JGroups members either."""
    router = await start_router(suspect_events=False)
    a = await _j5_member(router, "demo", A5, "A")
    b = await _j5_member(router, "demo", B5, "B")
    a2 = await _j2_member(router, "demo", A2, "A")
    b2 = await _j2_member(router, "demo", B2, "B")
    await a.aclose()
    await a2.aclose()
    await nothing_more(b, 0.1)
    await nothing_more(b2, 0.05)
