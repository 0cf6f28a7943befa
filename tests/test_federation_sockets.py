"""Groups that span routers (docs/federation.md): in-process routers federated through a real
mosquitto on 127.0.0.1, raw native clients on real sockets.

Every "exactly once" check is bounded by work: the routers' counters say how many frames
crossed, then a PING/PONG round trip on each receiving connection proves everything queued
before it has been read.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import trio

from gossiprouter.ops.metrics import federation_metrics
from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol import native as wire
from gossiprouter.server.snapshot import member_page, membership
from gossiprouter.stub import RouterStub
from tests.federation_routers import (
    FED,
    G,
    carriers,
    events,
    everywhere,
    federation,
    member,
    routes,
    table_members,
)
from tests.jgroups_clients import V2, V5, J2Client, J5Client, ip, uuid
from tests.nclient import NativeClient
from tests.procs import RouterProcess
from tests.test_bridge import MOSQUITTO, Mosquitto, bridge_of
from tests.test_bridge import broker as broker  # the fixture: mosquitto on a free port
from tests.test_stub import FAST, InProcessRouter, eventually


async def test_two_routers_join_route_leave(nursery: trio.Nursery, broker: Mosquitto) -> None:
    ra, rb = await federation(nursery, broker, 2)
    a = await member(ra, b"a")
    b = await member(rb, b"b")
    await everywhere([ra, rb], {b"a", b"b"})
    # GET_MEMBERS on either router lists both, with names and physical addresses.
    for c in (a, b):
        infos = await c.member_list(G)
        assert sorted((m.addr, m.name, m.physical) for m in infos) == [
            (b"a", "a", (("10.0.0.1", 7800),)), (b"b", "b", (("10.0.0.1", 7800),))]

    await a.send(wire.Route(G, None, b"a", b"m1"))
    await a.send(wire.Route(G, b"b", b"a", b"u1"))
    await b.send(wire.Route(G, b"a", b"b", b"u2"))
    await b.send(wire.Route(G, None, b"b", b"m2"))
    fa, fb = bridge_of(ra).federation, bridge_of(rb).federation
    await eventually(lambda: fa.stats.routed_in == fb.stats.routed_in == 2)
    assert [(r.sender, r.dest, r.payload) for r in await routes(b)] == [
        (b"a", None, b"m1"), (b"a", b"b", b"u1")]
    assert [(r.sender, r.dest, r.payload) for r in await routes(a)] == [
        (b"b", b"a", b"u2"), (b"b", None, b"m2")]
    assert fa.stats.routed_out == fb.stats.routed_out == 2
    assert fa.stats.not_forwarded == fb.stats.not_forwarded == 0
    samples = {(x.name, tuple(x.labels.values())): x.value
               for m in federation_metrics(bridge_of(ra)) for x in m.samples}
    assert samples[("gossiprouter_federation_frames_total", ("out",))] == 2
    assert samples[("gossiprouter_federation_frames_total", ("in",))] == 2
    assert samples[("gossiprouter_federation_routers", ())] == 1
    assert samples[("gossiprouter_federation_remote_members", ())] == 1
    # The admin view and gossiprouter_members tell remote members apart: the routers' counts
    # add up to the group, and a remote member's connection names its router.
    assert ra.server is not None
    counts = (await membership(ra.server.hub.table)).kinds
    assert (counts["connection"], counts["remote"]) == (1, 1)
    page = await member_page(ra.server.hub.table, G, 0.0, 0, 10)
    assert page is not None
    assert {m.addr: [(c.peer, c.protocol) for c in m.connections] for m in page.members}[b"b"] \
        == [(f"router {bridge_of(rb).origin}", "federation")]
    assert bridge_of(ra).view()["federation"]["peers"] == [
        {"origin": bridge_of(rb).origin, "name": "r1", "groups": 1, "members": 1}]

    # A clean leave on B reaches A: gone, watchers told "leave", nobody "suspect".
    w = await member(ra, b"w")
    assert isinstance(await w.request(wire.Watch(w.req(), G)), wire.Ok)
    assert isinstance(await b.request(wire.Disconnect(b.req(), G, b"b")), wire.Ok)
    await everywhere([ra, rb], {b"a", b"w"})
    events = [f for f in await w.round_trip() if isinstance(f, wire.Event)]
    assert [(e.kind, e.addr) for e in events] == [("leave", b"b")]
    assert not [f for f in await a.round_trip() if isinstance(f, wire.Event)]


async def test_three_routers_multicast_once_per_router_and_member(
        nursery: trio.Nursery, broker: Mosquitto) -> None:
    routers = await federation(nursery, broker, 3)
    ra, rb, rc = routers
    # Three members on B, one on C, the sender on A; and one member on both B and C.
    a = await member(ra, b"a")
    bs = [await member(rb, b"b%d" % i) for i in range(3)]
    c = await member(rc, b"c")
    twin_b, twin_c = await member(rb, b"t"), await member(rc, b"t")
    await everywhere(routers, {b"a", b"b0", b"b1", b"b2", b"c", b"t"})
    both = ["RemoteMember", "NativeSession"]
    await eventually(lambda: carriers(ra, b"t") == ["RemoteMember"] * 2
                     and carriers(rb, b"t") == carriers(rc, b"t") == both)
    n = 5
    for i in range(n):
        await a.send(wire.Route(G, None, b"a", b"m%d" % i))
    fb, fc = bridge_of(rb).federation, bridge_of(rc).federation
    # One message per run and router: B and C each got the n frames once, not per member.
    await eventually(lambda: fb.stats.routed_in == fc.stats.routed_in == n)
    for x in (*bs, c):
        assert [r.payload for r in await routes(x)] == [b"m%d" % i for i in range(n)]
    # The twin is on B and C: exactly one of them delivers (the smaller router id).
    got = [len(await routes(t)) for t in (twin_b, twin_c)]
    assert sorted(got) == [0, n]
    assert bridge_of(ra).federation.stats.routed_out == 2 * n


async def test_member_on_two_routers_gets_each_message_once_whichever_router_is_used(
        nursery: trio.Nursery, broker: Mosquitto) -> None:
    ra, rb = await federation(nursery, broker, 2)
    ta, tb = await member(ra, b"t"), await member(rb, b"t")
    sa, sb = await member(ra, b"sa"), await member(rb, b"sb")
    await everywhere([ra, rb], {b"t", b"sa", b"sb"})
    await eventually(lambda: carriers(ra, b"t") == carriers(rb, b"t")
                     == ["RemoteMember", "NativeSession"])
    await sa.send(wire.Route(G, None, b"sa", b"from-a"))
    await sb.send(wire.Route(G, None, b"sb", b"from-b"))
    await sa.send(wire.Route(G, b"t", b"sa", b"uni-a"))
    await sb.send(wire.Route(G, b"t", b"sb", b"uni-b"))
    fa, fb = bridge_of(ra).federation, bridge_of(rb).federation
    # Each router sent its multicast to the other (for the other's sender), no unicast.
    await eventually(lambda: fa.stats.routed_in == fb.stats.routed_in == 1)
    got = sorted(r.payload for r in (await routes(ta)) + (await routes(tb)))
    assert got == [b"from-a", b"from-b", b"uni-a", b"uni-b"]


async def test_partial_connectivity(nursery: trio.Nursery, broker: Mosquitto) -> None:
    """The member's connection to A breaks (no DISCONNECT) while its connection to B lives:
    A keeps it as a member, through B, and what is sent through A still reaches it."""
    ra, rb = await federation(nursery, broker, 2)
    s = await member(ra, b"s")
    ta, tb = await member(ra, b"t"), await member(rb, b"t")
    w = await member(ra, b"w")
    assert isinstance(await w.request(wire.Watch(w.req(), G)), wire.Ok)
    await everywhere([ra, rb], {b"s", b"t", b"w"})
    await eventually(lambda: carriers(ra, b"t") == carriers(rb, b"t")
                     == ["RemoteMember", "NativeSession"])
    fb = bridge_of(rb).federation
    await ta.aclose()
    await eventually(lambda: carriers(ra, b"t") == ["RemoteMember"])
    # B learns that t is no longer connected to A.
    await eventually(lambda: len(fb.routers[bridge_of(ra).origin].groups[G]) == 2)
    await s.send(wire.Route(G, None, b"s", b"multi"))
    await s.send(wire.Route(G, b"t", b"s", b"uni"))
    await eventually(lambda: fb.stats.routed_in == 2)
    assert [r.payload for r in await routes(tb)] == [b"multi", b"uni"]
    assert table_members(ra) == {b"s", b"t", b"w"}
    # Nobody was told t left or was suspected.
    assert not [f for f in await w.round_trip() if isinstance(f, wire.Event)]
    assert not [f for f in await s.round_trip() if isinstance(f, wire.Event)]


async def test_a_dead_router_is_suspected_everywhere_and_the_others_lose_nothing(
        nursery: trio.Nursery, broker: Mosquitto) -> None:
    routers = await federation(nursery, broker, 3)
    ra, rb, rc = routers
    a, b, c = await member(ra, b"a"), await member(rb, b"b"), await member(rc, b"c")
    await everywhere(routers, {b"a", b"b", b"c"})
    # C dies without a word: the bridge's socket closes without DISCONNECT (its Last Will).
    await rc.stop()
    await everywhere([ra, rb], {b"a", b"b"})
    for x in (a, b):
        assert await events(x, 1) == [("suspect", b"c")]
    assert bridge_of(ra).federation.stats.routers_lost == 1
    await a.send(wire.Route(G, None, b"a", b"still"))
    await eventually(lambda: bridge_of(rb).federation.stats.routed_in == 1)
    assert [r.payload for r in await routes(b)] == [b"still"]
    del c


async def test_broker_restart_resyncs_without_ghosts(nursery: trio.Nursery,
                                                    broker: Mosquitto) -> None:
    ra, rb = await federation(nursery, broker, 2, bridge_keepalive=30)
    a = await member(ra, b"a")
    b1, b2 = await member(rb, b"b1"), await member(rb, b"b2")
    await everywhere([ra, rb], {b"a", b"b1", b"b2"})
    fa, fb = bridge_of(ra).federation, bridge_of(rb).federation
    # A crash (a stopping mosquitto publishes everyone's Last Will; a crashed one cannot).
    assert broker.proc is not None
    broker.proc.kill()
    broker.proc.wait()
    broker.proc = None
    await eventually(lambda: bridge_of(ra).state != "connected"
                     and bridge_of(rb).state != "connected")
    # Meanwhile: local traffic is untouched, cross-router traffic counted as not forwarded,
    # and b1 leaves B (A cannot hear of it).
    await a.send(wire.Route(G, None, b"a", b"lost"))
    await eventually(lambda: fa.stats.not_forwarded == 1)
    assert isinstance(await b1.request(wire.Disconnect(b1.req(), G, b"b1")), wire.Ok)
    await b2.send(wire.Route(G, None, b"b2", b"local"))
    assert table_members(ra) == {b"a", b"b1", b"b2"}
    resyncs = fa.stats.resyncs
    broker.start()
    await eventually(lambda: fa.stats.resyncs > resyncs and fb.stats.resyncs > resyncs,
                     timeout=15, what="resynced")
    await everywhere([ra, rb], {b"a", b"b2"})
    await a.send(wire.Route(G, None, b"a", b"after"))
    await eventually(lambda: fb.stats.routed_in == 1)
    assert [r.payload for r in await routes(b2)] == [b"after"]


async def test_kill_9_of_a_router_process(broker: Mosquitto, tmp_path: Path) -> None:
    """Three router processes; C is killed with SIGKILL. Its members are suspected on A and B
    (its Last Will), a stub that listed C and B goes on through B, and nothing is lost for
    the others."""
    procs = [RouterProcess(None, "--bridge", broker.url, "--bridge-keepalive", "1",
                           "--federation-grace", "0", "--router-id", f"p{i}",
                           log=tmp_path / f"r{i}.log")
             for i in range(3)]
    with procs[0], procs[1], procs[2]:
        pa, pb, pc = procs
        w = await NativeClient.open("127.0.0.1", pa.port)
        assert isinstance(await w.request(wire.Watch(w.req(), G)), wire.Ok)
        qa = await NativeClient.open("127.0.0.1", pa.port)
        qb = await NativeClient.open("127.0.0.1", pb.port)
        a = await NativeClient.open("127.0.0.1", pa.port)
        assert isinstance(await a.connect(G, b"a"), wire.Ok)
        b = await NativeClient.open("127.0.0.1", pb.port)
        assert isinstance(await b.connect(G, b"b"), wire.Ok)
        c = await NativeClient.open("127.0.0.1", pc.port)
        assert isinstance(await c.connect(G, b"c"), wire.Ok)
        routers = [("127.0.0.1", pc.port), ("127.0.0.1", pb.port)]
        async with RouterStub(routers, **FAST) as stub:
            ch = await stub.connect(G, b"s")

            async def members_everywhere(want: set[bytes]) -> None:
                with trio.fail_after(10):
                    while True:
                        got = [set(await x.member_addrs(G)) for x in (qa, qb)]
                        if all(g == want for g in got):
                            return
                        await trio.sleep(0.02)

            await members_everywhere({b"a", b"b", b"c", b"s"})
            joins = await events(w, 4)
            assert sorted(joins) == [("join", b"a"), ("join", b"b"), ("join", b"c"),
                                     ("join", b"s")]
            assert pc.proc is not None
            pc.proc.kill()
            pc.proc.wait()
            await members_everywhere({b"a", b"b", b"s"})
            assert await events(w, 1) == [("leave", b"c")]
            assert await events(a, 1) == await events(b, 1) == [("suspect", b"c")]
            # The stub's member s was on C and B: never suspected, and it still gets A's
            # traffic (through B), once.
            await a.send(wire.Route(G, None, b"a", b"after"))
            await a.send(wire.Route(G, b"s", b"a", b"marker"))
            with trio.fail_after(5):
                got = [(await ch.receive()).payload, (await ch.receive()).payload]
            assert got == [b"after", b"marker"]
            assert [r.payload for r in await routes(b)] == [b"after"]


async def test_jgroups_members_and_messages_across_routers(nursery: trio.Nursery,
                                                           broker: Mosquitto) -> None:
    """JGroups 2.12 and 5.x clients on two routers: each router's member lists (GOSSIP_GET,
    GET_MBRS) hold the other's members with their exact addresses and physical addresses,
    and messages cross byte-exact, the sender's own multicast copy included."""
    ra, rb = await federation(nursery, broker, 2)
    assert ra.server is not None and rb.server is not None
    a2, b2 = uuid(1, V2), uuid(2, V2)
    ja = await J2Client.open(*ra.server.address)  # type: ignore[misc]
    assert (await ja.connect("demo", a2, "A", [ip(7800, V2)])).ok
    jb = await J2Client.open(*rb.server.address)  # type: ignore[misc]
    assert (await jb.connect("demo", b2, "B", [ip(7801, V2)])).ok
    await everywhere([ra, rb], {a2.key, b2.key}, "jgroups2:demo")
    want = (j2.Member(a2, "A", (ip(7800, V2),)), j2.Member(b2, "B", (ip(7801, V2),)))
    for x in (ja, jb):
        assert sorted(await x.gossip_get("demo"), key=lambda m: m.name or "") == list(want)
    await ja.message("demo", b2, b"\xca\xfe")
    with trio.fail_after(5):
        assert await jb.stream.receive_some(65536) == (
            bytes.fromhex("0a00") + b2.raw + bytes.fromhex("00ffffffff0100000002cafe"))
    await jb.message("demo", None, b"\x01\x02\x03")
    for x in (ja, jb):
        with trio.fail_after(5):
            assert await x.stream.receive_some(65536) == bytes.fromhex(
                "0a000100ffffffff0100000003010203")

    a5, b5 = uuid(1, V5), uuid(2, V5)
    ka = await J5Client.open(*ra.server.address)  # type: ignore[misc]
    await ka.register("demo", a5, "A", ip(7800, V5))
    kb = await J5Client.open(*rb.server.address)  # type: ignore[misc]
    await kb.register("demo", b5, "B", ip(7801, V5))
    await everywhere([ra, rb], {a5.key, b5.key}, "jgroups5:demo")
    for y in (ka, kb):
        [reply] = await y.get_members("demo")
        assert sorted(reply.members, key=lambda m: m.name or "") == [
            j5.Member(a5, "A", ip(7800, V5)), j5.Member(b5, "B", ip(7801, V5))]
    uni = await ka.message("demo", b5, a5, b"\xca\xfe")
    assert await kb.recv() == j5.Message("demo", b5, a5, uni, len(uni) - 2)
    mc = await kb.message("demo", None, b5, b"\x01\x02\x03")
    for y in (ka, kb):
        e5 = await y.recv()
        assert isinstance(e5, j5.Message) and e5.raw == mc, e5
    # A 5.x member's router dies: the other suspects it to its own members.
    await rb.stop()
    await everywhere([ra], {a5.key}, "jgroups5:demo")
    assert await ka.recv() == j5.Suspect("demo", b5)


async def test_repeated_frames_to_a_remote_router_are_never_left_to_the_fast_path(
        nursery: trio.Nursery, broker: Mosquitto) -> None:
    """The compiled fast path repeats routes Python learned; one whose receivers include
    another router must not be learned (its frames would skip the broker). Many identical
    frames, local and remote receivers: every one reaches both (with the fast path on or
    off, as scripts/test runs the suite)."""
    ra, rb = await federation(nursery, broker, 2)
    s, near = await member(ra, b"s"), await member(ra, b"near")
    far = await member(rb, b"far")
    await everywhere([ra, rb], {b"s", b"near", b"far"})
    n = 200
    # In batches, each read separately (a PING's PONG between them): the first batch teaches
    # the fast path, the later ones are what it would repeat.
    for route in (wire.Route(G, None, b"s", b"same"), wire.Route(G, b"far", b"s", b"uni")):
        for _ in range(10):
            await s.send_raw(wire.encode(route) * (n // 10))
            await s.round_trip()
    fb = bridge_of(rb).federation
    await eventually(lambda: fb.stats.routed_in == 2 * n)
    assert [r.payload for r in await routes(far)] == [b"same"] * n + [b"uni"] * n
    assert [r.payload for r in await routes(near)] == [b"same"] * n


async def test_cut_off_from_the_broker_drops_the_others_then_resync_restores(
        nursery: trio.Nursery, broker: Mosquitto) -> None:
    """A router without its broker for 1.5 x bridge_keepalive drops the other routers'
    members (suspected), as they drop its own; the resync after the reconnect brings them
    back (a join for the watchers)."""
    ra, rb = await federation(nursery, broker, 2)  # bridge_keepalive = 1
    a, w = await member(ra, b"a"), await member(ra, b"w")
    assert isinstance(await w.request(wire.Watch(w.req(), G)), wire.Ok)
    b = await member(rb, b"b")
    await everywhere([ra, rb], {b"a", b"w", b"b"})
    assert await events(w, 1) == [("join", b"b")]
    assert broker.proc is not None
    broker.proc.kill()  # a crash: no Last Will is published
    broker.proc.wait()
    broker.proc = None
    await everywhere([ra], {b"a", b"w"})
    assert await events(a, 1) == [("suspect", b"b")]
    assert await events(w, 2) == [("suspect", b"b"), ("leave", b"b")]
    assert bridge_of(ra).federation.stats.routers_lost == 1
    broker.start()
    await everywhere([ra, rb], {b"a", b"w", b"b"})
    assert await events(w, 1) == [("join", b"b")]
    del b


async def test_a_stub_sees_the_whole_group_through_any_router(nursery: trio.Nursery,
                                                            broker: Mosquitto) -> None:
    """RouterStub, unchanged: connected to one router, it lists and watches members of the
    other, and a stub on both routers gets each message once."""
    ra, rb = await federation(nursery, broker, 2)
    async with RouterStub([ra.address], **FAST) as sa, \
            RouterStub([ra.address, rb.address], **FAST) as both:
        watch = await sa.watch(G)
        ch = await sa.connect(G, b"a")
        b = await member(rb, b"b")
        twin = await both.connect(G, b"t")
        await everywhere([ra, rb], {b"a", b"b", b"t"})
        await eventually(lambda: carriers(ra, b"t") == carriers(rb, b"t")
                         == ["RemoteMember", "NativeSession"])
        assert sorted(m.addr for m in await ch.members()) == [b"a", b"b", b"t"]
        with trio.fail_after(5):
            seen: set[bytes] = set()
            while seen != {b"a", b"b", b"t"}:
                ev = await watch.receive()
                if ev.kind == "join":
                    seen.add(ev.member.addr)
        await b.send(wire.Route(G, None, b"b", b"one"))
        await b.send(wire.Route(G, b"t", b"b", b"two"))
        await ch.send(b"three")
        with trio.fail_after(5):
            got = [(await twin.receive()).payload for _ in range(3)]
        assert sorted(got) == [b"one", b"three", b"two"]
        await b.send(wire.Route(G, b"t", b"b", b"marker"))
        with trio.fail_after(5):
            assert (await twin.receive()).payload == b"marker"


async def test_a_router_shut_down_leaves_cleanly_and_a_cancelled_one_is_suspected(
        nursery: trio.Nursery, broker: Mosquitto) -> None:
    """A graceful shutdown withdraws the router's records and presence before DISCONNECT:
    its members leave everywhere, unsuspected (and its retained state is gone from the
    broker). A router cancelled outright goes by its Last Will: suspected, as before."""
    ra, rb, rc = await federation(nursery, broker, 3)
    w = await member(ra, b"w")  # a member and a watcher: it would see a suspect first
    assert isinstance(await w.request(wire.Watch(w.req(), G)), wire.Ok)
    b, c = await member(rb, b"b"), await member(rc, b"c")
    await everywhere([ra, rb, rc], {b"w", b"b", b"c"})
    assert sorted(await events(w, 2)) == [("join", b"b"), ("join", b"c")]
    fa = bridge_of(ra).federation
    await rb.stop(graceful=True)
    await everywhere([ra, rc], {b"w", b"c"})
    assert await events(w, 1) == [("leave", b"b")]
    assert (fa.stats.routers_left, fa.stats.routers_lost, fa.live_routers()) == (1, 0, 1)
    await rc.stop()  # cancelled: the socket closes without DISCONNECT
    await everywhere([ra], {b"w"})
    assert await events(w, 2) == [("suspect", b"c"), ("leave", b"c")]
    assert (fa.stats.routers_left, fa.stats.routers_lost) == (1, 1)
    # A router starting now gets no retained record or presence of B (withdrawn); C's
    # records stay retained, inert without a presence.
    [rd] = [await InProcessRouter(nursery, bridge=broker.url, router_id="r3", **FED).start()]
    fd = bridge_of(rd).federation
    await eventually(lambda: fd.synced)
    assert fd.routers.keys() == {bridge_of(ra).origin} and table_members(rd) == {b"w"}
    del b, c


async def test_sigterm_leaves_the_federation_and_exits(nursery: trio.Nursery, broker: Mosquitto,
                                                       tmp_path: Path) -> None:
    """SIGTERM on a router process (cli's signal handler, Server.shutdown): the other router
    sees its member leave, with no suspect, and the process exits 0."""
    [ra] = await federation(nursery, broker, 1)
    w = await member(ra, b"w")
    with RouterProcess(None, "--bridge", broker.url, "--router-id", "p1",
                       log=tmp_path / "p1.log") as pb:
        b = await NativeClient.open("127.0.0.1", pb.port)
        assert isinstance(await b.connect(G, b"b"), wire.Ok)
        await everywhere([ra], {b"w", b"b"})
        assert isinstance(await w.request(wire.Watch(w.req(), G)), wire.Ok)
        assert await trio.to_thread.run_sync(pb.stop) == 0
        assert await events(w, 1) == [("leave", b"b")]
        fa = bridge_of(ra).federation
        assert (fa.stats.routers_left, fa.stats.routers_lost) == (1, 0)


async def test_an_answer_to_a_member_that_just_joined_another_router_arrives(
        nursery: trio.Nursery, broker: Mosquitto) -> None:
    """x joins A and multicasts at once; y, on B, answers x through B as soon as it has the
    message: B knows x by then (A published x's record before the message)."""
    ra, rb = await federation(nursery, broker, 2)
    y = await member(rb, b"y")
    await everywhere([ra, rb], {b"y"})
    for i in range(5):
        addr = b"x%d" % i
        x = await member(ra, addr)
        await x.send(wire.Route(G, None, addr, b"hello"))
        with trio.fail_after(5):
            while not isinstance(f := await y.recv(), wire.Route):
                pass
        assert f.payload == b"hello"
        await y.send(wire.Route(G, addr, b"y", b"answer"))
        assert [r.payload for r in await routes_until(x, 1)] == [b"answer"]
    assert bridge_of(rb).federation.stats.undeliverable == 0


async def routes_until(c: NativeClient, n: int) -> list[wire.Route]:
    out: list[wire.Route] = []
    with trio.fail_after(5):
        while len(out) < n:
            if isinstance(f := await c.recv(), wire.Route):
                out.append(f)
    return out


async def test_a_message_or_record_larger_than_the_brokers_limit_is_not_sent(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    """mosquitto with max_packet_size (announced in CONNACK): a routed message or a record
    beyond it made the broker cut the router off (its members suspected everywhere, and the
    record republished at every reconnect: a loop). They are counted as oversized and not
    sent (topic publications take the same check); the link, and the members, stay."""
    if not shutil.which(MOSQUITTO):
        pytest.skip("mosquitto is not installed (scripts/setup installs it)")
    b = Mosquitto(tmp_path, "allow_anonymous true\nmax_packet_size 4096\n")
    b.start()
    try:
        ra, rb = await federation(nursery, b, 2)
        x, y = await member(ra, b"x"), await member(rb, b"y")
        await everywhere([ra, rb], {b"x", b"y"})
        ba, fb = bridge_of(ra), bridge_of(rb).federation
        await x.send(wire.Route(G, b"y", b"x", b"big" * 2000))
        await x.send(wire.Route(G, None, b"x", b"small"))
        await eventually(lambda: fb.stats.routed_in == 1)
        assert [r.payload for r in await routes(y)] == [b"small"]
        # A group whose members outgrow the limit: its records are chunks and deltas within
        # it (docs/federation.md, "Records"), so it federates; the rest goes on.
        many = await member(ra, b"m00", "big")
        for i in range(1, 20):  # 20 names of 250 bytes: more than 5,000 bytes of members
            assert isinstance(await many.connect("big", b"m%02d" % i, "n" * 250), wire.Ok)
        await eventually(lambda: table_members(rb, "big") == {b"m%02d" % i for i in range(20)})
        assert ba.stats.oversized == 1
        await x.send(wire.Route(G, None, b"x", b"still"))
        await eventually(lambda: fb.stats.routed_in == 2)
        assert [r.payload for r in await routes(y)] == [b"still"]
        assert ba.stats.connects == 1 and fb.stats.routers_lost == 0
        assert table_members(rb) == {b"x", b"y"}
        assert ba.federation.stats.not_forwarded == 1
        del many
    finally:
        b.stop()


async def test_a_persistent_broker_restoring_an_old_record_leaves_no_ghost(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    """mosquitto with persistence saves its retained messages at a clean stop and restores
    them after a crash: a record of a live router that it deleted since (x left) comes back.
    That router deletes its own stale record again; before, x stayed a member elsewhere
    until the router touched the group again (or the record expired, a day later)."""
    if not shutil.which(MOSQUITTO):
        pytest.skip("mosquitto is not installed (scripts/setup installs it)")
    b = Mosquitto(tmp_path)
    # (As root mosquitto would run as user mosquitto, which cannot write in tmp_path.)
    b.conf.write_text(f"listener {b.port} 127.0.0.1\nallow_anonymous true\nuser root\n"
                      f"persistence true\npersistence_location {tmp_path}/\n")
    b.start()
    try:
        ra, rb = await federation(nursery, b, 2)
        fa, fb = bridge_of(ra).federation, bridge_of(rb).federation
        x = await member(ra, b"x")
        await everywhere([ra, rb], {b"x"})
        b.stop()  # saves the retained messages: x's record among them

        async def restarted() -> None:
            before = (fa.stats.resyncs, fb.stats.resyncs)
            b.start()
            await eventually(lambda: fa.stats.resyncs > before[0]
                             and fb.stats.resyncs > before[1], timeout=15, what="resynced")
        await restarted()
        await everywhere([ra, rb], {b"x"})
        assert isinstance(await x.request(wire.Disconnect(x.req(), G, b"x")), wire.Ok)
        await everywhere([ra, rb], set())
        assert b.proc is not None
        b.proc.kill()  # a crash: the saved state (x's record) comes back
        b.proc.wait()
        b.proc = None
        await restarted()
        # A router starting now reads what the broker retains: whether or not ra has
        # replaced the restored record yet, x is a member nowhere once it has (without the
        # fix, the restored record lists x on every router for as long as it is retained).
        rc = await InProcessRouter(nursery, bridge=b.url, router_id="r2", **FED).start()
        fc = bridge_of(rc).federation
        await eventually(lambda: fc.synced and fc.live_routers() == 2, what="rc up")
        await everywhere([ra, rb, rc], set())
    finally:
        b.stop()


async def test_a_clean_leave_withdraws_more_records_than_the_in_flight_window(
        nursery: trio.Nursery, broker: Mosquitto) -> None:
    """paho sends at most 20 QoS 1 messages ahead of their PUBACKs and queues the rest: a
    router in 30 groups must wait for them before DISCONNECT, or the last records and its
    presence deletion are never sent (its members stay elsewhere until the presence expires,
    then are suspected)."""
    ra, rb = await federation(nursery, broker, 2)
    c = await member(rb, b"m", "g0")
    groups = [f"g{i}" for i in range(30)]
    for g in groups[1:]:
        assert isinstance(await c.connect(g, b"m", "m"), wire.Ok)
    assert ra.server is not None
    table = ra.server.hub.table
    await eventually(lambda: all(table.entry(g, b"m") is not None for g in groups))
    await rb.stop(graceful=True)
    await eventually(lambda: all(table.entry(g, b"m") is None for g in groups),
                     what="every record withdrawn")
    fa = bridge_of(ra).federation
    assert (fa.stats.routers_left, fa.stats.routers_lost, fa.live_routers()) == (1, 0, 0)
