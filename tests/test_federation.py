"""Federated membership and routing without a broker (docs/federation.md): routers' Federation
objects wired to each other by hand, so every record, presence and routed message is a call.

The socket tests (real mosquitto) are in tests/test_federation_sockets.py.
"""

from __future__ import annotations

from collections.abc import Callable

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gossiprouter.core.config import Config
from gossiprouter.federation.codec import CHUNK, DELTA, encode_chunk, pack_member
from gossiprouter.federation.remote import RemoteGroup, RemoteMember
from gossiprouter.federation.state import Federation
from gossiprouter.protocol import native as wire
from gossiprouter.protocol.jgroups_address import JAddress
from gossiprouter.routing.entries import Kind, RoutingError
from gossiprouter.sessions.base import Hub
from gossiprouter.sessions.jgroups_common import JWire
from tests.carriers import Named

G = "g"


def F(sender: bytes, payload: bytes, dest: bytes | None = None) -> bytes:
    """A native ROUTE frame of group G: what routed messages carry (they are checked)."""
    return wire.encode_route(G, dest, sender, payload)


class Net:
    """Routers whose federations deliver to each other at once, in call order."""

    def __init__(self, *origins: str) -> None:
        self.feds: dict[str, Federation] = {}
        self.lost: list[str] = []
        for o in origins:
            hub = Hub(Config())
            self.feds[o] = Federation(hub, o, o.upper(), self._sender(o), lambda: None)
        for f in self.feds.values():
            f.begin_sync()
            for other in self.feds:
                f.on_presence(other, f.presence() if other != f.origin else b"")
            f.end_sync()

    def _sender(self, origin: str) -> Callable[[str, bytes], bool]:
        def send(to: str, payload: bytes) -> bool:
            if to in self.lost or origin in self.lost:
                return False
            self.feds[to].on_route(payload, origin)
            return True
        return send

    def sync(self) -> None:
        """Publish every router's dirty records to every other router."""
        for o, f in self.feds.items():
            for group, tag, rec in f.flush():
                for other, g in self.feds.items():
                    if other != o and other not in self.lost:
                        g.on_record(o, group, rec, tag)

    def connect(self, o: str, carrier: Named, addr: bytes, **kw: object) -> None:
        self.feds[o].table.connect(carrier, G, addr, addr.decode(), (("10.0.0.1", 7800),),
                                   **kw)  # type: ignore[arg-type]
        self.sync()


_seqs = iter(range(1, 1 << 30))


def record(members: list[list[object]], run: bytes = b"test") -> bytes:
    """A one-chunk snapshot of ``members`` (each a newer version than the last)."""
    return encode_chunk(run, next(_seqs), 1, 0, [pack_member(m) for m in members])


def kinds(f: Federation, addr: bytes) -> list[str]:
    e = f.table.entry(G, addr)
    return [] if e is None else [type(c).__name__ for c in e.carriers]


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


# --------------------------------------------------------------------------- hostile broker

_scalar = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
           | st.text(max_size=8) | st.binary(max_size=12))
_any = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=3) | st.binary(max_size=3), inner,
                                      max_size=3), max_leaves=12)
_version = st.sampled_from([2, 5]) | _any
_wire = st.none() | st.tuples(_version, st.binary(max_size=40),
                              st.none() | st.lists(st.binary(max_size=20), max_size=2)) | _any
# Mostly well-formed members with hostile values in them (a port out of range or infinite, a
# name or address too long for this router, a provisioned kind), and some of any shape.
_member = st.tuples(
    st.binary(min_size=1, max_size=8) | st.binary(min_size=256, max_size=300),
    st.none() | st.text(max_size=10) | st.text(min_size=300, max_size=300),
    st.lists(st.tuples(st.text(max_size=6), st.integers(-1, 70000) | st.floats()), max_size=3),
    st.integers(0, 4), st.none() | st.text(max_size=4), st.booleans() | _any,
    _wire).map(list) | _any
_seq = st.integers(1, 4) | _any
_record = (st.tuples(st.just(CHUNK) | _any, st.binary(max_size=4) | _any, _seq,
                     st.integers(0, 3) | _any, st.integers(0, 3) | _any,
                     st.lists(_member, max_size=3) | _any).map(list).map(msgpack.packb)
           | st.tuples(st.just(DELTA), st.binary(max_size=4) | _any, _seq,
                       st.lists(_member, max_size=3) | _any,
                       st.lists(st.binary(max_size=8), max_size=2) | _any,
                       st.lists(st.binary(max_size=8) | _any, max_size=2) | _any)
           .map(list).map(msgpack.packb)
           | _any.map(msgpack.packb) | st.binary(max_size=40))
_tag = st.sampled_from(["", "", "c1", "d0", "d1"])
_route = (st.tuples(st.integers(0, 70), st.lists(_any, max_size=5), st.binary(max_size=16)).map(
    lambda t: t[0].to_bytes(2, "big") + msgpack.packb(t[1]) + t[2]) | st.binary(max_size=40))
_presence = (st.dictionaries(st.sampled_from(["v", "name", "ttl"]), _any, max_size=3)
             .map(msgpack.packb) | st.binary(max_size=20))


@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(st.tuples(st.sampled_from(["record", "route", "presence"]),
                          st.sampled_from(["b", "c"]), st.sampled_from([G, "jgroups5:" + G,
                                                                        "jgroups2:" + G]),
                          _record, _route, _presence, _tag), min_size=1, max_size=4))
def test_hostile_federation_payloads_never_crash_and_never_store_what_cannot_be_written(
        msgs: list[tuple[str, str, str, bytes, bytes, bytes, str]]) -> None:
    """Whatever the broker hands the federation's decoders (records, routed messages,
    presences), nothing raises; what cannot be read is counted; every remote member stored
    passes the checks a local CONNECT passes (so no later reply to a client can fail); and
    an honest record still applies afterwards."""
    hub = Hub(Config())
    f = Federation(hub, "a", "A", lambda o, p: True, lambda: None)
    local = Named("local")
    hub.table.connect(local, G, b"local")
    f.begin_sync()
    f.on_presence("b", f.presence())
    f.end_sync()
    for kind, origin, group, rec, route, presence, tag in msgs:
        if kind == "record":
            f.on_record(origin, group, rec, tag)
        elif kind == "route":
            f.on_route(route, "b")
        else:
            f.on_presence(origin, presence, 1.0)
    check = hub.check_registration
    for g in hub.table.groups.values():
        for e in g.entries.values():
            check(g.name, e.addr, e.name, e.physical, e.wire)
    f.on_presence("b", f.presence())
    f.on_record("b", G, record([[b"honest", "h", [["10.0.0.2", 7800]], 1, None, True, None]],
                               run=b"honest"))
    assert hub.table.entry(G, b"honest") is not None
    assert hub.table.entry(G, b"local") is not None


def test_records_a_local_connect_would_refuse_are_refused_and_counted() -> None:
    """Found by the fuzz above: a port that is infinite raised out of the decoder (through
    paho's callback, into the bridge's task); ports out of range, a provisioned kind (an entry
    no record could remove) and names or addresses beyond this router's bounds were stored."""
    net = Net("a", "b")
    b = net.feds["b"]

    def member(**kw: object) -> bytes:
        m = {"addr": b"x", "name": "x", "phys": [["10.0.0.1", 7800]], "kind": 1, **kw}
        return record([[m["addr"], m["name"], m["phys"], m["kind"], None, True, None]])

    bad = [member(phys=[["h", float("inf")]]), member(phys=[["h", 70000]]),
           member(phys=[["h", -1]]), member(kind=2), member(name="n" * 300),
           member(addr=b"x" * 300),
           record([[b"x", "x", [], 1, None, True, [7, b"\x00", None]]])]
    for rec in bad:
        b.on_record("a", G, rec)
        assert b.table.entry(G, b"x") is None and b.table.entry(G, b"x" * 300) is None, rec
    assert b.stats.malformed + b.stats.conflicts == len(bad)
    b.on_record("a", G, member())
    assert b.table.entry(G, b"x") is not None


def test_a_new_members_record_goes_before_its_first_message() -> None:
    """x joins A and sends at once, before A's coalesced flush: A publishes the group's record
    before the routed message (one broker connection keeps the order), so a member of B that
    answers through B finds x there. Before, B dropped the answer as undeliverable."""
    net = Net("a", "b")
    a, b = net.feds["a"], net.feds["b"]
    published: list[tuple[str, str, bytes]] = []

    def publish(group: str) -> None:  # what the bridge does: publish now, in order
        for g, tag, rec in a.flush_group(group):
            published.append(("a", g, rec))
            b.on_record("a", g, rec, tag)
    a.publish = publish
    y = Named("y")
    net.connect("b", y, b"y")
    x = Named("x")
    a.table.connect(x, G, b"x", "x")  # no net.sync(): the flush has not run yet
    for t in a.table.resolve_multicast(G, x):
        t.push(F(b"x", b"hello"))
    assert y.pushed == [(F(b"x", b"hello"), 1)] and len(published) == 1
    # y answers x through B: B knows x now.
    e = b.table.resolve_unicast(G, b"x")
    assert e is not None and e.carrier is not None
    e.carrier.push(F(b"y", b"answer", b"x"))
    assert x.pushed == [(F(b"y", b"answer", b"x"), 1)] and b.stats.undeliverable == 0
    assert a.flush() == []  # nothing left for the coalesced flush


def test_a_hostile_sequence_number_on_a_publication_is_counted_not_raised() -> None:
    """A topic publication whose sequence property int() refuses ("²" passes isdigit(), more
    than 4,300 digits pass both) raised out of paho's callback: the bridge's task, and the
    router, ended. Now it is counted as malformed."""
    from paho.mqtt.client import MQTTMessage
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    from gossiprouter.federation.bridge import Bridge
    from gossiprouter.federation.publications import ORIGIN_PROPERTY, SEQ_PROPERTY

    cfg = Config(bridge=("mqtt://127.0.0.1:1",))
    bridge = Bridge(Hub(cfg), cfg)
    for seq in ("²", "9" * 5000, "12"):
        msg = MQTTMessage(topic=b"gossiprouter/g/p/b/x")
        msg.payload = b"x"
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.UserProperty = [(ORIGIN_PROPERTY, "o"), (SEQ_PROPERTY, seq)]
        msg.properties = props
        bridge._on_message(None, None, msg)  # type: ignore[arg-type]
    assert (bridge.stats.malformed, bridge.stats.received) == (2, 1)


def test_a_member_moved_to_another_router_is_never_suspected_by_a_stale_connection() -> None:
    """x re-registers on B (its connection to A is half-open), then A's idle timeout closes
    the stale connection: nobody, on any router, sees x suspected or leave (R5 across
    routers), with or without reconnect grace at A."""
    for grace in (0.0, 5.0):
        net = Net("a", "b", "c")
        a, c = net.feds["a"], net.feds["c"]
        a.table.grace = grace
        xa, xb, y, w = Named("xa"), Named("xb"), Named("y"), Named("w")
        net.connect("c", y, b"y")
        c.table.watch(w, G)
        net.connect("a", xa, b"x")
        net.connect("b", xb, b"x")
        y.events.clear()
        w.events.clear()
        assert a.table.drop_carrier(xa, 0.0) == []
        net.sync()
        net.sync()
        assert kinds(c, b"x") == ["RemoteMember"] and kinds(a, b"x") == ["RemoteMember"]
        assert (y.events, w.events) == ([], [])


def test_a_leaving_session_is_not_ended_as_one_without_connack() -> None:
    """The session's CONNACK watchdog ended any session not "connected" once 10 s had passed
    since it connected: a router leaving after running longer than that could be cut before
    its withdrawals were acknowledged (and then went by its Last Will, suspected)."""
    from gossiprouter.federation.bridge import Bridge

    cfg = Config(bridge=("mqtt://127.0.0.1:1",))
    bridge = Bridge(Hub(cfg), cfg)
    for state, overdue in (("connecting", True), ("connected", False), ("leaving", False)):
        bridge.state = state
        assert bridge.connack_overdue(10.0, 3600.0) is overdue, state
    bridge.state = "connecting"
    assert not bridge.connack_overdue(10.0, 9.0)


def test_a_lost_router_is_held_in_grace_then_revived_or_dropped() -> None:
    """With a grace (federation_grace), a Last Will or a resync that misses a router holds
    its members: its presence back within the grace changes nothing for them; the grace
    running out drops them as suspected. Ghost groups of a router seen again are dropped
    only once it had the time to publish its records again."""
    net = Net("a", "b", "c")
    a, b, c = net.feds["a"], net.feds["b"], net.feds["c"]
    a.grace = 10.0
    sa = Named("sa")
    net.connect("a", sa, b"a")
    net.connect("b", Named("b1"), b"b1")
    net.connect("c", Named("c1"), b"c1")
    sa.events.clear()
    a.on_presence("c", b"", now=100.0)  # C's Last Will: held
    a.begin_sync()  # a reconnect in which B is not seen (it has not reconnected yet)
    a.end_sync(now=101.0)
    assert a.graced_routers() == 2 and a.table.entry(G, b"b1") is not None
    a.tick(109.0)
    assert sa.events == [] and a.stats.routers_lost == 0
    a.on_presence("b", b.presence(), now=109.5)  # B is back: nothing changes for b1
    a.tick(110.5)  # C's grace ran out: c1 suspected
    assert sa.events == [("suspect", b"c1")] and a.stats.routers_lost == 1
    assert a.table.entry(G, b"b1") is not None and a.stats.routers_revived == 1
    # B never published its record of G again in this session: b1 was a ghost.
    a.tick(109.5 + 4.0)
    assert a.table.entry(G, b"b1") is not None
    a.tick(109.5 + 5.0)
    assert a.table.entry(G, b"b1") is None and a.stats.ghosts_removed == 1
    del c


def test_a_member_back_through_another_router_is_not_served_by_the_lost_one() -> None:
    """Router B (the smaller id) is lost and held in grace; member t, which was on B, comes
    back through C (a restarted router gets a new id). A serves t through C: a carrier whose
    router is out of reach ranks after every live one (the load test's router restart lost
    frames to the dead router when its id sorted first)."""
    net = Net("a", "b", "c")
    a = net.feds["a"]
    a.grace = 10.0
    net.connect("b", Named("tb"), b"t")
    a.on_presence("b", b"", now=100.0)  # B's Last Will: held in grace at A
    assert a.graced_routers() == 1
    tc, s = Named("tc"), Named("s")
    net.connect("c", tc, b"t")
    e = a.table.entry(G, b"t")
    assert e is not None and [c.router for c in e.carriers] == ["b", "c"]  # type: ignore[attr-defined]
    net.connect("a", s, b"s")
    target = a.table.resolve_unicast(G, b"t")
    assert target is not None
    target.carriers[-1].push(F(b"s", b"u", b"t"))
    assert tc.pushed == [(F(b"s", b"u", b"t"), 1)]


def test_a_frame_for_a_member_that_moved_is_handed_on_once_and_duplicates_dropped() -> None:
    """Make-before-break from B to C while A's views lag: what reaches B after the move is
    passed on to C once (marked handed: never passed on again), and C drops what reached
    t already, by A's fan-out numbers (docs/federation.md, Lossless moves)."""
    from gossiprouter.federation.codec import encode_route

    net = Net("a", "b", "c")
    a, b, c = (net.feds[x] for x in "abc")
    s, tb, tc = Named("s"), Named("tb"), Named("tc")
    net.connect("a", s, b"s")
    net.connect("b", tb, b"t")
    net.connect("c", Named("c1"), b"c1")  # so C gets A's multicasts too
    net.connect("c", tc, b"t")  # make: A multicasts to B and C, B ("b" < "c") delivers
    m1 = F(b"s", b"m1")
    for t in a.table.resolve_multicast(G, s):
        t.push(m1)
    assert (tb.pushed, tc.pushed) == ([(m1, 1)], [])
    b.table.disconnect(tb, G, b"t")  # break: nobody has heard of it yet
    m2, u = F(b"s", b"m2"), F(b"s", b"u", b"t")
    for t in a.table.resolve_multicast(G, s):
        t.push(m2)  # C skips it (B carries t, C thinks), B hands it on
    a.send(a.routers["b"], G, b"t", u, 1)  # A's unicast to t's preferred carrier: B
    assert tc.pushed == [(m2, 1), (u, 1)] and b.stats.handed_on == 2
    net.sync()  # C hears B's record: it delivers A's multicasts to t itself from now on
    m3 = F(b"s", b"m3")
    for t in a.table.resolve_multicast(G, s):
        t.push(m3)  # to C only now
    a.send(a.routers["b"], G, None, m3, 1)  # the same fan-out, as it reaches B late
    assert tc.pushed == [(m2, 1), (u, 1), (m3, 1)] and c.stats.duplicates == 1
    # Handed on once, never twice: a handed frame for a member this router does not carry.
    out = b.stats.routed_out
    b.on_route(encode_route("c", G, b"t", 1, m3, True, 99, "a"), "c")
    assert b.stats.routed_out == out and b.stats.undeliverable == 1


def _moved_early() -> tuple[Net, Named, Named, Named]:
    """s on A, t on B, c1 on C; then t connects on C and leaves B before anyone hears of
    either (records not exchanged yet): what A sends t still goes to B."""
    net = Net("a", "b", "c")
    s, tb, tc = Named("s"), Named("tb"), Named("tc")
    net.connect("a", s, b"s")
    net.connect("b", tb, b"t")
    net.connect("c", Named("c1"), b"c1")
    net.feds["c"].table.connect(tc, G, b"t", "t", (("10.0.0.1", 7800),))
    net.feds["b"].table.disconnect(tb, G, b"t")
    return net, s, tb, tc


def _samples(f: Federation) -> dict[tuple[str, tuple[str, ...]], float]:
    from types import SimpleNamespace
    from typing import Any, cast

    from gossiprouter.ops.metrics import federation_metrics

    bridge = cast(Any, SimpleNamespace(federation=f, liveness=SimpleNamespace(links={})))
    return {(x.name, tuple(x.labels.values())): x.value
            for m in federation_metrics(bridge) for x in m.samples}


def test_frames_for_a_member_that_left_before_its_new_router_is_known_are_held() -> None:
    """The DISCONNECT on B comes before B hears that C carries t: what reaches B for t is
    held, handed on to C once C's record arrives, delivered once; a late copy of a multicast
    t already had is dropped at C (counted: frames handed_on, duplicate)."""
    net, s, tb, tc = _moved_early()
    a, b, c = (net.feds[x] for x in "abc")
    m1, u1 = F(b"s", b"m1"), F(b"s", b"u1", b"t")
    for t in a.table.resolve_multicast(G, s):
        t.push(m1)  # B: t gone, held; C: t new there, left to B (where it was first)
    a.send(a.routers["b"], G, b"t", u1, 1)
    assert (tb.pushed, tc.pushed, b.moves.held_frames()) == ([], [], 2)
    assert _samples(b)[("gossiprouter_federation_held_frames", ())] == 2
    net.sync()  # B hears of C: both handed on; C hears t left B
    assert tc.pushed == [(m1, 1), (u1, 1)]
    assert (b.moves.held_frames(), b.stats.handed_on, b.stats.undeliverable) == (0, 2, 0)
    m2 = F(b"s", b"m2")
    for t in a.table.resolve_multicast(G, s):
        t.push(m2)  # to C only now: delivered there
    a.send(a.routers["b"], G, None, m2, 1)  # the same fan-out, as it reaches B late
    assert tc.pushed == [(m1, 1), (u1, 1), (m2, 1)] and c.stats.duplicates == 1
    assert _samples(b)[("gossiprouter_federation_frames_total", ("handed_on",))] == 3
    assert _samples(c)[("gossiprouter_federation_frames_total", ("duplicate",))] == 1


def test_frames_held_for_a_member_that_left_for_good_are_dropped_after_the_hold() -> None:
    from gossiprouter.federation.moves import MOVE_HOLD

    net = Net("a", "b")
    a, b = net.feds["a"], net.feds["b"]
    s, tb = Named("s"), Named("tb")
    net.connect("a", s, b"s")
    b.tick(100.0)
    net.connect("b", tb, b"t")
    b.table.disconnect(tb, G, b"t")
    a.send(a.routers["b"], G, b"t", F(b"s", b"u", b"t"), 1)
    assert b.moves.held_frames() == 1
    b.tick(100.0 + MOVE_HOLD - 0.5)
    assert b.moves.held_frames() == 1
    b.tick(100.0 + MOVE_HOLD)
    assert (b.moves.held_frames(), b.stats.undeliverable, b.moves.held_bytes) == (0, 1, 0)


def test_a_moves_new_router_leaves_multicasts_to_the_first_whatever_the_ids() -> None:
    """t moves from C to B (the smaller id) make-before-break: B publishes t as a newcomer,
    so A sends t's multicasts to C, C delivers them and B does not (by ids alone B would
    while C, not knowing of B yet, still did: twice); once C's leave is known B delivers
    and publishes t as an ordinary member again."""
    from gossiprouter.federation.codec import NEWCOMER

    net = Net("a", "b", "c")
    a = net.feds["a"]
    s, tc, tb = Named("s"), Named("tc"), Named("tb")
    net.connect("a", s, b"s")
    net.connect("c", tc, b"t")
    net.connect("b", Named("b1"), b"b1")
    net.connect("b", tb, b"t")
    rm = a.routers["b"].groups[G][b"t"]
    assert rm.data is not None and rm.data[5] == NEWCOMER and rm.newcomer
    e = a.table.entry(G, b"t")
    assert e is not None and e.carriers[-1].router == "c"  # type: ignore[attr-defined]
    m1 = F(b"s", b"m1")
    for t in a.table.resolve_multicast(G, s):
        t.push(m1)
    assert (tc.pushed, tb.pushed) == ([(m1, 1)], [])
    net.feds["c"].table.disconnect(tc, G, b"t")
    net.sync()  # B hears C's leave: t is B's alone, published as live 1 at the next sync
    net.sync()
    assert not a.routers["b"].groups[G][b"t"].newcomer
    m2 = F(b"s", b"m2")
    for t in a.table.resolve_multicast(G, s):
        t.push(m2)
    assert (tc.pushed, tb.pushed) == ([(m1, 1)], [(m2, 1)])


def test_the_fan_out_number_window_remembers_exactly_the_last_65536() -> None:
    """Seen (federation/moves.py): a ring of bits over the last SEQ_WINDOW numbers from the
    highest; the slots a jump reuses are cleared, whole bytes at once."""
    import random

    from gossiprouter.federation.moves import SEQ_WINDOW, Seen

    rng = random.Random(29)
    w, added, top = Seen(), set(), 0
    for _ in range(3000):
        top += rng.choice((1, 2, 7, 9, 64, 1000, 30_000))
        for seq in (top, top - rng.randrange(50)):
            w.add(seq)
            added.add(seq)
        probe = top - rng.randrange(SEQ_WINDOW)
        assert (probe in w) == (probe in added), probe
    assert top - SEQ_WINDOW in w and top + 1 not in w  # too old: seen; not yet: not
