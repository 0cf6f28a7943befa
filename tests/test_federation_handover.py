"""Federation without a broker (tests/federation_net.py): a lost router held in grace, and
members that move between routers: frames handed on once, held while the new router is
unknown, multicasts left to one router, and the fan-out number window (docs/federation.md).
A whole move through a real mosquitto is in tests/test_federation_moves.py."""

from __future__ import annotations

from gossiprouter.federation.state import Federation
from tests.carriers import Named
from tests.federation_net import F, G, Net


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
