"""The router speaking the JGroups 5.x GossipRouter protocol over real sockets: registration,
queries, forwarding, heartbeats, unregistering, closing and bad input.
Test names carry their black-box scenario (``bbNN``: tests/test_jgroups_router.py).
"""

from __future__ import annotations

import trio
import trio.testing

from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol.jgroups_address import JAddress
from gossiprouter.server.listener import Server
from tests.conftest import RouterFactory
from tests.jgroups_clients import (
    A2,
    A5,
    B2,
    B5,
    C5,
    V5,
    ip,
    j2_member,
    j5_client,
    j5_member,
)
from tests.quiet import nothing_more

# =========================================================================== JGroups 5.x


async def test_bb01_bb30_j5_register_and_per_group_query(router: Server) -> None:
    """1, 30. REGISTER (no reply); a per-group GET_MBRS answers GET_MBRS_RSP (type 3, which
    every 3.6.5+ client accepts) with each member's exact address, name and physical address."""
    a = await j5_client(router)
    b = await j5_client(router)
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
    q = await j5_client(router)
    assert await q.get_members(None) == [j5.MembersReply("<<all-groups>>", (), last=True)]
    assert await q.get_members("nosuchgroup") == [j5.MembersReply("nosuchgroup", (), False)]
    keep = [await j5_member(router, "demo", A5, "A"),  # (closed when collected)
            await j5_member(router, "other", C5, "C"),
            await j5_member(router, "demo", B5, "B")]
    replies = await q.get_members(None)
    assert [(r.group, [m.name for m in r.members], r.last) for r in replies] == [
        ("<<all-groups>>:demo", ["A", "B"], False),
        ("<<all-groups>>:other", ["C"], True),
    ]
    del keep


async def test_bb02_bb18_j5_unicast_and_multicast_forwarded_unchanged(router: Server) -> None:
    """2, 18. A unicast reaches only its destination and a multicast every member, the sender
    included, as the exact frame bytes received."""
    a = await j5_member(router, "demo", A5, "A")
    b = await j5_member(router, "demo", B5, "B")
    c = await j5_member(router, "demo", C5, "C")
    uni = await a.message("demo", B5, A5, b"\xca\xfe")
    assert await b.recv() == j5.Message("demo", B5, A5, uni, len(uni) - 2)
    mc = await a.message("demo", None, A5, b"\x01\x02\x03")
    for x in (a, b, c):
        ev = await x.recv()
        assert isinstance(ev, j5.Message) and ev.raw == mc, ev
    await nothing_more(c, 0.05)


async def test_bb12_j5_heartbeat_echoed_exactly(router: Server) -> None:
    """12. HEARTBEAT is echoed with the exact bytes (any valid encoding of it)."""
    c = await j5_client(router)
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
    silent = await j5_member(router, "demo", A5, "A")
    alive = await j5_member(router, "demo", B5, "B")
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
    a = await j5_member(router, "demo", A5, "A")
    b = await j5_member(router, "demo", B5, "B")
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
    a = await j5_member(router, "g1", A5, "A")
    await a.unregister("g1", A5)
    await a.register("g2", A5, "A", ip(7800, V5))
    await a.sync()
    assert (await a.get_members("g1"))[0].members == ()
    assert [m.name for m in (await a.get_members("g2"))[0].members] == ["A"]
    await a.unregister("g2", A5)
    await a.sync()
    n = await j5_member(router, "g3", A5, "A")
    assert [m.name for m in (await n.get_members("g3"))[0].members] == ["A"]
    b = await j5_member(router, "g3", B5, "B")
    await b.message("g3", None, B5, b"hi")
    assert isinstance(await n.recv(), j5.Message)


async def test_bb05_j5_abrupt_close_suspects(router: Server) -> None:
    """5. A connection closed without UNREGISTER: the others get SUSPECT(group, A); the query
    no longer lists A."""
    a = await j5_member(router, "demo", A5, "A")
    b = await j5_member(router, "demo", B5, "B")
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
    a = await j5_member(router, "demo", A5, "A")
    b = await j5_member(router, "demo", B5, "B")
    c = await j5_member(router, "demo", C5, "C")
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
    c = await j5_member(router, "demo", A5, "A")
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
    a = await j5_client(router)
    await a.send_raw((1025).to_bytes(4, "big"))  # only the prefix: refused without the body
    assert await a.recv_until_closed() == [j5.CloseMarker()]
    assert router.hub.counters.partial_bytes == 0
    b = await j5_member(router, "demo", B5, "B")
    c = await j5_member(router, "demo", C5, "C")
    await c.send_raw(b"\xff\xff\xff\xf0")
    assert await c.recv_until_closed() == [j5.CloseMarker()]
    assert await b.recv() == j5.Suspect("demo", C5)


async def test_bb16_j5_two_addresses_on_one_connection_both_suspected(router: Server) -> None:
    """16. One connection registers two addresses in one group and closes: both are removed and
    suspected (5.5.6 removes only one)."""
    a = await j5_client(router)
    await a.register("demo", A5, "A")
    await a.register("demo", C5, "C")
    await a.sync()
    b = await j5_member(router, "demo", B5, "B")
    await a.aclose()
    got = {await b.recv(), await b.recv()}
    assert got == {j5.Suspect("demo", A5), j5.Suspect("demo", C5)}
    assert [m.name for m in (await b.get_members("demo"))[0].members] == ["B"]


async def test_bb15_j5_duplicate_registration(router: Server) -> None:
    """15. The same address registered from a second connection: the newest carries its
    traffic; the old connection stays open; its later close neither removes nor suspects the
    member."""
    old = await j5_member(router, "demo", A5, "A")
    new = await j5_member(router, "demo", A5, "A")
    b = await j5_member(router, "demo", B5, "B")
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
    a = await j5_member(router, "demo", A5, "A")
    stranger = await j5_client(router)
    before = router.hub.counters.drops.get("not_member", 0)
    await stranger.message("demo", None, C5, b"spam")
    await stranger.message("demo", A5, C5, b"spam")
    await stranger.message("demo", A5, None, b"spam")
    await stranger.sync()
    assert router.hub.counters.drops.get("not_member", 0) == before + 3
    await nothing_more(a, 0.05)


async def test_bb25_unicast_to_a_member_of_another_group_dropped(router: Server) -> None:
    """25. Lookups are per group: a unicast into G1 for a member of G2 is dropped."""
    a = await j5_member(router, "g1", A5, "A")
    b = await j5_member(router, "g2", B5, "B")
    await a.message("g1", B5, A5, b"x")
    await a.sync()
    await nothing_more(b, 0.05)
    a2 = await j2_member(router, "g1", A2, "A")
    b2 = await j2_member(router, "g2", B2, "B")
    await a2.message("g1", B2, b"x")
    await nothing_more(b2, 0.1)


async def test_bb19_j5_fragmented_and_coalesced(router: Server) -> None:
    """19. Frames split into 1-byte segments, and many frames in one segment."""
    a = await j5_member(router, "demo", A5, "A")
    b = await j5_client(router)
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
        clients[name] = await j5_member(router, "k", addr, name)
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
    a = await j5_member(router, group, A5, name)
    [rep] = await a.get_members(group)
    assert rep.group == group and [m.name for m in rep.members] == [name]
    frame = await a.message(group, None, A5, b"hello")
    ev = await a.recv()
    assert isinstance(ev, j5.Message) and ev.raw == frame
    c2 = await j2_member(router, group, A2, name)
    [m] = await c2.gossip_get(group)
    assert m.name == name
    await c2.message(group, None, b"hi")
    assert await c2.recv() == j2.Message(None, None, b"hi")
