"""Routing-entry life cycle over real sockets (issue 4, acceptance 2 to 5)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio

from gossiprouter.core.config import Config, Provisioned
from gossiprouter.protocol import native as wire
from gossiprouter.router import MemberEvent, Message, Router
from gossiprouter.routing.entries import RoutingError
from gossiprouter.server.listener import Server
from tests.nclient import NativeClient
from tests.quiet import nothing_more


async def test_member_on_two_connections(router: Server) -> None:
    """Closing either connection keeps A listed, reachable, unsuspected; both: one suspect."""
    a1, a2, b = await NativeClient.several(router, 3)
    await b.connect("g", b"B")
    await a1.connect("g", b"A")
    await a2.connect("g", b"A")
    # Traffic goes to the newest connection.
    await b.send(wire.Route("g", b"A", b"B", b"one"))
    assert await a2.recv() == wire.Route("g", b"A", b"B", b"one")
    await nothing_more(a1, 0.1)
    await a2.aclose()
    await trio.sleep(0.1)
    assert await b.member_addrs("g") == [b"B", b"A"]
    # ... and falls back to the older one.
    await b.send(wire.Route("g", b"A", b"B", b"two"))
    assert await a1.recv() == wire.Route("g", b"A", b"B", b"two")
    await a1.aclose()
    assert await b.recv() == wire.Event("g", "suspect", b"A", None, ())
    assert await b.member_addrs("g") == [b"B"]
    await nothing_more(b)


async def test_older_connection_closing_first(router: Server) -> None:
    """The seed scenario: a restart re-registers before the old connection is noticed."""
    old, new, b = await NativeClient.several(router, 3)
    await b.connect("g", b"B")
    await old.connect("g", b"A")
    await new.connect("g", b"A")
    await old.aclose()
    await nothing_more(b, 0.3)  # no suspect: A is still reachable
    await b.send(wire.Route("g", b"A", b"B", b"hi"))
    assert await new.recv() == wire.Route("g", b"A", b"B", b"hi")


async def test_two_addresses_on_one_connection_both_suspected(router: Server) -> None:
    c, b = await NativeClient.several(router, 2)
    await b.connect("g", b"B")
    await c.connect("g", b"X1")
    await c.connect("g", b"X2")
    await c.aclose()
    got = {await b.recv(), await b.recv()}
    assert got == {wire.Event("g", "suspect", b"X1", None, ()),
                   wire.Event("g", "suspect", b"X2", None, ())}
    assert await b.member_addrs("g") == [b"B"]


async def test_watchers_see_join_and_leave(router: Server) -> None:
    w, a = await NativeClient.several(router, 2)
    assert isinstance(await w.request(wire.Watch(w.req(), "g")), wire.Ok)
    await a.connect("g", b"A", "alpha")
    assert await w.recv() == wire.Event("g", "join", b"A", "alpha", ())
    await a.request(wire.Disconnect(a.req(), "g", b"A"))
    assert await w.recv() == wire.Event("g", "leave", b"A", "alpha", ())


async def test_reconnect_grace(start_router: object) -> None:
    router: Server = await start_router(grace=2.0)  # type: ignore[operator]
    a, b, w = await NativeClient.several(router, 3)
    await w.request(wire.Watch(w.req(), "g"))
    await a.connect("g", b"A")
    await b.connect("g", b"B")
    assert (await w.recv(), await w.recv()) == (
        wire.Event("g", "join", b"A", None, ()), wire.Event("g", "join", b"B", None, ()))
    # A goes away for 1 s; B keeps sending to it (unicast and multicast).
    await a.aclose()
    with trio.fail_after(5):  # frames sent before the router sees the close are lost with it
        while (e := router.hub.table.entry("g", b"A")) is None or e.grace_until is None:
            await trio.sleep(0.01)
    sent = []
    for i in range(20):
        route = wire.Route("g", b"A" if i % 2 else None, b"B", b"m%d" % i)
        sent.append(route)
        await b.send(route)
        await trio.sleep(0.05)
    a2 = await NativeClient.to(router)
    assert await a2.connect("g", b"A") == wire.Ok(1)
    got = [await a2.recv() for _ in sent]
    assert got == sent
    await nothing_more(b, 0.2)
    await nothing_more(w, 0.1)
    # Now away for 3 s: removed when the grace ends, and the events fire.
    await a2.aclose()
    with trio.fail_after(4):
        ev = await b.recv()
    assert ev == wire.Event("g", "suspect", b"A", None, ())
    assert await w.recv() == wire.Event("g", "leave", b"A", None, ())
    assert router.hub.table.stats.grace_delivered == 20


async def test_provisioned_entries_and_embedding() -> None:
    cfg = Config(port=0, provisioned=(Provisioned("g", b"P", "fixed", (("10.1.1.1", 7800),)),))
    async with Router(cfg) as router:
        local = await router.register("g", b"L", name="local")
        c = await NativeClient.open(*router.address)
        assert await c.member_addrs("g") == [b"P", b"L"]
        for frame in (wire.Connect(c.req(), "g", b"P", None, ()),
                      wire.Disconnect(c.req(), "g", b"P")):
            reply = await c.request(frame)
            assert isinstance(reply, wire.Error) and reply.code == "forbidden"
        reply = await c.request(wire.Connect(c.req(), "g", b"L", None, ()))
        assert isinstance(reply, wire.Error) and reply.code == "address_in_use"
        await c.connect("g", b"C")
        await local.send(b"from-local")
        assert await c.recv() == wire.Route("g", None, b"L", b"from-local")
        await c.send(wire.Route("g", b"L", b"C", b"to-local"))
        with trio.fail_after(5):
            item = await local.receive()
        assert item == Message("g", b"C", b"L", b"to-local")
        await c.aclose()
        with trio.fail_after(5):
            item = await local.receive()
        assert item == MemberEvent("g", "suspect", b"C", None, ())


async def test_in_process_members_route_among_themselves_and_report_errors() -> None:
    """An in-process member is a routing-table carrier of its own (no session): two of them
    reach each other, a watcher on a socket sees them, and every refusal is an exception."""
    async with Router(Config(port=0)) as router:
        with pytest.raises(RoutingError) as ei:
            await router.register("jgroups5:g", b"J")
        assert ei.value.code == "forbidden"
        a = await router.register("g", b"A")
        b = await router.register("g", b"B", buffer=2)
        await a.send(b"one")
        await a.send(b"two", dest=b"B")
        with trio.fail_after(5):
            assert await b.receive() == Message("g", b"A", None, b"one")
            assert await b.receive() == Message("g", b"A", b"B", b"two")
        with pytest.raises(RoutingError) as ei:
            await a.send(b"x", dest=b"nobody")
        assert ei.value.code == "unknown_destination"
        # Addresses as the CLI takes them (send --to): the text, or hex:... when not text.
        assert "no member nobody in 'g'" in str(ei.value), ei.value
        with pytest.raises(RoutingError) as ei:
            await a.send(b"x", dest=b"\xee\x01")
        assert "no member hex:ee01 in 'g'" in str(ei.value), ei.value
        with pytest.raises(RoutingError) as ei:
            await a.send(b"x", dest=b"d" * 256)
        assert ei.value.code == "too_long"
        # The application does not read b: beyond its buffer, dropped and counted.
        for i in range(5):
            await a.send(b"%d" % i, dest=b"B")
        assert b.dropped == 3
        assert router.server.hub.counters.drops["in_process_full"] == 3
        await b.leave()
        with pytest.raises(RoutingError) as ei:
            await b.send(b"late")
        assert ei.value.code == "not_member"
        assert str(ei.value).startswith("B is not registered in 'g'"), ei.value
        assert repr(b).endswith("'g' B>"), repr(b)
        # Nothing reached a: its multicast is not echoed to it, and a clean leave is told to
        # watchers only (a counter, not a wait: delivery is synchronous in the hub).
        assert a.outbox.recv.statistics().current_buffer_used == 0


def test_provisioned_config_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[provisioned]]\ngroup = "g"\nname = "x"\n')
    r = subprocess.run([sys.executable, "-m", "gossiprouter", "serve", "--config", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "provisioned[0].addr: missing" in r.stderr
    assert "Traceback" not in r.stderr
    bad.write_text("idle_timeout = 'soon'\n")
    r = subprocess.run([sys.executable, "-m", "gossiprouter", "serve", "--config", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "idle_timeout = 'soon': expected a number" in r.stderr
    bad.write_text("[[provisioned]\n")
    r = subprocess.run([sys.executable, "-m", "gossiprouter", "serve", "--config", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "not valid TOML" in r.stderr and "Traceback" not in r.stderr


async def test_provisioned_from_config_file(tmp_path: Path) -> None:
    from gossiprouter.core.config import build

    f = tmp_path / "router.toml"
    f.write_text('port = 0\n[[provisioned]]\ngroup = "g"\naddr = "hex:0a0b"\nname = "db"\n'
                 'physical = ["10.0.0.9:5432"]\n')
    cfg = build(f)
    async with Router(cfg) as router:
        c = await NativeClient.open(*router.address)
        reply = await c.request(wire.GetMembers(c.req(), "g"))
        assert reply == wire.Ok(1, (wire.MemberInfo(b"\x0a\x0b", "db", (("10.0.0.9", 5432),)),))
        # Never expired.
        router.server.hub.table.expire(trio.current_time() + 1e9)
        assert [e.addr for e in router.members("g")] == [b"\x0a\x0b"]
