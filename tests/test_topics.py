"""The matching rules of topic multicast (gossiprouter.core.topics), table-driven."""

from __future__ import annotations

import random

import pytest

from gossiprouter.core.topics import (
    MAX_DEPTH,
    MAX_ELEMENT,
    TopicError,
    TopicId,
    TopicIndex,
    format_topic,
    matches,
    parse_topic,
    pattern,
    topic_id,
)
from gossiprouter.protocol import native as wire
from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.routing.entries import Kind, RoutingError
from gossiprouter.routing.table import RoutingTable
from tests.carriers import named

P, B = "vehicle-17", "position"

# (pattern partition, id partition, matches?)
PARTITION_CASES: list[tuple[tuple[str, ...], tuple[str, ...], bool]] = [
    ((), (), True),
    ((), ("eu",), False),
    (("eu",), (), False),
    (("eu",), ("eu",), True),
    (("eu",), ("us",), False),
    (("eu", "de"), ("eu", "de"), True),
    (("eu", "de"), ("eu",), False),
    (("eu", "de"), ("eu", "de", "munich"), False),
    # '+' is exactly one level
    (("+",), ("eu",), True),
    (("+",), (), False),
    (("+",), ("eu", "de"), False),
    (("eu", "+", "munich"), ("eu", "de", "munich"), True),
    (("eu", "+", "munich"), ("eu", "de", "berlin"), False),
    (("+", "+"), ("a", "b"), True),
    # '*' as the last element: any number of levels, zero included
    (("*",), (), True),
    (("*",), ("eu",), True),
    (("*",), ("eu", "de", "munich"), True),
    (("eu", "*"), ("eu",), True),
    (("eu", "*"), ("eu", "de", "munich"), True),
    (("eu", "*"), ("us", "ny"), False),
    (("eu", "*"), (), False),
    (("eu", "+", "*"), ("eu",), False),
    (("eu", "+", "*"), ("eu", "de"), True),
    (("eu", "+", "*"), ("eu", "de", "munich", "x"), True),
    # wildcard characters inside a longer element are literal
    (("e+",), ("eu",), False),
    (("e+",), ("e+",), True),
    (("a*",), ("a*",), True),
    (("a*",), ("ab",), False),
    # unicode is compared exactly (no normalisation)
    (("münchen",), ("münchen",), True),
    (("münchen",), ("mu\u0308nchen",), False),
    (("東京", "+"), ("東京", "渋谷"), True),
    (("🚗",), ("🚗",), True),
]


@pytest.mark.parametrize(("pp", "ip", "expected"), PARTITION_CASES)
def test_partition_rules(pp: tuple[str, ...], ip: tuple[str, ...], expected: bool) -> None:
    pat, tid = pattern(P, B, pp), topic_id(P, B, ip)
    assert matches(pat, tid) is expected
    # the index gives the same answer as the rule
    idx: TopicIndex[str] = TopicIndex()
    idx.subscribe("m", pat)
    assert idx.match(tid) == ({"m"} if expected else set())


@pytest.mark.parametrize(("pat", "tid", "expected"), [
    ((P, B, ()), (P, B, ()), True),
    (("+", B, ()), ("vehicle-18", B, ()), True),
    ((P, "+", ("eu",)), (P, "speed", ("eu",)), True),
    ((P, "+", ("eu",)), (P, "speed", ("us",)), False),
    (("+", "+", ("*",)), ("x", "y", ("a", "b")), True),
    ((P, B, ()), ("vehicle-18", B, ()), False),
    ((P, B, ()), (P, "speed", ()), False),
])
def test_provider_and_broadcast_levels(pat: TopicId, tid: TopicId, expected: bool) -> None:
    assert matches(pattern(*pat), topic_id(*tid)) is expected
    idx: TopicIndex[int] = TopicIndex()
    idx.subscribe(1, pattern(*pat))
    assert bool(idx.match(topic_id(*tid))) is expected


@pytest.mark.parametrize(("args", "message"), [
    ((P, B, ("*", "eu")), "last partition element"),
    ((P, "*", ()), "last partition element"),
    (("*", B, ()), "last partition element"),
    ((P, B, ("eu", "")), "must not be empty"),
    (("", B, ()), "provider must not be empty"),
    ((P, "", ()), "broadcast must not be empty"),
    ((P, B, "eu/de"), "list of strings"),
    ((P, B, ("eu", 3)), "must be a string"),
    ((P, B, ("x" * (MAX_ELEMENT + 1),)), f"longer than {MAX_ELEMENT} bytes"),
    ((P, B, ("é" * (MAX_ELEMENT // 2 + 1),)), f"longer than {MAX_ELEMENT} bytes"),
    ((P, B, ("a",) * (MAX_DEPTH + 1)), f"deeper than {MAX_DEPTH}"),
    ((P, B, ("\ud800",)), "lone surrogate"),
])
def test_invalid_patterns(args: tuple[object, object, object], message: str) -> None:
    with pytest.raises(TopicError, match=message):
        pattern(*args)


def test_limits_are_inclusive() -> None:
    pattern(P, B, ("a",) * MAX_DEPTH)
    pattern(P, B, ("x" * MAX_ELEMENT,))
    topic_id(P, B, ("é" * (MAX_ELEMENT // 2),))
    pattern(P, B, ("a",) * (MAX_DEPTH - 1) + ("*",))


@pytest.mark.parametrize("part", [("+",), ("eu", "*"), ("*",)])
def test_publication_ids_are_concrete(part: tuple[str, ...]) -> None:
    with pytest.raises(TopicError, match="concrete"):
        topic_id(P, B, part)
    with pytest.raises(TopicError, match="concrete"):
        topic_id("+", B, ())


def test_one_delivery_per_member_however_many_patterns_match() -> None:
    idx: TopicIndex[str] = TopicIndex()
    for pp in [("eu", "de", "munich"), ("eu", "+", "munich"), ("eu", "*"), ("*",)]:
        assert idx.subscribe("a", pattern(P, B, pp))
    idx.subscribe("b", pattern(P, B, ("us", "*")))
    assert idx.match(topic_id(P, B, ("eu", "de", "munich"))) == {"a"}
    assert len(idx) == 5


def test_subscribe_is_idempotent_and_counts_members_per_pattern() -> None:
    idx: TopicIndex[str] = TopicIndex()
    pat = pattern(P, B, ("eu", "*"))
    assert idx.subscribe("a", pat)
    assert not idx.subscribe("a", pat)
    assert idx.subscribe("b", pat)
    assert idx.counts[pat] == 2
    assert idx.unsubscribe("a", pat)
    assert not idx.unsubscribe("a", pat)
    assert idx.counts[pat] == 1
    assert idx.remove_member("b") == [pat]
    assert not idx and not idx.counts
    # every trie node was pruned
    assert idx._root.empty()


def test_remove_member_reports_only_patterns_nobody_holds() -> None:
    idx: TopicIndex[str] = TopicIndex()
    shared, own = pattern(P, B, ("+",)), pattern(P, B, ("eu", "de"))
    idx.subscribe("a", shared)
    idx.subscribe("a", own)
    idx.subscribe("b", shared)
    assert idx.remove_member("a") == [own]
    assert idx.match(topic_id(P, B, ("eu",))) == {"b"}
    assert idx.match(topic_id(P, B, ("eu", "de"))) == set()


def test_index_agrees_with_the_rule_on_random_subscriptions() -> None:
    rnd = random.Random(13)
    words = ["a", "b", "c"]
    pats: list[tuple[int, TopicId]] = []
    idx: TopicIndex[int] = TopicIndex()
    for m in range(300):
        depth = rnd.randrange(0, 4)
        part = [rnd.choice([*words, "+"]) for _ in range(depth)]
        if rnd.random() < 0.3:
            part.append("*")
        pat = pattern(rnd.choice(["p", "+"]), "b", part)
        pats.append((m, pat))
        idx.subscribe(m, pat)
    for m, pat in pats[::3]:
        idx.unsubscribe(m, pat)
    live = pats[:]
    del live[::3]
    for _ in range(300):
        tid = topic_id(rnd.choice(["p", "q"]), "b",
                       [rnd.choice(words) for _ in range(rnd.randrange(0, 5))])
        assert idx.match(tid) == {m for m, pat in live if matches(pat, tid)}


def test_format_and_parse_for_the_cli() -> None:
    t = (P, B, ("eu", "+", "*"))
    assert parse_topic(format_topic(t)) == t
    assert parse_topic("p/b") == ("p", "b", ())
    with pytest.raises(TopicError, match="PROVIDER/BROADCAST"):
        parse_topic("justone")


# --------------------------------------------------------------------------- lifecycle in the table

EU = pattern(P, B, ("eu", "*"))
MUNICH = topic_id(P, B, ("eu", "de", "munich"))


def _table(grace: float = 0.0) -> tuple[RoutingTable, list[tuple[str, list[TopicId], bool]]]:
    t = RoutingTable(grace=grace)
    calls: list[tuple[str, list[TopicId], bool]] = []
    t.on_patterns = lambda g, pats, added: calls.append((g, pats, added))
    return t, calls


def test_subscriptions_need_the_registration_on_this_connection() -> None:
    t, _ = _table()
    c1, c2 = named("c1"), named("c2")
    t.connect(c1, "g", b"A")
    with pytest.raises(RoutingError) as ei:
        t.subscribe(c2, "g", b"A", EU)
    assert ei.value.code == "not_member"
    with pytest.raises(RoutingError):
        t.subscribe(c1, "g", b"B", EU)


def test_subscriptions_go_with_a_clean_leave_and_the_union_is_reference_counted() -> None:
    t, calls = _table()
    c = named("c")
    t.connect(c, "g", b"A")
    t.connect(c, "g", b"B")
    assert t.subscribe(c, "g", b"A", EU)
    assert t.subscribe(c, "g", b"B", EU)
    assert calls == [("g", [EU], True)]
    assert {e.addr for e in t.topic_targets("g", MUNICH)} == {b"A", b"B"}
    t.disconnect(c, "g", b"A")
    assert calls == [("g", [EU], True)]  # B still holds it
    assert {e.addr for e in t.topic_targets("g", MUNICH)} == {b"B"}
    t.disconnect(c, "g", b"B")
    assert calls[-1] == ("g", [EU], False)
    assert t.topic_targets("g", MUNICH) == set()
    assert t.patterns() == {}


def test_subscriptions_survive_reconnect_grace_and_go_when_it_ends() -> None:
    t, calls = _table(grace=5.0)
    c1, c2 = named("c1"), named("c2")
    t.connect(c1, "g", b"A")
    t.subscribe(c1, "g", b"A", EU)
    t.drop_carrier(c1, now=0.0)
    (e,) = t.topic_targets("g", MUNICH)
    assert e.carrier is None  # held for it meanwhile
    t.connect(c2, "g", b"A")  # reconnected in time: same entry, same subscriptions
    assert [x.carrier for x in t.topic_targets("g", MUNICH)] == [c2]
    t.drop_carrier(c2, now=10.0)
    t.expire(now=16.0)
    assert t.topic_targets("g", MUNICH) == set()
    assert calls[-1] == ("g", [EU], False)


def test_subscriptions_go_when_the_entry_expires_or_is_taken_over() -> None:
    t, _ = _table()
    c = named("c")
    t.connect(c, "g", b"A", expires_at=1.0)
    t.subscribe(c, "g", b"A", EU)
    t.expire(now=2.0)
    assert t.topic_targets("g", MUNICH) == set()
    t.connect(c, "g", b"B")
    t.subscribe(c, "g", b"B", EU)
    t.connect(None, "g", b"B", kind=Kind.IN_PROCESS)
    assert t.topic_targets("g", MUNICH) == set()


def test_subscription_limit_per_member() -> None:
    t, _ = _table()
    t.limits.subscriptions_per_member = 2
    c = named("c")
    t.connect(c, "g", b"A")
    t.subscribe(c, "g", b"A", pattern(P, B, ("a",)))
    t.subscribe(c, "g", b"A", pattern(P, B, ("b",)))
    assert not t.subscribe(c, "g", b"A", pattern(P, B, ("b",)))  # already held: no limit
    with pytest.raises(RoutingError) as ei:
        t.subscribe(c, "g", b"A", pattern(P, B, ("c",)))
    assert ei.value.code == "limit"


# --------------------------------------------------------------------------- wire frames

@pytest.mark.parametrize("frame", [
    wire.Subscribe(1, "g", b"A", "p", "b", ("eu", "+", "*")),
    wire.Unsubscribe(2, "g", b"A", "p", "b", ()),
    wire.Publish("g", b"A", "p", "b", ("münchen",), wire.PUB_GLOBAL | wire.PUB_ECHO, b"x"),
])
def test_topic_frames_round_trip(frame: wire.Frame) -> None:
    d = wire.Decoder()
    d.feed(wire.encode(frame))
    assert d.frames() == [frame]


def test_encode_publish_is_the_publish_frame() -> None:
    f = wire.Publish("g", b"A", "p", "b", ("eu",), 1, b"x")
    assert wire.encode_publish("g", b"A", "p", "b", ("eu",), 1, b"x") == wire.encode(f)
    assert f.scope == "global"


PUB, SUB = wire.FrameType.PUBLISH, wire.FrameType.SUBSCRIBE


@pytest.mark.parametrize(("fields", "message"), [
    ([PUB, "g", b"A", "p", "b", ["eu"], 0, "text"], "payload must be binary"),
    ([PUB, "g", b"A", "p", "b", ["eu"], 256, b""], "flags out of range"),
    ([PUB, "g", b"A", "p", "b", [1], 0, b""], "partition elements"),
    ([SUB, 1, "g", b"A", "p", "b"], "takes 6 fields"),
    ([SUB, 1, "g", b"A", "p", 7, []], "broadcast must be a string"),
])
def test_malformed_topic_frames(fields: list[object], message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        wire.frame_from_body(wire._packb(fields))
