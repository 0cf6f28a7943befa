"""Federated membership and routing: the sans-IO state (docs/federation.md).

The routers of a federation tell each other, through the MQTT broker, which members of
each group they carry. This module holds that state and applies it to the router's own
routing table; :mod:`gossiprouter.federation.peers` does the MQTT I/O (topics, Last Will, the
subscriptions) and calls it with payloads, which :mod:`gossiprouter.federation.codec` encodes
and decodes. No trio, no sockets: tested with bytes.

* A member registered on another router R is an ordinary entry of the table, carried by a
  :class:`RemoteMember` (a :class:`~gossiprouter.routing.entries.RemoteCarrier`): routing rules,
  GET_MEMBERS, events and the JGroups member lists need nothing else. Its ``fanout`` is
  the :class:`RemoteGroup` of (R, group), so a multicast goes once to each router.
* Each router publishes, per group, the members it carries itself (:meth:`Federation.flush`,
  :meth:`Federation.snapshot`); the others apply the difference (:meth:`Federation.on_record`).
* Presence (:meth:`Federation.on_presence`): an empty payload is a router's Last Will; its
  members are dropped as suspected.
* Resync: :meth:`Federation.begin_sync` on every new broker session, :meth:`Federation.end_sync`
  when the marker published after the subscriptions comes back: whatever was not seen again
  in between is a ghost and goes.
* Routed frames (:meth:`Federation.send`, :meth:`Federation.on_route`): one message per run
  of frames and target router, delivered there once per member (exactly once for a member
  on several routers: :meth:`Federation.receivers`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from gossiprouter.federation.codec import (
    PRESENCE_ERRORS,
    RECORD_ERRORS,
    ROUTE_ERRORS,
    Chunk,
    Member,
    decode_presence,
    decode_record,
    decode_route,
    encode_presence,
    encode_route,
    local_members,
)
from gossiprouter.federation.frames import check_routed
from gossiprouter.federation.grace import GHOST_SETTLE, Graces
from gossiprouter.federation.moves import Moves
from gossiprouter.federation.remote import (
    PRESENCE_TTL,
    RECEIVERS_CACHE,
    FederationStats,
    Published,
    RemoteMember,
    RemoteRouter,
    Stream,
    deletions,
    delta_records,
)
from gossiprouter.routing.entries import Carrier, Group, Notice, RemoteCarrier, RoutingError
from gossiprouter.sessions.base import Hub

log = logging.getLogger("gossiprouter.federation.state")

def _nothing() -> None:
    pass


class Federation(Graces):
    """This router's view of the federation, applied to ``hub.table``.

    ``send(router origin, payload)`` publishes routed frames to that router (False: not
    connected or too slow); ``dirty()`` asks the I/O side to call :meth:`flush` soon.
    """

    def __init__(self, hub: Hub, origin: str, name: str,
                 send: Callable[[str, bytes], bool], dirty: Callable[[], None]) -> None:
        self.hub = hub
        self.table = hub.table
        self.origin = origin
        self.name = name
        self._send = send
        self._dirty_cb = dirty
        self.stats = FederationStats()
        self.routers: dict[str, RemoteRouter] = {}
        self.epoch = 0
        self.synced = False
        # Seconds a lost router's members are held before they are dropped as suspected
        # (federation_grace; 0: at once). A broker outage shorter than this changes nothing.
        self.grace = 0.0
        # Set by leave(): this router is shutting down and has withdrawn its records, so the
        # connections it closes now change nothing the others see.
        self.leaving = False
        # group -> addresses removed as suspected since its last record
        self.dirty: dict[str, set[bytes]] = {}
        # group -> what was published of it (records.py); this run's id in every record
        self.published: dict[str, Published] = {}
        self.run = os.urandom(8)
        # The largest record the broker takes (set from its CONNACK by the I/O side).
        self.max_record = 131_072
        # (group, tag) of stale retained records of an earlier run, to delete at the flush
        self.stale: list[tuple[str, str]] = []
        self.table.on_local = self.on_local
        # Set by the I/O side: publishes flush_group(group) at once if it can (see send()).
        self.publish: Callable[[str], None] | None = None
        # (group, sending router) -> (the group, its rev, receivers): a multicast from another
        # router walks the group's members once per change of the group, not once per message.
        self._receivers: dict[tuple[str, str],
                              tuple[Group, int, list[Carrier], frozenset[Carrier]]] = {}
        # Lossless moves: fan-out numbers, hand-ons, holds, duplicates (moves.py).
        self.moves = Moves(self)
        # While True, routed messages wait for flush_routes() (the compiled fast path's
        # upcalls, server/remote_share.py) rather than for the I/O side's end-of-tick task;
        # set by the I/O side: sends what waits.
        self.holding = False
        self.flush_routes: Callable[[], None] = _nothing
        # Called when what the remote share of a route depends on changes other than through
        # the routing table (a router's liveness or grace, a member's live mark): the relay
        # thread's link forgets the routes it learned (server/broker_link.py).
        self.routing_changed: Callable[[], None] = _nothing
        # Set by the I/O side: wake() when a deadline of tick() is set (its ticker sleeps
        # until next_due()), and the clock of the moves' holds (here the last tick's).
        self.wake: Callable[[], None] = _nothing
        self.clock: Callable[[], float] = lambda: self.moves.now
        # Called with (writer, group, member or None, frames, local receivers) after routed
        # frames of a native group were delivered here as received, nothing else to do for
        # them (no grace, no move watched): the relay thread's link learns to deliver the
        # next ones itself (server/broker_link.py). None: no link.
        self.learned_in: Callable[[str, str, bytes | None, bytes, list[Carrier]], None] | None \
            = None

    # ------------------------------------------------------------------ views

    def remote_members(self) -> int:
        return sum(len(m) for r in self.routers.values() for m in r.groups.values())

    def live_routers(self) -> int:
        return sum(1 for r in self.routers.values() if r.alive)

    def peers(self, limit: int = 100) -> list[dict[str, Any]]:
        """The other live routers for /groups, by origin (at most ``limit``): who carries
        the remote members, and how many in how many groups."""
        out = []
        for origin in sorted(o for o, r in self.routers.items() if r.alive)[:limit]:
            r = self.routers[origin]
            out.append({"origin": origin, "name": r.name, "groups": len(r.groups),
                        "members": sum(len(m) for m in r.groups.values()),
                        **({} if r.grace_until is None else {"in_grace": True})})
        return out

    # ------------------------------------------------------------------ publishing

    def on_local(self, group: str, suspected: bytes | None) -> None:
        """The table's hook: the members this router carries in ``group`` may have changed."""
        if self.leaving:
            return
        s = self.dirty.get(group)
        if s is None:
            s = self.dirty[group] = set()
            if len(self.dirty) == 1:
                self._dirty_cb()
        if suspected is not None:
            s.add(suspected)

    def presence(self) -> bytes:
        return encode_presence(self.name, PRESENCE_TTL)

    def records(self) -> list[tuple[str, str, bytes]]:
        """Every group's snapshot again (the periodic refresh: see RECORD_TTL)."""
        return [rec for group, pub in self.published.items()
                for rec in pub.snapshot(group, self.max_record)]

    def flush(self) -> list[tuple[str, str, bytes]]:
        """The records to publish (retained) for the groups changed since the last call:
        (group, tag, payload); an empty payload deletes what the topic retains."""
        stale, self.stale = self.stale, []
        return [(g, t, b"") for g, t in stale] + [
            rec for group in list(self.dirty) for rec in self.flush_group(group)]

    def leave(self) -> list[tuple[str, str, bytes]]:
        """A clean shutdown: the deletion of every record published, so the others see this
        router's members leave (not suspected), and nothing published after it (the local
        connections closing next would otherwise be suspects in the records)."""
        self.leaving = True
        self.dirty = {}
        old, self.published = self.published, {}
        self.stats.records_out += len(old)
        return [rec for group, pub in old.items() for rec in deletions(group, pub)]

    def flush_group(self, group: str) -> list[tuple[str, str, bytes]]:
        """The records to publish for ``group`` if it changed since it was last flushed: one
        delta (more only beyond the broker's packet size), a snapshot when it is due."""
        suspected = self.dirty.pop(group, None)
        if suspected is None:
            return []
        g = self.table.groups.get(group)
        members = {} if g is None else {m[0]: m for m in local_members(g)}
        pub = self.published.get(group)
        if pub is None:
            if not members:
                return []
            self.moves.mark(g, members, None)
            pub = self.published[group] = Published(self.run)
            pub.update(members)
            out = pub.snapshot(group, self.max_record)
        else:
            self.moves.left_here(g, [a for a in pub.members if a not in members])
            self.moves.mark(g, members, pub)
            out = delta_records(group, pub, members, suspected, self.max_record)
            if not members:
                del self.published[group]
                out += deletions(group, pub)
            elif pub.compaction_due():
                out += pub.snapshot(group, self.max_record)
        self.stats.records_out += len(out)
        return out

    def snapshot(self) -> list[tuple[str, str, bytes]]:
        """Every record, after a (re)connect: each group with members carried here, and the
        deletion of every group published before that has none now (the broker may still
        retain it from before the outage)."""
        self.dirty = {}
        out = []
        for name, pub in list(self.published.items()):
            g = self.table.groups.get(name)
            members = {} if g is None else {m[0]: m for m in local_members(g)}
            if not members:
                del self.published[name]
                out += deletions(name, pub)
            else:
                self.moves.mark(g, members, pub)
                pub.update(members)
        for name, g in self.table.groups.items():
            if name not in self.published and (ms := local_members(g)):
                self.moves.mark(g, (members := {m[0]: m for m in ms}), None)
                pub = self.published[name] = Published(self.run)
                pub.update(members)
        for name, pub in self.published.items():
            out += pub.snapshot(name, self.max_record)
        self.stats.records_out += len(out)
        return out

    # ------------------------------------------------------------------ receiving state

    def begin_sync(self) -> None:
        """A new broker session: what its retained messages bring is the truth."""
        self.epoch += 1
        self.synced = False

    def end_sync(self, now: float = 0.0) -> None:
        """The marker came back: every retained message of this session has been received.
        Routers and records not seen since :meth:`begin_sync` are ghosts. With a grace, a
        router not seen is held in grace (it may simply not have reconnected yet, after a
        broker restart), and the groups of a router seen are checked once it has had the
        time to publish them again (its records follow its presence)."""
        self.stats.resyncs += 1
        notices: list[Notice] = []
        for r in list(self.routers.values()):
            r.pending.clear()
            if not r.alive:
                notices += self._drop_router(r)
            elif r.epoch < self.epoch:
                notices += self._lose(r, now)
            elif self.grace > 0:
                r.ghost_check_at = now + min(self.grace, GHOST_SETTLE)
            else:
                notices += self._drop_ghosts(r)
        self.synced = True
        self.wake()
        self.hub.deliver(notices)

    def expire(self, now: float) -> None:
        """Drop the routers whose presence was not refreshed in time (see PRESENCE_TTL). Only
        while this router is connected: otherwise it could not have heard them."""
        notices: list[Notice] = []
        for r in list(self.routers.values()):
            if r.alive and r.expires is not None and r.expires < now:
                log.warning("federation: router %s has not refreshed its presence: dropped",
                            r.label)
                notices += self._drop_router(r)
        self.hub.deliver(notices)

    def on_presence(self, origin: str, payload: bytes, now: float = 0.0,
                    left: bool = False, expiry: int | None = None) -> None:
        """A router's presence; empty: it is gone, by its Last Will (its members are
        suspected) or, with ``left``, by a clean shutdown (they leave, unsuspected: its
        record deletions normally removed them already). ``expiry``: the seconds the broker
        says the presence has left (MQTT 5 Message Expiry of a retained copy), which wins
        over its ``ttl``: a copy retained for a while is not fresh."""
        if origin == self.origin:
            return
        r = self.routers.get(origin)
        if not payload:
            if r is not None:
                # A clean shutdown is news; a death (killed, cut off from the broker) is a
                # WARNING, whether or not a grace holds its members meanwhile.
                log.log(logging.INFO if left else logging.WARNING, "federation: router %s %s",
                        r.label, "left (shut down)" if left else "is gone (Last Will)")
                self.hub.deliver(self._drop_router(r, suspect=False) if left
                                 else self._lose(r, now))
            return
        try:
            name, ttl = decode_presence(payload)
        except PRESENCE_ERRORS as e:
            self.stats.malformed += 1
            log.debug("federation: bad presence of %r: %s", origin, e)
            return
        new = r is None
        if r is None:
            r = self.routers[origin] = RemoteRouter(origin, fed=self)
        r.name = name
        if new:
            log.info("federation: router %s is up", r.label)
        if expiry is not None and ttl and ttl > 0:
            ttl = min(ttl, expiry)
        r.expires = None if not ttl or ttl <= 0 else now + ttl
        if not r.alive or r.grace_until is not None:
            self.routing_changed()
        r.alive = True
        r.epoch = self.epoch
        if r.grace_until is not None:
            # Back within its grace (a broker outage, a reconnect): nothing changed for its
            # members; the records it publishes again say what did meanwhile.
            r.grace_until = None
            self.stats.routers_revived += 1
            log.info("federation: router %s is back within its grace", r.label)
            if self.synced and self.grace > 0:
                r.ghost_check_at = now + min(self.grace, GHOST_SETTLE)
                self.wake()
        pending, r.pending = r.pending, {}
        for (group, tag), rec in pending.items():
            self.on_record(origin, group, rec, tag)

    def on_record(self, origin: str, group: str, payload: bytes, tag: str = "") -> None:
        """A record of router ``origin`` for ``group`` (``tag``: "" the head, ``c<i>`` a
        chunk, ``d<j>`` a delta slot; docs/federation.md, "Records")."""
        if origin == self.origin:
            self._own_record(group, tag, payload)
            return
        r = self.routers.get(origin)
        if r is None or not r.alive:
            if not self.synced:
                # The retained burst may bring a record before its router's presence.
                if r is None:
                    r = self.routers[origin] = RemoteRouter(origin, fed=self)
                r.pending[(group, tag)] = payload
            return
        if not payload:
            if not tag:  # the group's record deleted: its members left
                self.stats.records_in += 1
                r.streams.pop(group, None)
                self.hub.deliver(self._apply(r, group, [], set()))
            return
        try:
            rec = decode_record(payload)
            if isinstance(rec, Chunk) and (rec.part == 0) != (tag == ""):
                raise ValueError("a chunk on another chunk's topic")
        except RECORD_ERRORS as e:
            self.stats.malformed += 1
            log.debug("federation: bad record of %r for %r: %s", origin, group, e)
            return
        st = r.streams.get(group)
        if st is None:
            cap = self.table.limits.max_groups
            if cap > 0 and max(cap, 1024) <= len(r.streams):  # bounded like the groups
                self.stats.conflicts += 1
                return
            st = r.streams[group] = Stream()
        self.stats.records_in += 1
        r.record_epochs[group] = self.epoch
        notices: list[Notice] = []
        for kind, data in st.add(rec):
            if kind == "snapshot":
                assert isinstance(data, list)
                notices += self._apply(r, group, data, set(), keep_stream=True)
            else:
                assert not isinstance(data, list)
                notices += self._change(r, group, r.groups.get(group, {}), data.leaves,
                                        data.joins, data.suspected)
        self.hub.deliver(notices)

    def _own_record(self, group: str, tag: str, payload: bytes) -> None:
        """This router's own record, as the broker retains it. One on a topic this router
        does not use now is stale: a persistent broker restored it after a crash (its
        deletion came after the broker's last save), or an earlier run left it. Deleted
        through the flush, else its members would be ghosts elsewhere for as long as this
        router lives. (The echo of a record deleted since is deleted once more: harmless;
        a topic in use is overwritten by the snapshot published on every connect.)"""
        if not payload or self.leaving:
            return
        pub = self.published.get(group)
        if not tag:
            if pub is None:
                self.published[group] = Published(self.run)
                self.on_local(group, None)
        elif pub is None or not pub.uses(tag):
            self.stale.append((group, tag))
            self._dirty_cb()

    def _apply(self, r: RemoteRouter, group: str, members: list[Member],
               suspected: set[bytes], keep_stream: bool = False) -> list[Notice]:
        """Router ``r`` carries exactly ``members`` of ``group`` (a snapshot)."""
        if not keep_stream:
            r.streams.pop(group, None)
        held = r.groups.get(group, {})
        new = {m[0]: m for m in members}
        return self._change(r, group, held, [a for a in held if a not in new],
                            list(new.values()), suspected)

    def _change(self, r: RemoteRouter, group: str, held: dict[bytes, RemoteMember],
                leaves: list[bytes], joins: list[Member],
                suspected: set[bytes]) -> list[Notice]:
        """``leaves`` left ``group`` on ``r`` (as suspected if in ``suspected``), ``joins``
        joined or changed there."""
        table = self.table
        notices: list[Notice] = []
        # Bounded like local state: remote groups count in max_groups, a router's members capped.
        cap, max_groups = self.hub.config.federation_members_per_router, table.limits.max_groups
        total = sum(len(h) for h in r.groups.values())
        for addr in leaves:
            rm = held.pop(addr, None)
            if rm is not None:
                notices += table.unlink_remote(rm, group, addr, suspect=addr in suspected)
                if self.moves.newcomer_here(group, addr):
                    self.on_local(group, None)  # its move done: published live 1 again
        for m in joins:
            addr = m[0]
            known = held.get(addr)
            if known is not None and known.data == m:
                continue
            rm = known if known is not None else RemoteMember(self, r, group, addr)
            if rm.live_there != bool(m[5]):
                self.routing_changed()
            rm.live = bool(m[5])
            rm.data = m
            try:
                if (known is None and cap and total >= cap) or (
                        group not in table.groups and 0 < max_groups <= len(table.groups)):
                    raise RoutingError("limit", "federation_members_per_router or max_groups")
                before = table.entry(group, addr)
                graced = before is not None and before.grace_until is not None
                if table.check is not None:
                    # This router's own bounds and codecs too: the other router's may differ
                    # (another config or version, or a hostile publisher on the broker), and
                    # a member stored here must never make a reply to a local client fail.
                    table.check(group, addr, m[1], m[2], m[6])
                _, n, frames = table.connect(rm, group, addr, m[1], m[2], kind=m[3],
                                             identity=m[4], wire=m[6], remote=True)
            except RoutingError as e:
                self.stats.conflicts += 1
                log.debug("federation: %s's member %s of %r refused here: %s", r.label,
                          addr.hex(), group, e.message)
                if addr in held:
                    notices += table.unlink_remote(held.pop(addr), group, addr, suspect=False)
                continue
            total += known is None
            held[addr] = rm
            notices += n
            self.moves.arrived(table.groups.get(group), addr, rm)  # it moved here from there
            for f in frames:  # held here in grace: handed to the router it came back to
                self.send(r, group, addr, f, 1, handed=True)
            if graced:
                # Its grace here ended (it came back on that router): this router's record,
                # which listed it as held here, must drop it, or the others keep routing
                # to this router and keep it a member after it has left there.
                self.on_local(group, None)
        if held:
            r.groups[group] = held
        else:
            r.groups.pop(group, None)
            r.record_epochs.pop(group, None)
            r.fanouts.pop(group, None)
        return notices

    def _drop_router(self, r: RemoteRouter, suspect: bool = True) -> list[Notice]:
        notices: list[Notice] = []
        for group, held in r.groups.items():
            for addr, rm in held.items():
                notices += self.table.unlink_remote(rm, group, addr, suspect=suspect)
        if r.alive:
            if suspect:
                self.stats.routers_lost += 1
            else:
                self.stats.routers_left += 1
        self.routers.pop(r.origin, None)
        r.groups.clear()
        r.streams.clear()
        r.alive = False
        self.routing_changed()
        return notices

    # ------------------------------------------------------------------ routing

    def send(self, remote: RemoteRouter, group: str, dest: bytes | None, frames: bytes,
             count: int, handed: bool = False, seq: int = 0, src: str | None = None,
             multicast: bool = False) -> None:
        """Frames for ``dest`` (None: the group) through router ``remote``: one message,
        numbered by fan-out (the same frames pushed to several routers share the number)
        unless ``seq`` is given (a hand-on keeps the number of ``src``, where it came from).

        A change of the group's members still waiting for the coalesced flush is published
        first: the sender may have just joined, and a receiver answering it through its own
        router must find it there (one broker connection keeps the order). Without this a
        reply to a new member was dropped as undeliverable for the flush delay.
        """
        if group in self.dirty and self.publish is not None:
            self.publish(group)
        if src is None and not handed:
            seq = self.moves.number(frames)
        if self._send(remote.origin, encode_route(
                self.origin, group, dest, count, frames, handed, seq, src, multicast)):
            self.stats.routed_out += count
        else:
            self.stats.not_forwarded += count

    def on_route(self, payload: bytes, writer: str) -> None:
        """Frames router ``writer`` sent here (the subtree they came from): delivered to
        local connections; those for a member that moved to another router are handed on
        to it once, marked handed (never passed on again), and the frames handed on here
        that already reached the member are dropped (docs/federation.md, Lossless moves)."""
        try:
            rt = decode_route(payload)
            if rt.origin != writer:
                raise ValueError(f"router {rt.origin!r} in the subtree of {writer!r}")
        except ROUTE_ERRORS as exc:
            self.stats.malformed += 1
            log.debug("federation: bad routed message: %s", exc)
            return
        origin, group, dest, frames = rt.origin, rt.group, rt.dest, rt.frames
        count = rt.frame_count
        self.stats.routed_in += count
        # Nothing from the broker reaches a client socket unread (frames.py).
        r = self.routers.get(origin)
        g = self.table.groups.get(group)
        senders = (() if r is None or not r.alive else  # handed on: a member of the group
                   (g.entries if g is not None else ()) if rt.handed
                   else r.groups.get(group, {}))
        why = check_routed(group, frames, count, self.hub.config.max_frame, senders)
        if why is not None:
            self.stats.refused += count
            log.debug("federation: routed frames from %r refused: %s", origin, why)
            return
        table = self.table
        if g is None:
            self.stats.undeliverable += count
            return
        if dest is not None:
            entry = g.entries.get(dest)
            c = None if entry is None or not entry.carriers else entry.carriers[-1]
            if rt.src is not None and self.moves.handed_twice(rt, dest):
                return
            if c is not None and not isinstance(c, RemoteCarrier):
                c.push(frames, count)
                self.stats.delivered_in += count
                if self.learned_in is not None and not (rt.handed or g.graced):
                    self.learned_in(origin, group, dest, frames, [c])
            elif entry is not None and not entry.carriers:
                table.hold(entry, frames)
            elif rt.handed or not self.moves.unicast(g, dest, c, rt):
                # Handed on frames are never passed on again (nothing loops).
                self.stats.undeliverable += count
            return
        key = (group, origin)
        cached = self._receivers.get(key)
        if cached is None or cached[0] is not g or cached[1] != g.rev:
            targets = self.receivers(g, origin)
            cached = (g, g.rev, targets, frozenset(targets))
            if len(self._receivers) >= RECEIVERS_CACHE:
                self._receivers.clear()
            self._receivers[key] = cached
            self.moves.refresh(g)
        targets = cached[2]
        for t in targets:
            t.push(frames, count)
        self.stats.delivered_in += count * len(targets)
        for e in g.graced:
            table.hold(e, frames)
        self.moves.multicast(g, origin, rt.seq, frames, count, cached[3])
        if (self.learned_in is not None and targets and not (rt.handed or g.graced)
                and self.moves.quiet(group)):
            self.learned_in(origin, group, None, frames, targets)

    def receivers(self, g: Group, origin: str) -> list[Carrier]:
        """The local connections that get a multicast ``origin`` sent to group ``g``: one per
        connection carrying a member this router must deliver to (not when another router
        does: :meth:`Moves.delivered_elsewhere`)."""
        out: dict[Carrier, None] = {}
        for e in g.entries.values():
            cs = e.carriers
            if not cs:
                continue
            c = cs[-1]
            if isinstance(c, RemoteCarrier) or c in out:
                continue
            if len(cs) > 1 and self.moves.delivered_elsewhere(g, e, origin):
                continue
            out[c] = None
        return list(out)
