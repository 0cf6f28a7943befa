"""The router speaking the JGroups 2.12 and 5.x GossipRouter protocols over real sockets: load,
a slow member, shutdown, a connection storm, the golden capture replays and the namespaces
(one protocol's groups unseen by the other's). The protocol-specific scenarios are in
tests/test_jgroups5_router.py and tests/test_jgroups2_router.py.

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
    A2,
    A5,
    B2,
    B5,
    C2,
    V2,
    V5,
    J2Client,
    J5Client,
    capture_streams,
    j2_client,
    j2_member,
    j5_client,
    j5_member,
    j5_registrations_settled,
    load_steps,
    replay,
    uuid,
)
from tests.nclient import NativeClient
from tests.quiet import nothing_more


async def test_bb10_j2_twenty_thousand_multicasts_return(router: Server) -> None:
    """10. 20,000 back-to-back multicasts from one client all come back to it, in order."""
    a = await j2_member(router, "demo", A2, "A")
    b = await j2_member(router, "demo", B2, "B")
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
    a = await j5_member(router, "demo", A5, "A")
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
    a = await j2_member(router, "demo", A2, "A")
    stalled = await j2_member(router, "demo", B2, "B")
    c = await j2_member(router, "demo", C2, "C")
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
    a5 = await j5_member(router, "demo", A5, "A")
    b5 = await j5_member(router, "demo", B5, "B")
    a2 = await j2_member(router, "demo", A2, "A")
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
        c = await j2_client(router)
        assert (await c.connect("storm", uuid(100 + i, V2), f"n{i}")).ok
        done.append(c)

    async def one5(i: int) -> None:
        c = await j5_client(router)
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
    a = await j5_member(router, "demo", A5, "A")
    ev = await n.recv()
    assert ev == wire.Event("jgroups5:demo", "join", A5.key, "A", (("127.0.0.1", 7800),))
    b = await j2_member(router, "demo", B2, "B")
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
    a2 = await j2_member(router, "demo", A2, "A")
    b5 = await j5_member(router, "demo", B5, "B")
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
    a = await j5_member(router, "demo", A5, "A")
    b = await j5_member(router, "demo", B5, "B")
    a2 = await j2_member(router, "demo", A2, "A")
    b2 = await j2_member(router, "demo", B2, "B")
    await a.aclose()
    await a2.aclose()
    await nothing_more(b, 0.1)
    await nothing_more(b2, 0.05)
