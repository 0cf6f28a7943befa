"""The stub's own side: its channels and watches, and where a received frame goes.

:class:`Local` holds what the application asked for (the channels, in creation order, and
the watched groups: the desired state every connection's registrar follows) and hands the
frames the routers send to them: a ROUTE to the channels of its group or to its destination,
a PUBLISH to the channels whose patterns match, an EVENT to the group's channels and watches,
merged over the routers (:mod:`~gossiprouter.client.merge`). It also carries the stub's
counters.

Sans-IO (no trio, no sockets; tested without them in tests/test_client_local.py): a
connection's reader (:mod:`~gossiprouter.client.link`) calls the ``deliver_*`` methods, which
never wait, since one reader serves every channel.
"""

from __future__ import annotations

import itertools

from gossiprouter.client.channel import Channel
from gossiprouter.client.merge import Presence, SuspectFilter
from gossiprouter.client.model import (
    SUSPECT_DEDUPE_WINDOW,
    GroupEvent,
    Key,
    Member,
    Message,
    Publication,
    StubStats,
)
from gossiprouter.client.status import RouterAddress
from gossiprouter.client.streams import Watch
from gossiprouter.core.topics import matches
from gossiprouter.protocol import native as wire


class Local:
    """The channels and watches of one stub, and the delivery of what the routers send."""

    def __init__(self) -> None:
        # The desired state, in creation order; each connection's registrar follows it.
        self.channels: dict[Key, Channel] = {}
        self.by_group: dict[str, list[Channel]] = {}
        self.watchers: dict[str, list[Watch]] = {}
        # join/leave of watched groups, merged over routers
        self.presence = Presence(SUSPECT_DEDUPE_WINDOW)
        self.suspects = SuspectFilter(SUSPECT_DEDUPE_WINDOW)
        self.stats = StubStats()
        self.seq = itertools.count(1)  # arrival order of messages and events

    # ------------------------------------------------------------------ the desired state

    def add_channel(self, ch: Channel) -> None:
        if ch.key in self.channels:
            raise ValueError(f"this stub already has a channel for {ch.addr.hex()} in "
                             f"{ch.group!r}")
        self.channels[ch.key] = ch
        self.by_group.setdefault(ch.group, []).append(ch)

    def remove_channel(self, ch: Channel) -> None:
        """Forget ``ch`` (the registrars then DISCONNECT it) and end its streams."""
        if self.channels.get(ch.key) is ch:
            del self.channels[ch.key]
        chans = self.by_group.get(ch.group)
        if chans is not None and ch in chans:
            chans.remove(ch)
            if not chans:
                del self.by_group[ch.group]
        ch._close()

    def add_watch(self, w: Watch) -> None:
        self.watchers.setdefault(w.group, []).append(w)

    def remove_watch(self, w: Watch) -> bool:
        """End ``w``; True when it was the group's last watch (the group is no longer
        watched: the registrars UNWATCH it)."""
        w._close()
        ws = self.watchers.get(w.group)
        if ws is None or w not in ws:
            return False
        ws.remove(w)
        if ws:
            return False
        del self.watchers[w.group]
        self.presence.forget_group(w.group)
        return True

    def close_all(self) -> None:
        """Forget every channel and watch, ending their streams."""
        for ch in list(self.channels.values()):
            self.remove_channel(ch)
        for ws in self.watchers.values():
            for w in ws:
                w._close()
        self.watchers.clear()

    # ------------------------------------------------------------------ delivering

    def deliver_route(self, f: wire.Route) -> None:
        msg = Message(f.group, f.sender, f.dest, f.payload, next(self.seq))
        if f.dest is None:
            # One copy per connection: every local channel of the group but the sender.
            delivered = False
            for ch in self.by_group.get(f.group, ()):
                if ch.addr != f.sender:
                    ch._put_message(msg)
                    delivered = True
            if not delivered:
                self.stats.undeliverable += 1
        else:
            target = self.channels.get((f.group, f.dest))
            if target is None:
                self.stats.undeliverable += 1
            else:
                target._put_message(msg)

    def deliver_publish(self, f: wire.Publish) -> None:
        tid = (f.provider, f.broadcast, f.partition)
        echo = bool(f.flags & wire.PUB_ECHO)
        pub = Publication(f.group, f.sender, None, f.payload, next(self.seq), tid,
                          "global" if f.flags & wire.PUB_GLOBAL else "local")
        # One copy per connection: every local channel whose patterns match.
        got = False
        for ch in self.by_group.get(f.group, ()):
            if (ch.addr != f.sender or echo) and any(matches(p, tid) for p in ch._patterns):
                ch._put_message(pub)
                got = True
        if not got:
            self.stats.undeliverable += 1

    def deliver_event(self, router: RouterAddress, f: wire.Event, now: float) -> None:
        """An EVENT from ``router``, merged with what the other routers report."""
        member = Member(f.addr, f.name, f.physical)
        if f.kind == "suspect":
            if not self.suspects.first(f.group, f.addr, now):
                self.stats.events_merged += 1
                return
            ev = GroupEvent(f.group, "suspect", member, router, seq=next(self.seq))
            for ch in self.by_group.get(f.group, ()):
                if ch.addr != f.addr:
                    ch._put_event(ev)
            return
        # join / leave go to watchers only; merge them over the routers.
        if f.group not in self.watchers:
            return
        if f.kind == "join":
            news = self.presence.join(f.group, f.addr, router)
        else:
            news = self.presence.leave(f.group, f.addr, router, now)
        if not news:
            self.stats.events_merged += 1
            return
        ev = GroupEvent(f.group, f.kind, member, router, seq=next(self.seq))
        for w in self.watchers.get(f.group, ()):
            w._put(ev)
        for ch in self.by_group.get(f.group, ()):
            if ch.addr != f.addr:
                ch._put_event(ev)
