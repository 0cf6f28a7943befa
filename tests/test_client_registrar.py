"""The registrar's plan (gossiprouter.client.registrar), table-driven, without sockets.

Each case is a script run against one connection's :class:`Held` state. Channels are named
by a letter (group ``g``, address the letter); the script sets what the stub wants, simulates
the router's answers and reconnects, and every ``plan`` checks the requests the registrar
would write, in order, as (kind, channel letter or group, pattern).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from gossiprouter.client.model import Key
from gossiprouter.client.registrar import Held, Step, plan
from gossiprouter.core.topics import TopicId

P1: TopicId = ("prov", "news", ())
P2: TopicId = ("prov", "sport", ("eu",))


@dataclass(eq=False)
class FakeChannel:
    """A channel as the plan sees it; hashed by identity, like Channel."""

    group: str
    addr: bytes
    patterns: set[TopicId] = field(default_factory=set)

    @property
    def key(self) -> Key:
        return self.group, self.addr

    @property
    def subscriptions(self) -> frozenset[TopicId]:
        return frozenset(self.patterns)


Op = tuple[Any, ...]
Want = tuple[str, ...]


@dataclass
class Case:
    name: str
    script: list[Op]


CASES = [
    Case("a fresh connection: CONNECT every channel in creation order, then WATCH", [
        ("want", "b", "a", "c"), ("watch", "w1", "w2"),
        ("plan", [("connect", "b"), ("connect", "a"), ("connect", "c"),
                  ("watch", "w1"), ("watch", "w2")]),
        ("plan", []),  # in step: nothing more to send
    ]),
    Case("after a reconnect: the same CONNECTs again, and the patterns after them", [
        ("want", "a", "b"), ("sub", "a", P2), ("sub", "a", P1), ("watch", "w"),
        ("plan", [("connect", "a"), ("connect", "b"), ("watch", "w"),
                  ("subscribe", "a", P1), ("subscribe", "a", P2)]),
        ("reconnect",),
        ("plan", [("connect", "a"), ("connect", "b"), ("watch", "w"),
                  ("subscribe", "a", P1), ("subscribe", "a", P2)]),
    ]),
    Case("a closed channel: DISCONNECT once, and it is leaving until answered", [
        ("want", "a", "b"), ("plan", [("connect", "a"), ("connect", "b")]),
        ("want", "b"), ("plan", [("disconnect", "a")]),
        ("held", {"registered": ["b"], "leaving": ["a"]}),
        ("plan", []),
    ]),
    Case("a channel opened later is CONNECTed alone", [
        ("want", "a"), ("plan", [("connect", "a")]),
        ("want", "a", "b"), ("plan", [("connect", "b")]),
    ]),
    Case("a refused channel is not asked again on this connection", [
        ("want", "a", "b"), ("plan", [("connect", "a"), ("connect", "b")]),
        ("refuse", "a"), ("held", {"registered": ["b"], "refused": ["a"]}),
        ("plan", []),
    ]),
    Case("a refused channel is asked again after a reconnect", [
        ("want", "a"), ("plan", [("connect", "a")]), ("refuse", "a"),
        ("reconnect",), ("plan", [("connect", "a")]),
    ]),
    Case("a new channel with a refused channel's address is asked again", [
        ("want", "a"), ("plan", [("connect", "a")]), ("refuse", "a"),
        ("replace", "a"), ("plan", [("connect", "a")]), ("held", {"registered": ["a"]}),
    ]),
    Case("closing a refused channel sends nothing and forgets the refusal", [
        ("want", "a"), ("plan", [("connect", "a")]), ("refuse", "a"),
        ("want",), ("plan", []), ("held", {}),
    ]),
    Case("an unwatched group: UNWATCH, sorted, before the CONNECTs", [
        ("want", "a"), ("watch", "z", "y", "x"),
        ("plan", [("connect", "a"), ("watch", "z"), ("watch", "y"), ("watch", "x")]),
        ("watch", "x"), ("want", "a", "b"),
        ("plan", [("unwatch", "y"), ("unwatch", "z"), ("connect", "b")]),
    ]),
    Case("a dropped pattern: UNSUBSCRIBE; a new one: SUBSCRIBE", [
        ("want", "a"), ("sub", "a", P1), ("plan", [("connect", "a"), ("subscribe", "a", P1)]),
        ("unsub", "a", P1), ("sub", "a", P2),
        ("plan", [("unsubscribe", "a", P1), ("subscribe", "a", P2)]),
        ("plan", []),
    ]),
    Case("a closed channel's patterns are dropped with it, not unsubscribed", [
        ("want", "a"), ("sub", "a", P1), ("plan", [("connect", "a"), ("subscribe", "a", P1)]),
        ("want",), ("plan", [("disconnect", "a")]),
        ("held", {"leaving": ["a"]}),
    ]),
    Case("a refused channel's patterns are not sent", [
        ("want", "a"), ("plan", [("connect", "a")]), ("refuse", "a"), ("sub", "a", P1),
        ("plan", []),
    ]),
]


def _run(case: Case) -> None:
    channels: dict[str, FakeChannel] = {}
    wanted: dict[Key, FakeChannel] = {}
    watched: dict[str, None] = {}
    held: Held[FakeChannel] = Held()

    def get(letter: str) -> FakeChannel:
        return channels.setdefault(letter, FakeChannel("g", letter.encode()))

    def name(ch: FakeChannel | None) -> str:
        assert ch is not None
        return ch.addr.decode()

    def show(step: Step[FakeChannel]) -> tuple[Any, ...]:
        if step.kind in ("watch", "unwatch"):
            return step.kind, step.group
        if step.kind in ("subscribe", "unsubscribe"):
            return step.kind, name(step.channel), step.pattern
        return step.kind, name(step.channel)

    for op in case.script:
        match op:
            case ("want", *letters):
                wanted = {get(x).key: get(x) for x in letters}
            case ("watch", *groups):
                watched = dict.fromkeys(groups)
            case ("sub", letter, pat):
                get(letter).patterns.add(pat)
            case ("unsub", letter, pat):
                get(letter).patterns.discard(pat)
            case ("refuse", letter):
                held.refuse(get(letter).key, get(letter))
            case ("replace", letter):
                channels[letter] = FakeChannel("g", letter.encode(), set(get(letter).patterns))
                wanted[get(letter).key] = get(letter)
            case ("reconnect",):
                held = Held()
            case ("plan", expected):
                steps = plan(held, wanted, watched.keys())
                assert [show(s) for s in steps] == expected, op
                # Written: as the front does, a written CONNECT makes the channel routable.
                held.routable.update(s.channel for s in steps
                                     if s.kind == "connect" and s.channel is not None)
            case ("held", expected):
                got = {"registered": [name(c) for c in held.registered.values()],
                       "refused": [name(c) for c in held.refused.values()],
                       "leaving": sorted(name(c) for c in held.leaving)}
                assert {k: v for k, v in got.items() if v} == expected, op
                # A withdrawn (DISCONNECT) or refused channel is no longer routable.
                assert held.routable == set(held.registered.values()), op
            case _:
                raise AssertionError(f"unknown script step {op}")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_registrar_plan(case: Case) -> None:
    _run(case)


def test_held_tracks_what_was_sent() -> None:
    # The plan records its requests in Held as if written: the watch set and the patterns
    # sent per channel (the front then moves them to *_acked on the router's OK).
    a = FakeChannel("g", b"a", {P1})
    held: Held[FakeChannel] = Held()
    plan(held, {a.key: a}, {"w": None}.keys())
    assert held.registered == {a.key: a}
    assert held.watching == {"w"}
    assert held.subscribed == {a.key: {P1}}
    held.sub_acked[a.key] = {P1}
    a.patterns.clear()
    plan(held, {a.key: a}, {"w": None}.keys())
    assert held.subscribed == {a.key: set()} and held.sub_acked == {a.key: set()}
