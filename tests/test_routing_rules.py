"""The routing-entry rules, table-driven (issue 4, acceptance 1; docs/routing.md names these).

Each case is a script of operations on a pure RoutingTable, then the table it
must leave (group -> addr -> carriers, newest last) and every notice emitted,
in order. Carriers are names here (tests/carriers.py): the table only hashes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from gossiprouter.routing.entries import Kind, Limits, Notice, RoutingError
from gossiprouter.routing.table import RoutingTable
from tests.carriers import named as N

Op = tuple[Any, ...]


@dataclass
class Case:
    name: str
    ops: list[Op]
    table: dict[str, dict[bytes, list[str]]]
    notices: list[tuple[str, str, bytes, tuple[str, ...]]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    held: list[bytes] = field(default_factory=list)
    grace: float = 0.0
    suspect_events: bool = True


CASES = [
    Case("one entry per (group, address)",
         [("connect", "c1", "g", b"A"), ("connect", "c1", "g", b"A"), ("connect", "c1", "h", b"A")],
         {"g": {b"A": ["c1"]}, "h": {b"A": ["c1"]}}),
    Case("second connection becomes the carrier, first is the fall-back",
         [("connect", "c1", "g", b"A"), ("connect", "c2", "g", b"A")],
         {"g": {b"A": ["c1", "c2"]}}),
    Case("restart with the same address before the old connection is noticed",
         [("connect", "c1", "g", b"A"), ("connect", "c9", "g", b"B"),
          ("connect", "c2", "g", b"A"), ("drop", "c1")],
         {"g": {b"A": ["c2"], b"B": ["c9"]}}),  # nobody suspected: A is still reachable
    Case("closing the newest connection falls back to the older one",
         [("connect", "c1", "g", b"A"), ("connect", "c2", "g", b"A"), ("drop", "c2")],
         {"g": {b"A": ["c1"]}}),
    Case("the member leaves when its last connection goes: one suspect",
         [("connect", "c1", "g", b"A"), ("connect", "c2", "g", b"A"),
          ("connect", "c3", "g", b"B"), ("drop", "c2"), ("drop", "c1")],
         {"g": {b"B": ["c3"]}},
         [("suspect", "g", b"A", ("c3",))]),
    Case("re-register with identical data only refreshes",
         [("watch", "w", "g"), ("connect", "c1", "g", b"A", "a"),
          ("connect", "c1", "g", b"A", "a")],
         {"g": {b"A": ["c1"]}},
         [("join", "g", b"A", ("w",))]),
    Case("DISCONNECT removes at once, from any of its connections, without suspect",
         [("watch", "w", "g"), ("connect", "c1", "g", b"A"), ("connect", "c2", "g", b"A"),
          ("connect", "c3", "g", b"B"), ("disconnect", "c1", "g", b"A")],
         {"g": {b"B": ["c3"]}},
         [("join", "g", b"A", ("w",)), ("join", "g", b"B", ("w",)), ("leave", "g", b"A", ("w",))]),
    Case("DISCONNECT of an address this connection did not register",
         [("connect", "c1", "g", b"A"), ("disconnect", "c2", "g", b"A")],
         {"g": {b"A": ["c1"]}}, errors=["not_member"]),
    Case("a connection holding two addresses in one group: both removed and suspected",
         [("connect", "c1", "g", b"A1"), ("connect", "c1", "g", b"A2"),
          ("connect", "c2", "g", b"B"), ("drop", "c1")],
         {"g": {b"B": ["c2"]}},
         [("suspect", "g", b"A1", ("c2",)), ("suspect", "g", b"A2", ("c2",))]),
    Case("a connection holding addresses in several groups is dropped everywhere",
         [("connect", "c1", "g", b"A"), ("connect", "c1", "h", b"A"), ("connect", "c1", "h", b"X"),
          ("connect", "c2", "h", b"B"), ("drop", "c1")],
         {"h": {b"B": ["c2"]}},
         [("suspect", "h", b"A", ("c2",)), ("suspect", "h", b"X", ("c2",))]),
    Case("suspect events can be switched off; watchers still see leave",
         [("watch", "w", "g"), ("connect", "c1", "g", b"A"), ("connect", "c2", "g", b"B"),
          ("drop", "c1")],
         {"g": {b"B": ["c2"]}},
         [("join", "g", b"A", ("w",)), ("join", "g", b"B", ("w",)), ("leave", "g", b"A", ("w",))],
         suspect_events=False),
    Case("attempt to overwrite a provisioned entry",
         [("provision", "g", b"P"), ("connect", "c1", "g", b"P")],
         {"g": {b"P": []}}, errors=["forbidden"]),
    Case("attempt to DISCONNECT a provisioned entry",
         [("provision", "g", b"P"), ("disconnect", "c1", "g", b"P")],
         {"g": {b"P": []}}, errors=["forbidden"]),
    Case("a provisioned entry survives expiry",
         [("provision", "g", b"P"), ("expire", 1e9)],
         {"g": {b"P": []}}),
    Case("attempt to take over an in-process address",
         [("local", "L", "g", b"A"), ("connect", "c1", "g", b"A")],
         {"g": {b"A": ["L"]}}, errors=["address_in_use"]),
    Case("an in-process member takes over a connection's address",
         [("connect", "c1", "g", b"A"), ("local", "L", "g", b"A"), ("drop", "c1")],
         {"g": {b"A": ["L"]}}),
    Case("expiry of a non-sticky entry",
         [("connect", "c0", "g", b"B"), ("local", "L", "g", b"A", 10.0), ("expire", 9.0),
          ("expire", 10.0)],
         {"g": {b"B": ["c0"]}},
         [("suspect", "g", b"A", ("c0",))]),
    Case("merge: the later expiry wins",
         [("local", "L", "g", b"A", 10.0), ("local", "L", "g", b"A", 20.0),
          ("local", "L", "g", b"A", 15.0), ("expire", 19.0)],
         {"g": {b"A": ["L"]}}),
    Case("another identity cannot take an address (authentication on)",
         [("connect", "c1", "g", b"A", None, "alice"), ("connect", "c2", "g", b"A", None, "bob")],
         {"g": {b"A": ["c1"]}}, errors=["address_in_use"]),
    Case("the same identity on a new connection may",
         [("connect", "c1", "g", b"A", None, "alice"), ("connect", "c2", "g", b"A", None, "alice")],
         {"g": {b"A": ["c1", "c2"]}}),
    Case("reconnect grace: traffic held and handed over, no events",
         [("connect", "c1", "g", b"A"), ("connect", "c2", "g", b"B"), ("drop", "c1"),
          ("hold", "g", b"A", b"m1"), ("hold", "g", b"A", b"m2"), ("expire", 1.5),
          ("connect", "c3", "g", b"A"), ("expire", 5.0)],
         {"g": {b"A": ["c3"], b"B": ["c2"]}},
         held=[b"m1", b"m2"], grace=2.0),
    Case("reconnect grace runs out: removed, then the events",
         [("connect", "c1", "g", b"A"), ("connect", "c2", "g", b"B"), ("drop", "c1"),
          ("hold", "g", b"A", b"m1"), ("expire", 1.0), ("expire", 2.0)],
         {"g": {b"B": ["c2"]}},
         [("suspect", "g", b"A", ("c2",))], grace=2.0),
    Case("watchers need not be members; unwatch stops events",
         [("watch", "w", "g"), ("connect", "c1", "g", b"A"), ("unwatch", "w", "g"),
          ("connect", "c2", "g", b"B")],
         {"g": {b"A": ["c1"], b"B": ["c2"]}},
         [("join", "g", b"A", ("w",))]),
]


def _audience(n: Notice) -> tuple[object, ...]:
    """Who the hub tells of ``n`` (Hub.flush_notices): every connection carrying a member of
    the group for a suspect, the group's watchers for a join or leave."""
    return n.group.targets() if n.kind == "suspect" else tuple(n.group.watchers)


def run_case(case: Case) -> tuple[RoutingTable, list[Any], list[str], list[bytes]]:
    t = RoutingTable(grace=case.grace, suspect_events=case.suspect_events)
    notices: list[Any] = []  # (kind, group, addr, targets at the time of the operation)
    errors: list[str] = []
    held: list[bytes] = []
    now = 0.0
    for op in case.ops:
        try:
            match op:
                case ("connect", c, g, a, *rest):
                    name = rest[0] if rest else None
                    ident = rest[1] if len(rest) > 1 else None
                    _, n, h = t.connect(N(c), g, a, name, identity=ident)
                    notices += n
                    held += h
                case ("local", c, g, a, *rest):
                    _, n, _ = t.connect(N(c), g, a, kind=Kind.IN_PROCESS,
                                        expires_at=rest[0] if rest else None)
                    notices += n
                case ("provision", g, a):
                    t.connect(None, g, a, kind=Kind.PROVISIONED, sticky=True)
                case ("disconnect", c, g, a):
                    notices += t.disconnect(N(c), g, a)
                case ("drop", c):
                    notices += t.drop_carrier(N(c), now)
                case ("hold", g, a, frame):
                    e = t.resolve_unicast(g, a)
                    assert e is not None and e.carrier is None
                    assert t.hold(e, frame)
                case ("expire", when):
                    now = when
                    notices += t.expire(when)
                case ("watch", c, g):
                    t.watch(N(c), g)
                case ("unwatch", c, g):
                    t.unwatch(N(c), g)
                case _:
                    raise AssertionError(f"bad op {op}")
        except RoutingError as e:
            errors.append(e.code)
        notices = [n if isinstance(n, tuple) else
                   (n.kind, n.entry.group, n.entry.addr, tuple(map(str, _audience(n))))
                   for n in notices]
    return t, notices, errors, held


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_rule(case: Case) -> None:
    t, notices, errors, held = run_case(case)
    table = {
        g.name: {a: [str(c) for c in e.carriers] for a, e in g.entries.items()}
        for g in t.groups.values()
        if g.entries
    }
    assert table == case.table
    assert notices == case.notices
    assert errors == case.errors
    assert held == case.held


def test_traffic_goes_to_the_newest_live_connection() -> None:
    t = RoutingTable()
    t.connect(N("c1"), "g", b"A")
    t.connect(N("c2"), "g", b"A")
    e = t.resolve_unicast("g", b"A")
    assert e is not None and e.carrier == N("c2")
    t.drop_carrier(N("c2"), 0.0)
    assert e.carriers == [N("c1")]
    # Registering again on c1 makes c1 the newest again.
    t.connect(N("c3"), "g", b"A")
    t.connect(N("c1"), "g", b"A")
    assert e.carriers == [N("c3"), N("c1")]


def test_multicast_targets() -> None:
    t = RoutingTable()
    t.connect(N("ca"), "g", b"A")
    t.connect(N("cb"), "g", b"B")
    t.connect(N("cc"), "g", b"C1")
    t.connect(N("cc"), "g", b"C2")
    assert set(t.resolve_multicast("g", N("ca"))) == {N("cb"), N("cc")}
    # cc carries another member of g, so it keeps its copy of C1's multicast.
    assert set(t.resolve_multicast("g", N("cc"))) == {N("ca"), N("cb"), N("cc")}
    # JGroups semantics: the sender gets its own multicast back.
    everyone = {N("ca"), N("cb"), N("cc")}
    assert set(t.resolve_multicast("g", N("ca"), include_sender=True)) == everyone
    # A's older connection is not a target: one copy per member, to its newest connection.
    t.connect(N("ca2"), "g", b"A")
    assert set(t.resolve_multicast("g", N("cb"))) == {N("ca2"), N("cb"), N("cc")} - {N("cb")}
    assert t.resolve_multicast("nope", N("ca")) == ()


def test_registrations_and_drop() -> None:
    t = RoutingTable()
    t.connect(N("c1"), "g", b"A")
    t.connect(N("c1"), "h", b"B")
    assert set(t.registrations(N("c1"))) == {("g", b"A"), ("h", b"B")}
    assert t.groups_of(N("c1")) == {"g", "h"}
    assert t.holds(N("c1"), "g", b"A") and not t.holds(N("c1"), "g", b"B")
    t.drop_carrier(N("c1"), 0.0)
    assert t.registrations(N("c1")) == {}
    assert t.groups == {}


def test_limits() -> None:
    t = RoutingTable(limits=Limits(addresses_per_connection=2, groups_per_connection=1))
    t.connect(N("c"), "g", b"A")
    with pytest.raises(RoutingError) as e:
        t.connect(N("c"), "h", b"A")
    assert e.value.code == "limit" and "groups" in e.value.message
    t.connect(N("c"), "g", b"B")
    with pytest.raises(RoutingError) as e:
        t.connect(N("c"), "g", b"C")
    assert e.value.code == "limit" and "addresses" in e.value.message
    t.connect(N("c"), "g", b"A")  # re-registering is not a new registration


def test_groups_per_connection_follows_leaves() -> None:
    """The per-connection group count is kept as registrations come and go: a group frees
    its slot when the connection's last registration in it leaves, not before."""
    t = RoutingTable(limits=Limits(groups_per_connection=2))
    t.connect(N("c"), "g", b"A")
    t.connect(N("c"), "g", b"B")
    t.connect(N("c"), "h", b"A")
    with pytest.raises(RoutingError) as e:
        t.connect(N("c"), "k", b"A")
    assert e.value.code == "limit" and "groups" in e.value.message
    t.disconnect(N("c"), "g", b"A")  # c still holds B in g: g keeps its slot
    assert t.groups_of(N("c")) == {"g", "h"}
    with pytest.raises(RoutingError):
        t.connect(N("c"), "k", b"A")
    t.remove("g", b"B")  # the last one in g (removed by the operator): the slot is free
    assert t.groups_of(N("c")) == {"h"}
    t.connect(N("c"), "k", b"A")
    assert t.groups_of(N("c")) == {"h", "k"}
    t.connect(N("other"), "k", b"A")  # the same member through a second connection
    t.connect(N("other"), "g", b"Z")
    assert t.groups_of(N("other")) == {"k", "g"}
    t.drop_carrier(N("other"), 0.0)
    assert t.groups_of(N("other")) == set()
    assert t.groups_of(N("c")) == {"h", "k"}  # c still carries A in k
    t.drop_carrier(N("c"), 0.0)
    assert t.groups_of(N("c")) == set()
    t.connect(N("c"), "m", b"A")  # the same carrier object again starts from nothing
    t.connect(N("c"), "n", b"A")
    assert t.groups_of(N("c")) == {"m", "n"}


def test_grace_buffer_is_bounded() -> None:
    t = RoutingTable(grace=5.0, grace_buffer_bytes=10)
    t.connect(N("c1"), "g", b"A")
    t.drop_carrier(N("c1"), 0.0)
    e = t.resolve_unicast("g", b"A")
    assert e is not None
    assert t.hold(e, b"12345")
    assert t.hold(e, b"67890")
    assert not t.hold(e, b"x")
    assert t.stats.grace_dropped == 1
    assert t.next_deadline() == 5.0
