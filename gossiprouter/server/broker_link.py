"""The federation broker's connection on the relay thread (issue 30; ``relay/broker.c``,
docs/federation.md, "The routed path on the relay thread").

A native frame of a federated group used to cost the sending router a wake-up of Python for
its remote share (server/remote_share.py): the thread relayed the local copies and handed the
frame up, and Python batched, signed and published it. With the link, the thread publishes it
too, as Python would:

* **Writes.** For a broker session on plain TCP, the bridge hands the socket's writes to the
  thread (:meth:`BrokerLink.open`): paho's bytes go through :meth:`BrokerLink.write`, in one
  ordered stream with the thread's own messages.
* **Learning.** When :meth:`FastPath.learn_native` teaches the thread a route with a remote
  share while the session is up (:meth:`BrokerLink.enable`), :meth:`BrokerLink.targets`
  resolves its remote receivers as :meth:`RemoteShare.send` would for each frame (the routers
  carrying the group, or the router carrying the member), each with its route topic and the
  start of the routed message's header. A group with a membership change not yet published
  gets none (Federation.send publishes it first: Python routes those frames).
* **Staleness.** The routing table's changes forget a group's routes as before; a change of
  the federation the remote share depends on (a router's liveness or grace, a member's record,
  the session) forgets every route with fed targets (:meth:`BrokerLink.invalidate`).
* **Order.** Before the thread reads a connection again after Python handled some of its
  frames, what Python batched is published (:meth:`BrokerLink.before_read`), so a route's
  frames reach the broker in the order they were sent.
* **Counters.** What the thread published or dropped is folded into the bridge's counters by
  :meth:`collect` (with the fast path's: the reaper, and operations before they read them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgpack

from gossiprouter.federation.frames import j5_header, route_header
from gossiprouter.federation.remote import RemoteMember
from gossiprouter.server.remote_share import remote_targets

if TYPE_CHECKING:
    from gossiprouter.federation.link_side import LinkSide
    from gossiprouter.routing.entries import Carrier
    from gossiprouter.sessions.base import Hub

# Prefixes of routed messages' headers kept (group, member) -> bytes; beyond, forgotten.
PREFIXES_CACHE = 4096
# What a closing link may still write of what waits (seconds): paho's last packets.
CLOSE_FLUSH = 0.5


class BrokerLink:
    """The relay thread's side of the broker connection (federation/link.py, ``Link``)."""

    def __init__(self, relay: Any, mod: Any, hub: Hub,
                 ids: Callable[[list[Carrier]], list[int] | None],
                 slot: Callable[[str], int]) -> None:
        self.relay = relay
        self.mod = mod  # the extension (its constants)
        self.hub = hub
        self._ids = ids  # FastPath.ids: the receivers' connection ids, attached (or None)
        self._slot = slot  # FastPath.slot: a group's invalidation slot
        # The broker connection as the thread reads it (None: not read by the thread), and
        # where what it hands up goes (BrokerSession._on_fed).
        self.in_cid: int | None = None
        self._feed: Callable[[str, bytes], None] | None = None
        self._writers: dict[str, int] = {}  # other router -> the thread's reader index
        # index -> (router, its route topic here, its origin as a header has it)
        self._readers: list[tuple[str, bytes, bytes]] = []
        self.owner: LinkSide | None = None
        self.routing = False
        self._dsts: dict[str, int] = {}  # other router -> the thread's destination index
        self._origins: list[str] = []  # index -> router
        self._prefixes: dict[tuple[str, bytes | None], bytes] = {}
        self.opened = 0  # broker sessions whose writes went through the link (tests)
        self.read_in = 0  # routed messages the thread read and handled (tests, profiles)
        self.dropped = 0  # bytes for the broker dropped when a link closed or broke
        self.write_errors = 0

    # ------------------------------------------------------------------ the federation's side

    def open(self, fd: int, feed: Callable[[str, bytes], None]) -> bool:
        relay, mod = self.relay, self.mod
        relay.link_open(fd)
        try:
            self.in_cid = relay.open(fd, mod.MQTT, mod.MAX_HOLD)
            relay.read(self.in_cid, False)
        except OSError:
            self.close()  # (nothing half taken: Python keeps the socket whole)
            raise
        self._feed = feed
        self.opened += 1
        return True

    def resume(self, raw: bool) -> None:
        if self.in_cid is not None:
            self.relay.read(self.in_cid, raw)

    def upcall(self, kind: int, data: bytes) -> None:
        """The thread's upcall about the broker connection (FastPath._handle)."""
        feed = self._feed
        if feed is None:
            return
        mod = self.mod
        feed("data" if kind == mod.DATA else "eof" if kind == mod.EOF else "error", data)

    def floor(self, run: str) -> int:
        n: int = self.relay.link_floor(run)
        return n

    def seen(self, run: str, seq: int) -> None:
        self.relay.link_seen(run, seq)

    def learn_in(self, writer: str, group: str, dest: bytes | None, frames: bytes,
                 targets: list[Carrier]) -> None:
        owner = self.owner
        # 2.12 frames carry no sender the thread could match (nor a length it could check).
        if not self.routing or owner is None or self.in_cid is None or group.startswith(
                "jgroups2:"):
            return
        max_frame = self.hub.config.max_frame  # (what check_routed allows, any group)
        if group.startswith("jgroups5:"):
            kind, key = self.mod.JG5, j5_header(frames, max_frame)
        else:
            kind, key = self.mod.NATIVE, route_header(frames, max_frame)
        ids = self._ids(targets)
        if key is None or not ids:
            return
        w = self._writers.get(writer)
        if w is None:
            topic, origin = owner.in_topic(writer), msgpack.packb(writer)
            w = self._writers[writer] = self.relay.link_writer(topic, origin,
                                                               owner.age_ms(writer))
            if w >= 0:
                self._readers.append((writer, topic, origin))
        if w >= 0:
            self.relay.link_learn_in(w, msgpack.packb(group) + msgpack.packb(dest), key,
                                     max_frame, ids, self._slot(group), kind)

    def write(self, data: bytes | bytearray) -> int:
        n: int = self.relay.link_write(data)
        return n

    def pending(self) -> int:
        n: int = self.relay.link_pending()
        return n

    def close(self) -> None:
        self.routing = False
        if self.in_cid is not None:  # the thread reads it no more
            self.relay.close(self.in_cid)
            self.in_cid = None
        self._feed = None
        self.relay.link_close(CLOSE_FLUSH)
        self.collect()

    def enable(self, owner: object) -> None:
        from gossiprouter.federation.link_side import LinkSide

        assert isinstance(owner, LinkSide)
        self.owner = owner
        self.relay.link_enable(*owner.params())
        self.relay.link_inbound(owner.names())
        self.routing = True

    def disable(self) -> None:
        if self.routing:
            self.routing = False
            self.relay.link_disable()

    def invalidate(self) -> None:
        if self.routing:
            self.relay.link_invalidate()

    def fanout(self) -> int:
        n: int = self.relay.fanout()
        return n

    def seed(self, n: int) -> None:
        """Fan-out numbers go on after ``n`` (what Python numbered before the link)."""
        self.relay.fanout(n)

    # ------------------------------------------------------------------ the fast path's side

    def targets(self, group: str, dest: bytes | None) -> list[tuple[int, bytes]] | None:
        """The fed targets of a route of ``group`` to ``dest`` (None: the group) with a remote
        share: (destination, header start) for each router it goes to, resolved as
        :meth:`RemoteShare.send` resolves each frame; None when the thread must not publish
        them (Python does: the session is not up, a change of the group waits to be
        published, a router beyond the thread's table)."""
        owner = self.owner
        if not self.routing or owner is None:
            return None
        fed = owner.federation
        if group in fed.dirty:
            return None
        remote = remote_targets(self.hub.table, group, dest)
        if not remote:
            return None
        out = []
        for t in remote:
            if t.fed is not fed:
                return None
            dst = self._dst(owner, t.remote.origin)
            if dst < 0:
                return None
            out.append((dst, self._prefix(owner.origin, group,
                                          t.addr if isinstance(t, RemoteMember) else None)))
        return out

    def before_read(self) -> None:
        """Python may have batched frames of a connection the thread reads again: they are
        published first (the thread publishes the next ones at the end of its round)."""
        owner = self.owner
        if owner is not None:
            owner.flush_batched()

    def collect(self) -> None:
        """Fold what the thread published or dropped since the last call into the bridge's
        counters (as Python counts its own: Peers._send_route, _flush_routes)."""
        if not self.opened:  # (no bridge, or no session yet: nothing to fold)
            return
        (rows, got, oversized, queue_full, errors, dropped,
         replayed) = self.relay.link_collect()
        self.write_errors += errors
        self.dropped += dropped
        owner = self.owner
        if owner is None:
            return
        for dst, messages, payloads, frames, lost, lost_frames in rows:
            owner.counted(self._origins[dst], messages, payloads, frames, lost, lost_frames)
            # A frame sent on to a router counts as one delivery, as RemoteShare.send counts.
            self.hub.counters.delivered += frames
        owner.refused(oversized, queue_full, replayed)
        for w, messages, payloads, frames, dv, expired in got:
            self.read_in += messages + expired
            owner.received(self._readers[w][0], messages, payloads, frames, dv, expired)
        # The frame-age limits follow each link's clock offset (heartbeats move it).
        for writer, topic, origin in self._readers:
            self.relay.link_writer(topic, origin, owner.age_ms(writer))

    def _dst(self, owner: LinkSide, origin: str) -> int:
        dst = self._dsts.get(origin)
        if dst is None:
            topic, bound = owner.route_target(origin)
            dst = self._dsts[origin] = self.relay.link_dst(topic, bound)
            if dst >= 0:
                self._origins.append(origin)
        return dst

    def _prefix(self, origin: str, group: str, dest: bytes | None) -> bytes:
        key = (group, dest)
        p = self._prefixes.get(key)
        if p is None:
            if len(self._prefixes) >= PREFIXES_CACHE:
                self._prefixes.clear()
            # codec.encode_route's header, an array of 6: its first three elements.
            p = self._prefixes[key] = b"\x96" + b"".join(
                msgpack.packb(x) for x in (origin, group, dest))
        return p
