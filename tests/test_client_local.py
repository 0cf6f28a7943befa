"""The stub's own side without sockets: where a received ROUTE, PUBLISH or EVENT goes
(gossiprouter/client/local.py), as a connection's reader hands them over."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import pytest

from gossiprouter.client.channel import Channel
from gossiprouter.client.local import Local
from gossiprouter.client.streams import Watch
from gossiprouter.core.topics import pattern
from gossiprouter.protocol import native as wire
from tests.test_stub import buffered

if TYPE_CHECKING:
    from gossiprouter.client.front import RouterStub

NO_STUB = cast("RouterStub", None)  # Channel and Watch only keep it for the calls they forward
R1, R2 = ("10.0.0.1", 12001), ("10.0.0.2", 12001)


def channel(local: Local, group: str, addr: bytes) -> Channel:
    ch = Channel(NO_STUB, group, addr, None, (), 16, 16)
    local.add_channel(ch)
    return ch


def watch(local: Local, group: str) -> Watch:
    w = Watch(NO_STUB, group, 16)
    local.add_watch(w)
    return w


def test_route_reaches_the_groups_channels_but_the_sender_or_the_one_destination() -> None:
    local = Local()
    a, b, c = channel(local, "g", b"A"), channel(local, "g", b"B"), channel(local, "h", b"A")
    local.deliver_route(wire.Route("g", None, b"A", b"multicast"))
    local.deliver_route(wire.Route("g", b"A", b"B", b"unicast"))
    local.deliver_route(wire.Route("g", b"Z", b"B", b"to nobody here"))
    local.deliver_route(wire.Route("x", None, b"B", b"no channel in x"))
    assert [m.payload for m in buffered(a)] == [b"unicast"]
    assert [m.payload for m in buffered(b)] == [b"multicast"]
    assert buffered(c) == []  # same address, other group
    assert local.stats.undeliverable == 2


def test_publish_reaches_matching_channels_once_and_the_sender_only_with_echo() -> None:
    local = Local()
    a, b = channel(local, "g", b"A"), channel(local, "g", b"B")
    a._patterns |= {pattern("p", "b", ("x", "+")), pattern("p", "b", ("*",))}  # both match
    b._patterns.add(pattern("p", "b", ("y",)))
    local.deliver_publish(wire.Publish("g", b"B", "p", "b", ("x", "1"), 0, b"one"))
    local.deliver_publish(wire.Publish("g", b"A", "p", "b", ("x", "2"), 0, b"own"))
    local.deliver_publish(wire.Publish("g", b"A", "p", "b", ("x", "3"), wire.PUB_ECHO, b"echo"))
    assert [(m.payload, m.topic) for m in buffered(a)] == [
        (b"one", ("p", "b", ("x", "1"))), (b"echo", ("p", "b", ("x", "3")))]
    assert buffered(b) == []
    assert local.stats.undeliverable == 1  # "own": its only match is the sender, no echo


def test_join_and_leave_are_merged_over_the_routers() -> None:
    local = Local()
    w = watch(local, "g")
    ch = channel(local, "g", b"A")
    join, leave = wire.Event("g", "join", b"X"), wire.Event("g", "leave", b"X")
    local.deliver_event(R1, join, 0.0)
    local.deliver_event(R2, join, 0.1)  # the second router's report: no news
    local.deliver_event(R1, leave, 0.2)  # still on R2
    local.deliver_event(R2, leave, 0.3)  # gone from every router
    assert [(e.kind, e.router) for e in buffered(w)] == [("join", R1), ("leave", R2)]
    assert [e.kind for e in buffered(ch.events())] == ["join", "leave"]
    assert local.stats.events_merged == 2
    local.deliver_event(R1, wire.Event("h", "join", b"Y"), 0.4)  # h is not watched
    assert buffered(w) == [] and local.stats.events_merged == 2


def test_a_suspect_is_delivered_once_per_window_to_the_other_channels() -> None:
    local = Local()
    a, x = channel(local, "g", b"A"), channel(local, "g", b"X")
    suspect = wire.Event("g", "suspect", b"X")
    local.deliver_event(R1, suspect, 0.0)
    local.deliver_event(R2, suspect, 0.01)
    assert [(e.kind, e.member.addr) for e in buffered(a.events())] == [("suspect", b"X")]
    assert buffered(x.events()) == []  # not told about itself
    assert local.stats.events_merged == 1


def test_channels_and_watches_come_and_go() -> None:
    local = Local()
    a = channel(local, "g", b"A")
    with pytest.raises(ValueError, match="already has a channel"):
        channel(local, "g", b"A")
    w1, w2 = watch(local, "g"), watch(local, "g")
    assert not local.remove_watch(w1)  # w2 still watches g
    assert local.remove_watch(w2) and "g" not in local.watchers
    local.remove_channel(a)
    assert a.closed and local.channels == {} and local.by_group == {}
