"""Topic multicast over real sockets: the native frames, the router's delivery rules, the stub."""

from __future__ import annotations

from pathlib import Path

import trio

from gossiprouter.protocol import native as wire
from gossiprouter.server.listener import Server
from gossiprouter.stub import Publication, RouterError, RouterStub
from tests.conftest import RouterFactory
from tests.nclient import NativeClient
from tests.test_stub import FAST, InProcessRouter, connected, drain, eventually

G = "topics"


async def _member(router: Server, addr: bytes) -> NativeClient:
    assert router.address is not None
    c = await NativeClient.open(*router.address)
    ok = await c.request(wire.Connect(c.req(), G, addr))
    assert isinstance(ok, wire.Ok), ok
    return c


async def _ask(c: NativeClient, frame: wire.Subscribe | wire.Unsubscribe) -> wire.Frame:
    """A topic request and its answer (the next frame: nothing else is in flight)."""
    await c.send(frame)
    return await c.recv()


def _sub(c: NativeClient, addr: bytes, *partition: str, provider: str = "v17",
         broadcast: str = "pos") -> wire.Subscribe:
    return wire.Subscribe(c.req(), G, addr, provider, broadcast, partition)


async def _published(router: Server, publisher: NativeClient, receiver: NativeClient,
                     copies: int) -> None:
    """``publisher`` publishes a concrete id matched by every pattern the tests use (its
    own address is A); ``receiver`` gets exactly ``copies`` copies, and the router counted
    that many deliveries. Round trips prove that nothing more is coming: the publisher's
    shows the PUBLISH was handled, the receiver's that no further copy was queued for it."""
    await publisher.send(wire.Publish(G, b"A", "v17", "pos", (), 0, b"x"))
    for _ in range(copies):
        assert isinstance(await receiver.recv(), wire.Publish)
    assert await publisher.round_trip() == []
    assert await receiver.round_trip() == []
    assert router.hub.table.stats.topic_deliveries == copies


async def test_publish_reaches_matching_members_once_and_not_the_publisher(
        router: Server) -> None:
    a, b, c = [await _member(router, x) for x in (b"A", b"B", b"C")]
    # B matches through three patterns: it gets one copy.
    for part in (("eu", "*"), ("eu", "+", "munich"), ("*",)):
        assert isinstance(await _ask(b, _sub(b, b"B", *part)), wire.Ok)
    assert isinstance(await _ask(c, _sub(c, b"C", "us", "*")), wire.Ok)
    assert isinstance(await _ask(a, _sub(a, b"A", "*")), wire.Ok)
    pub = wire.Publish(G, b"A", "v17", "pos", ("eu", "de", "munich"), 0, b"x")
    await a.send(pub)
    assert await b.recv() == pub
    await a.send(wire.Ping(7))
    assert await a.recv() == wire.Pong(7)  # A got no copy of its own publication
    # C's pattern did not match; B got exactly one copy (the next frame is the PONG).
    await b.send(wire.Ping(8))
    assert await b.recv() == wire.Pong(8)
    await c.send(wire.Ping(9))
    assert await c.recv() == wire.Pong(9)
    st = router.hub.table.stats
    assert (st.published_local, st.topic_deliveries) == (1, 1)
    # With the echo flag the publisher's own matching member gets it too.
    echo = wire.Publish(G, b"A", "v17", "pos", ("eu",), wire.PUB_ECHO, b"y")
    await a.send(echo)
    assert await a.recv() == echo
    assert await b.recv() == echo
    for x in (a, b, c):
        await x.aclose()


async def test_one_copy_per_connection_carrying_several_matching_members(
        router: Server) -> None:
    a = await _member(router, b"A")
    s = await _member(router, b"S1")
    assert isinstance(await s.request(wire.Connect(s.req(), G, b"S2")), wire.Ok)
    for addr in (b"S1", b"S2"):
        assert isinstance(await _ask(s, _sub(s, addr, "*")), wire.Ok)
    await _published(router, a, s, 1)
    await a.aclose()
    await s.aclose()


async def test_topic_errors_keep_the_connection_open(router: Server) -> None:
    a = await _member(router, b"A")
    bad = await _ask(a, _sub(a, b"A", "*", "eu"))
    assert isinstance(bad, wire.Error) and bad.code == "bad_topic"
    assert "last partition element" in bad.message
    nm = await _ask(a, _sub(a, b"Z", "eu"))
    assert isinstance(nm, wire.Error) and nm.code == "not_member"
    await a.send(wire.Publish(G, b"A", "v17", "pos", ("+",), 0, b"x"))
    e = await a.recv()
    assert isinstance(e, wire.Error) and e.code == "bad_topic" and e.req is None
    await a.send(wire.Publish(G, b"Z", "v17", "pos", (), 0, b"x"))
    e = await a.recv()
    assert isinstance(e, wire.Error) and e.code == "not_member"
    # unsubscribing a pattern never subscribed is fine (OK), the connection still works
    assert isinstance(await _ask(a,
        wire.Unsubscribe(a.req(), G, b"A", "v17", "pos", ("x",))), wire.Ok)
    await a.aclose()


async def test_malformed_topic_frames_are_protocol_errors(router: Server) -> None:
    assert router.address is not None
    a = await NativeClient.open(*router.address)
    fields = [wire.FrameType.SUBSCRIBE, 1, G, b"A", "p", "b", "eu"]  # partition not a list
    await a.send_raw(wire._frame(wire._packb(fields)))
    frames = await a.recv_until_closed()
    assert isinstance(frames[-1], wire.Error) and frames[-1].code == "protocol"
    assert "partition" in frames[-1].message


async def test_leave_drops_subscriptions(router: Server) -> None:
    a, b = await _member(router, b"A"), await _member(router, b"B")
    assert isinstance(await _ask(b, _sub(b, b"B", "*")), wire.Ok)
    assert isinstance(await b.request(wire.Disconnect(b.req(), G, b"B")), wire.Ok)
    assert isinstance(await b.request(wire.Connect(b.req(), G, b"B")), wire.Ok)
    await _published(router, a, b, 0)
    await a.aclose()
    await b.aclose()


async def test_stub_subscribe_publish_and_iterator(router: Server) -> None:
    assert router.address is not None
    async with RouterStub([router.address], **FAST) as s1, \
            RouterStub([router.address], **FAST) as s2:
        pubc = await s1.connect(G, b"P")
        sub = await s2.connect(G, b"S")
        other = await s2.connect(G, b"T")
        await sub.subscribe("vehicle-17", "position", ["eu", "+", "*"])
        await other.subscribe("vehicle-17", "position", ["us", "*"])
        await pubc.subscribe("vehicle-17", "position", ["*"])
        await pubc.publish(("vehicle-17", "position", ["eu", "de", "munich"]), b"p1")
        await pubc.send(b"plain")
        got = [await sub.receive(), await sub.receive()]
        assert isinstance(got[0], Publication)
        assert got[0].topic == ("vehicle-17", "position", ("eu", "de", "munich"))
        assert (got[0].payload, got[0].scope, got[0].sender) == (b"p1", "local", b"P")
        assert not isinstance(got[1], Publication) and got[1].payload == b"plain"
        assert [m.payload for m in await drain(other, 0.2)] == [b"plain"]
        assert await drain(pubc, 0.05) == []  # no echo without asking
        await pubc.publish(("vehicle-17", "position", ["eu"]), b"p2", echo=True)
        assert (await pubc.receive()).payload == b"p2"
        await sub.unsubscribe("vehicle-17", "position", ["eu", "+", "*"])
        gone = ("vehicle-17", "position", ("eu", "+", "*"))
        await eventually(lambda: gone not in router.hub.table.patterns().get(G, []))
        try:
            await sub.subscribe("x", "y", ["a"] * 40)
        except ValueError as e:
            assert "deeper" in str(e)
        else:
            raise AssertionError("a too deep pattern was accepted")


async def test_stub_subscription_refused_by_the_router(start_router: RouterFactory) -> None:
    router = await start_router(subscriptions_per_member=1)
    assert router.address is not None
    async with RouterStub([router.address], **FAST) as s:
        ch = await s.connect(G, b"A")
        await ch.subscribe("p", "b", ["a"])
        try:
            await ch.subscribe("p", "b", ["b"])
        except RouterError as e:
            assert e.code == "limit"
        else:
            raise AssertionError("the limit was not applied")
        assert ch.subscriptions == {("p", "b", ("a",))}


async def test_stubs_resubscribe_after_a_router_restart(nursery: trio.Nursery) -> None:
    r = await InProcessRouter(nursery).start()
    async with RouterStub([r.address], **FAST) as s1, RouterStub([r.address], **FAST) as s2:
        pub = await s1.connect(G, b"P")
        sub = await s2.connect(G, b"S")
        await sub.subscribe("p", "b", ["*"])
        await r.stop()
        await eventually(lambda: not connected(s1) and not connected(s2))
        await r.start()
        await eventually(lambda: connected(s1) and connected(s2))
        assert r.server is not None
        await eventually(lambda: r.server is not None
                         and bool(r.server.hub.table.patterns().get(G)))
        await pub.publish(("p", "b", ["x"]), b"after restart")
        with trio.fail_after(3):
            m = await sub.receive()
        assert isinstance(m, Publication) and m.payload == b"after restart"


async def test_a_run_of_publications_is_delivered_whole_and_in_order(router: Server) -> None:
    """PUBLISH frames of one header sent together take the run path (no per-frame decode:
    frames_in stays 0) and arrive complete and in order; a different header ends the run."""
    a, b = await _member(router, b"A"), await _member(router, b"B")
    assert isinstance(await _ask(b, _sub(b, b"B", "*")), wire.Ok)
    run = [wire.Publish(G, b"A", "v17", "pos", ("eu",), 0, b"p%03d" % i) for i in range(50)]
    other = wire.Publish(G, b"A", "v17", "pos", ("us",), 0, b"other")
    longer = wire.Publish(G, b"A", "v17", "pos", ("eu",), 0, b"longer payload")
    await a.send_raw(b"".join(wire.encode(f) for f in [*run, other, longer, *run[:3]]))
    got = [await b.recv() for _ in range(55)]
    assert got == [*run, other, longer, *run[:3]]
    st = router.hub.table.stats
    assert (st.published_local, st.topic_deliveries) == (55, 55)
    assert router.hub.counters.frames_in.get("Publish", 0) == 0
    # A bad frame inside a run's bytes is still refused (the run stops before it).
    await a.send_raw(wire.encode(run[0]) + wire.encode(
        wire.Publish(G, b"A", "v17", "pos", ("+",), 0, b"p000")))
    assert await b.recv() == run[0]
    e = await a.recv()
    assert isinstance(e, wire.Error) and e.code == "bad_topic"
    await a.aclose()
    await b.aclose()


async def test_topics_follow_the_groups_auth(start_router: RouterFactory,
                                             tmp_path: Path) -> None:
    from tests.test_ops_auth import BILLING, _tokens

    router = await start_router(tokens_file=str(_tokens(tmp_path)))
    assert router.address is not None
    c = await NativeClient.open(*router.address, token=BILLING)
    assert isinstance(await c.request(wire.Connect(c.req(), "billing", b"B")), wire.Ok)
    assert isinstance(await _ask(c, wire.Subscribe(c.req(), "billing", b"B", "p", "b", ())),
                      wire.Ok)
    # Another group's topics: refused by the auth check, before membership is looked at.
    for frame in (wire.Subscribe(c.req(), "reports", b"B", "p", "b", ()),
                  wire.Unsubscribe(c.req(), "reports", b"B", "p", "b", ())):
        e = await _ask(c, frame)
        assert isinstance(e, wire.Error) and e.code == "forbidden", e
    await c.aclose()


async def test_publications_are_held_for_a_subscriber_in_reconnect_grace(
        start_router: RouterFactory) -> None:
    router = await start_router(grace=10.0)
    a, b = await _member(router, b"A"), await _member(router, b"B")
    assert isinstance(await _ask(b, _sub(b, b"B", "*")), wire.Ok)
    await b.aclose()  # gone without DISCONNECT: in grace, subscriptions kept
    await eventually(lambda: bool(router.hub.table.groups[G].graced))
    held = wire.Publish(G, b"A", "v17", "pos", ("x",), 0, b"held")
    await a.send(held)
    await a.send(wire.Ping(1))
    assert await a.recv() == wire.Pong(1)
    b2 = await _member(router, b"B")  # back in time: the held publication comes first
    assert await b2.recv() == held
    # and the subscription is still there, without SUBSCRIBE again
    await a.send(held)
    assert await b2.recv() == held
    await a.aclose()
    await b2.aclose()


async def test_short_bodies_near_the_publish_fast_path_are_protocol_errors(
        router: Server) -> None:
    """Bodies of 0, 1 and 2 bytes (the last two the start of a PUBLISH) at the end of a chunk:
    ERROR protocol and close, never an exception in the router's loop."""
    assert router.address is not None
    for body in (b"", b"\x98", b"\x98\x16"):
        c = await NativeClient.open(*router.address)
        await c.send_raw(len(body).to_bytes(4, "big") + body)
        frames = await c.recv_until_closed()
        assert isinstance(frames[-1], wire.Error) and frames[-1].code == "protocol", body
    # the router still serves
    ok = await _member(router, b"A")
    await ok.aclose()
