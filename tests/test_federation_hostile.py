"""Federation without a broker (tests/federation_net.py) fed what a hostile broker could send:
payloads of any shape, records a local connect would refuse, hostile sequence numbers; and
the order and life-cycle edges that must hold anyway (docs/federation.md, "Threat model")."""

from __future__ import annotations

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gossiprouter.core.config import Config
from gossiprouter.federation.codec import CHUNK, DELTA
from gossiprouter.federation.state import Federation
from gossiprouter.sessions.base import Hub
from tests.carriers import Named
from tests.federation_net import F, G, Net, kinds, record

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
