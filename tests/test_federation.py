"""Federated membership and routing without a broker (docs/federation.md): routers' Federation
objects wired to each other by hand (tests/federation_net.py), so every record, presence and
routed message is a call.

Here: remote members, multicasts and unicasts across routers, records, suspicion, grace and
resyncs. A hostile broker's payloads are in tests/test_federation_hostile.py, members moving
between routers in tests/test_federation_handover.py, the socket tests (real mosquitto) in
tests/test_federation_sockets.py.
"""

from __future__ import annotations

import msgpack

from gossiprouter.core.config import Config
from gossiprouter.federation.remote import RemoteGroup, RemoteMember
from gossiprouter.protocol.jgroups_address import JAddress
from gossiprouter.routing.entries import Kind, RoutingError
from gossiprouter.sessions.base import Hub
from gossiprouter.sessions.jgroups_common import JWire
from tests.carriers import Named
from tests.federation_net import F, G, Net, kinds


def test_a_remote_member_is_an_entry_with_its_data_and_watchers_see_it_join() -> None:
    net = Net("a", "b")
    a, b = net.feds["a"], net.feds["b"]
    w = Named("w")
    b.table.watch(w, G)
    net.connect("a", Named("ca"), b"x")
    e = b.table.entry(G, b"x")
    assert e is not None and (e.name, e.physical) == ("x", (("10.0.0.1", 7800),))
    assert kinds(b, b"x") == ["RemoteMember"]
    assert w.events == [("join", b"x")]
    # A clean leave on A: a leave at B, no suspect.
    a.table.disconnect(Named("ca"), G, b"x")
    net.sync()
    assert b.table.entry(G, b"x") is None
    assert w.events == [("join", b"x"), ("leave", b"x")]


def test_a_multicast_goes_once_to_each_router_and_is_fanned_out_there() -> None:
    net = Net("a", "b", "c")
    a, b, c = (net.feds[x] for x in "abc")
    s = Named("s")
    net.connect("a", s, b"s")
    bs = [Named(f"b{i}") for i in range(3)]
    for i, x in enumerate(bs):
        net.connect("b", x, b"b%d" % i)
    cx = Named("cx")
    net.connect("c", cx, b"c")
    targets = a.table.resolve_multicast(G, s)
    assert sorted(type(t).__name__ for t in targets) == ["RemoteGroup", "RemoteGroup"]
    two = F(b"s", b"1") + F(b"s", b"2")
    for t in targets:
        t.push(two, 2)
    assert [x.pushed for x in bs] == [[(two, 2)]] * 3 and cx.pushed == [(two, 2)]
    assert (b.stats.routed_in, c.stats.routed_in, a.stats.routed_out) == (2, 2, 4)


def test_a_member_on_two_routers_gets_each_message_once() -> None:
    net = Net("a", "b", "c")
    a, b, c = (net.feds[x] for x in "abc")
    ta, tb, tc = Named("ta"), Named("tb"), Named("tc")
    net.connect("b", tb, b"t")
    net.connect("c", tc, b"t")
    # At A: both routers carry t; the preferred (last) is the smallest router id, "b".
    e = a.table.entry(G, b"t")
    assert e is not None and [c.router for c in e.carriers] == ["c", "b"]  # type: ignore[attr-defined]
    s, c1 = Named("s"), Named("c1")
    net.connect("a", s, b"s")
    net.connect("c", c1, b"c1")  # so C gets A's multicasts too
    for t in a.table.resolve_multicast(G, s):
        t.push(F(b"s", b"m"))
    assert (tb.pushed, tc.pushed, c1.pushed) == ([(F(b"s", b"m"), 1)], [], [(F(b"s", b"m"), 1)])
    # A multicast from C's sender: C delivers locally, B must not.
    sc = Named("sc")
    net.connect("c", sc, b"sc")
    for t in c.table.resolve_multicast(G, sc):
        t.push(F(b"sc", b"from-c"))
    assert (tb.pushed, tc.pushed) == ([(F(b"s", b"m"), 1)], [(F(b"sc", b"from-c"), 1)])
    # What B delivers of A's multicasts (cached per group and sender's router) follows t.
    a.send(a.routers["b"], G, None, F(b"s", b"direct"), 1)
    assert tb.pushed[-1] == (F(b"s", b"direct"), 1)
    # t also connects to A: A delivers its own senders' messages locally, B and C nothing.
    net.connect("a", ta, b"t")
    a.send(a.routers["b"], G, None, F(b"s", b"direct-2"), 1)
    assert tb.pushed[-1] == (F(b"s", b"direct"), 1)
    assert kinds(a, b"t") == ["RemoteMember", "RemoteMember", "Named"]
    for t in a.table.resolve_multicast(G, s):
        t.push(b"local")
    assert (ta.pushed, tb.pushed, tc.pushed) == (
        [(b"local", 1)], [(F(b"s", b"m"), 1), (F(b"s", b"direct"), 1)],
        [(F(b"sc", b"from-c"), 1)])
    assert b.receivers(b.table.groups[G], "a") == []


def test_a_stale_connection_never_removes_a_member_another_router_holds() -> None:
    net = Net("a", "b")
    a, b = net.feds["a"], net.feds["b"]
    ta, tb, w = Named("ta"), Named("tb"), Named("w")
    net.connect("a", ta, b"t")
    net.connect("b", tb, b"t")
    a.table.watch(w, G)
    assert a.table.drop_carrier(ta, 0.0) == []
    net.sync()
    assert kinds(a, b"t") == ["RemoteMember"] and kinds(b, b"t") == ["Named"]
    assert w.events == []
    # A DISCONNECT through A leaves A only: t's connection to B is B's.
    net.connect("a", ta, b"t")
    assert a.table.disconnect(ta, G, b"t") == []
    net.sync()
    assert kinds(a, b"t") == ["RemoteMember"] and kinds(b, b"t") == ["Named"]


def test_a_dead_router_is_suspected_and_a_resync_removes_ghosts() -> None:
    net = Net("a", "b", "c")
    a, b = net.feds["a"], net.feds["b"]
    sa, sc = Named("sa"), Named("sc")
    net.connect("a", sa, b"a")
    net.connect("c", Named("c1"), b"c1")
    net.connect("b", Named("b1"), b"b1")
    net.connect("b", Named("b2"), b"b2")
    sa.events.clear()
    a.on_presence("c", b"")  # C's Last Will
    assert sa.events == [("suspect", b"c1")]
    assert a.stats.routers_lost == 1 and a.table.entry(G, b"c1") is None
    # A resync in which B's record for G is not seen again: B's members are ghosts.
    a.begin_sync()
    a.on_presence("b", b.presence())
    a.end_sync()
    assert a.table.entry(G, b"b1") is None and a.stats.ghosts_removed == 2
    del sc


def test_records_carry_jgroups_encodings_identity_and_kind() -> None:
    net = Net("a", "b")
    a, b = net.feds["a"], net.feds["b"]
    addr = JAddress.from_uuid(1, 2, version=5)
    phys = (JAddress.from_ip("10.0.0.9", 7800, version=5),)
    a.table.connect(Named("j"), "jgroups5:" + G, addr.key, "node", (("10.0.0.9", 7800),),
                    identity="alice", wire=JWire(addr, phys))
    a.table.connect(Named("p"), G, b"inproc", kind=Kind.IN_PROCESS)
    net.sync()
    e = b.table.entry("jgroups5:" + G, addr.key)
    assert e is not None and e.wire == JWire(addr, phys) and e.identity == "alice"
    # An in-process member of A is not taken over by a CONNECT on B (rule R2).
    try:
        b.table.connect(Named("x"), G, b"inproc")
    except RoutingError as err:
        assert err.code == "address_in_use"
    else:
        raise AssertionError("took over A's in-process member")


def test_records_are_coalesced_and_unchanged_ones_not_republished() -> None:
    net = Net("a", "b")
    a = net.feds["a"]
    for i in range(100):
        a.table.connect(Named(f"c{i}"), G, b"m%d" % i)
    recs = a.flush()
    assert len(recs) == 1 and a.stats.records_out == 1
    a.on_local(G, None)
    assert a.flush() == []


def test_grace_at_the_members_router_holds_and_hands_over() -> None:
    """t's connection to A drops in A's grace: A still publishes it (not live), B keeps
    routing to A, which holds; t comes back on B: A hands what it held to B."""
    net = Net("a", "b")
    a, b = net.feds["a"], net.feds["b"]
    a.table.grace = 10.0
    ta, tb, s = Named("ta"), Named("tb"), Named("s")
    net.connect("a", ta, b"t")
    net.connect("b", s, b"s")
    a.table.drop_carrier(ta, 0.0)
    net.sync()
    e = b.table.entry(G, b"t")
    assert e is not None and [c.live for c in e.carriers] == [False]  # type: ignore[attr-defined]
    for t in b.table.resolve_multicast(G, s):
        t.push(F(b"s", b"held"))
    assert a.table.entry(G, b"t").held == [F(b"s", b"held")]  # type: ignore[union-attr]
    net.connect("b", tb, b"t")
    assert tb.pushed == [(F(b"s", b"held"), 1)]
    assert isinstance(a.table.entry(G, b"t").carriers[-1], RemoteMember)  # type: ignore[union-attr]
    assert RemoteGroup.fast_id is None and RemoteMember.fast_id is None
    # A's grace ended: its record no longer lists t, so B carries t alone everywhere, and a
    # clean leave on B is a leave for everyone after one record (before: A's stale record
    # kept t a member at B until A had seen B's record and republished).
    net.sync()
    assert kinds(b, b"t") == ["Named"]
    b.table.watch(Named("w"), G)
    assert [n.kind for n in b.table.disconnect(tb, G, b"t")] == ["leave"]
    net.sync()
    assert b.table.entry(G, b"t") is None and a.table.entry(G, b"t") is None


def test_bridge_keepalive_is_checked_at_start() -> None:
    from gossiprouter.core.config import ConfigError
    from gossiprouter.federation.bridge import Bridge

    cfg = Config(bridge=("mqtt://127.0.0.1:1",), bridge_keepalive=70000)
    try:
        Bridge(Hub(cfg), cfg)
    except ConfigError as e:
        assert "at most 65535" in str(e)
    else:
        raise AssertionError("accepted a keepalive MQTT cannot carry")


def test_bad_bridge_values_are_one_line_not_a_traceback() -> None:
    """Checked as the bridge is built (after the listeners' set-up begins): still the one
    ``gossiprouter: error:`` line and status 1, as for a taken port."""
    from click.testing import CliRunner

    from gossiprouter.cli.main import main

    for opt, value, message in (("--bridge-keepalive", "70000", "at most 65535"),
                                ("--bridge-qos", "2", "expected 0 or 1")):
        r = CliRunner().invoke(main, ["serve", "--port", "0", "--bridge", "mqtt://127.0.0.1:1",
                                      opt, value], prog_name="gossiprouter")
        assert r.exit_code == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip().splitlines() == [f"gossiprouter: error: {opt[2:].replace('-', '_')}"
                                                 f" = {value}: {message}"]


def test_a_snapshot_deletes_the_records_of_groups_left_while_cut_off() -> None:
    net = Net("a", "b")
    a = net.feds["a"]
    x, y = Named("x"), Named("y")
    net.connect("a", x, b"x")
    net.connect("b", Named("b1"), b"b1")
    a.table.connect(y, "other", b"y")
    net.sync()
    # Cut off: x leaves, nothing is published; the group lives on here (b1 is in it).
    a.table.disconnect(x, G, b"x")
    snap = {(g, t): r for g, t, r in a.snapshot()}
    assert snap[(G, "")] == b"" and snap[("other", "")] != b""
    assert a.table.entry(G, b"b1") is not None


def test_malformed_federation_messages_are_counted_and_change_nothing() -> None:
    net = Net("a", "b")
    b = net.feds["b"]
    net.connect("a", Named("x"), b"x")
    for bad in (b"", b"\x00", b"\x00\x05\x93\x01", b"\x00\x02\x92\x01"):
        b.on_route(bad, "a")
    for bad in (b"\xc1", b"\x81\xa1m\x91\x93\x01\x02\x03", b"\x90",
                msgpack.packb([1, b"r", 1, 2, 2, []]), msgpack.packb([3, b"r", 1, 1, 0, []])):
        b.on_record("a", G, bad)
    b.on_presence("a", b"\xc1")
    assert b.stats.malformed == 10 and b.table.entry(G, b"x") is not None


def test_a_member_whose_connection_dies_is_suspected_on_the_other_routers_too() -> None:
    net = Net("a", "b")
    b = net.feds["b"]
    x, y = Named("x"), Named("y")
    net.connect("a", x, b"x")
    net.connect("b", y, b"y")
    w = Named("w")
    b.table.watch(w, G)
    net.feds["a"].table.drop_carrier(x, 0.0)  # no DISCONNECT: A suspects it
    net.sync()
    assert y.events == [("suspect", b"x")] and w.events == [("leave", b"x")]


def test_a_router_that_stops_refreshing_its_presence_is_dropped() -> None:
    """Its Last Will can be lost (it died while a persistent broker was down): its retained
    presence then ages out instead of leaving it a ghost with its members."""
    from gossiprouter.federation.remote import PRESENCE_TTL

    net = Net("a", "b")
    a, b = net.feds["a"], net.feds["b"]
    y = Named("y")
    net.connect("a", y, b"y")
    net.connect("b", Named("x"), b"x")
    a.on_presence("b", b.presence(), now=100.0)  # refreshed at 100
    a.expire(100.0 + PRESENCE_TTL - 1)
    assert a.table.entry(G, b"x") is not None
    a.expire(100.0 + PRESENCE_TTL + 1)
    assert a.table.entry(G, b"x") is None and y.events[-1] == ("suspect", b"x")
    assert a.stats.routers_lost == 1
    # A retained copy the broker kept for 55 s has 5 s left (its Message Expiry), not a
    # whole ttl: the dead router goes after those 5 s, not after up to two ttls.
    a.on_presence("b", b.presence(), now=200.0, expiry=5)
    net.connect("b", Named("x2"), b"x2")
    a.expire(206.0)
    assert a.table.entry(G, b"x2") is None and a.stats.routers_lost == 2
