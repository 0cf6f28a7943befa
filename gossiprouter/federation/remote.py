"""What a router knows of the other routers of its federation, sans-IO: each one
(:class:`RemoteRouter`), the carriers that stand for its members in this router's table
(:class:`RemoteMember`, one per member, and :class:`RemoteGroup`, one per (router, group), the
fan-out of a multicast), the federation's counters, and the time-to-lives of what the broker
keeps. :mod:`gossiprouter.federation.state` applies them to the table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from gossiprouter.federation.codec import (
    NEWCOMER,
    Chunk,
    Delta,
    Member,
    encode_delta,
    pack_member,
    split_chunks,
)
from gossiprouter.routing.entries import Carrier, Entry, RemoteCarrier


class Sender(Protocol):
    """What a remote carrier needs of its federation: a way to send a run of frames to one
    router (:meth:`gossiprouter.federation.state.Federation.send`)."""

    # True: what is sent waits for flush_routes() (the compiled fast path's upcalls).
    holding: bool

    def send(self, remote: RemoteRouter, group: str, dest: bytes | None, frames: bytes,
             count: int) -> None: ...

    def flush_routes(self) -> None: ...

RECEIVERS_CACHE = 10_000
# A presence is republished every PRESENCE_TTL / 3 seconds and expires after PRESENCE_TTL (at
# the broker too): a router whose Last Will was lost (it died while a persistent broker was
# down) is dropped after that, instead of staying a ghost with its members.
PRESENCE_TTL = 60
# Records are republished every RECORD_TTL / 3 and expire after RECORD_TTL at the broker, so
# the inert records of stopped routers do not pile up in a persistent broker.
RECORD_TTL = 86_400


@dataclass
class FederationStats:
    """What the federation counts (metrics ``gossiprouter_federation_*`` and /groups)."""

    routed_out: int = 0  # frames sent to other routers (a run counts its frames)
    routed_in: int = 0  # frames received from other routers
    delivered_in: int = 0  # copies of those queued for local connections
    not_forwarded: int = 0  # frames for another router lost: broker not connected or too slow
    undeliverable: int = 0  # frames received for a member no longer here
    handed_on: int = 0  # frames for a member that moved, passed on to its new router
    duplicates: int = 0  # frames handed on that had reached the member already: dropped
    records_out: int = 0  # membership records published
    records_in: int = 0  # membership records applied
    malformed: int = 0  # federation messages that could not be read
    refused: int = 0  # routed frames not delivered: bad frames, or a sender not of that router
    unauthenticated: int = 0  # messages the federation key refused (unsigned, bad, replayed)
    conflicts: int = 0  # remote registrations a local rule refused (e.g. an in-process address)
    routers_lost: int = 0  # routers dropped: Last Will, resync, or this router cut off
    routers_left: int = 0  # routers that shut down cleanly (their members left, unsuspected)
    resyncs: int = 0  # reconciles after a (re)connect
    ghosts_removed: int = 0  # remote members a resync found gone
    routers_graced: int = 0  # routers lost (Last Will, resync, cut off) held in grace first
    routers_revived: int = 0  # routers back within their grace: their members never left


class _NoQueue:
    """The outbox of a remote carrier: never takes bytes directly, so the routing loops call
    :meth:`RemoteGroup.push` / :meth:`RemoteMember.push` (which know the group)."""

    __slots__ = ()

    def push(self, data: bytes) -> bool:
        return False


_NO_QUEUE = _NoQueue()


class _Remote:
    """What both remote carriers share: they stand for router ``remote``, take no events
    (each router derives its own from the federated membership) and no direct bytes."""

    protocol: ClassVar[str] = "federation"
    events_by_call: ClassVar[bool] = True
    # Never learned by the compiled fast path (no socket): their frames stay in Python.
    fast_id: ClassVar[None] = None

    __slots__ = ()
    remote: RemoteRouter

    @property
    def peer(self) -> str:
        return f"router {self.remote.label}"

    @property
    def outbox(self) -> _NoQueue:
        return _NO_QUEUE

    @classmethod
    def event_frame(cls, kind: str, entry: Entry) -> bytes | None:
        return None

    def notify(self, kind: str, entry: Entry) -> None:
        pass


class RemoteGroup(_Remote):
    """The fan-out target "group ``group`` on router ``remote``": one per router and group."""

    __slots__ = ("fed", "group", "remote")

    def __init__(self, fed: Sender, remote: RemoteRouter, group: str) -> None:
        self.fed = fed
        self.remote = remote
        self.group = group

    def push(self, data: bytes, count: int = 1) -> None:
        self.fed.send(self.remote, self.group, None, data, count)


class RemoteMember(_Remote, RemoteCarrier):
    """Member ``addr`` of ``group``, carried by router ``remote``: a carrier of its entry."""

    __slots__ = ("addr", "data", "fanout", "fed", "group", "live_there", "remote", "router")

    def __init__(self, fed: Sender, remote: RemoteRouter, group: str, addr: bytes) -> None:
        self.fed = fed
        self.remote = remote
        self.router = remote.origin
        self.group = group
        self.addr = addr
        self.fanout: Carrier = remote.fanout(group)
        self.live_there = True  # not held in reconnect grace at its router (its record says)
        self.data: Member | None = None

    @property
    def live(self) -> bool:
        """Live at its router, and that router not held here in federation grace: a carrier
        whose router is out of reach (a Last Will, a cut) ranks after every live one, so a
        member that came back through another router (a restarted router with a new id)
        is served there, not through the router that is gone."""
        return self.live_there and self.remote.grace_until is None

    @live.setter
    def live(self, value: bool) -> None:
        self.live_there = value

    @property
    def newcomer(self) -> bool:  # type: ignore[override]  # read from its record
        """Connected there while another router carried it: a move's new router, which
        ranks after the one the member was on first (its record says: live NEWCOMER)."""
        return self.data is not None and self.data[5] == NEWCOMER

    def push(self, data: bytes, count: int = 1) -> None:
        self.fed.send(self.remote, self.group, self.addr, data, count)

    @property
    def peer(self) -> str:
        """For /groups: the router's origin (its name is not unique across restarts or
        configurations), and whether the member is only held there in grace."""
        return f"router {self.remote.origin}" + ("" if self.live else " (in grace there)")


@dataclass(eq=False)
class RemoteRouter:
    """Another router of the federation, as this one knows it."""

    origin: str
    name: str = ""
    alive: bool = False
    # The broker session (Federation.epoch) in which its presence / a record was last seen.
    epoch: int = 0
    groups: dict[str, dict[bytes, RemoteMember]] = field(default_factory=dict)
    record_epochs: dict[str, int] = field(default_factory=dict)
    # Records received before its presence, during the first retained burst: (group, tag).
    pending: dict[tuple[str, str], bytes] = field(default_factory=dict)
    # group -> its records as received (snapshot chunks and deltas not applied yet)
    streams: dict[str, Stream] = field(default_factory=dict)
    fanouts: dict[str, RemoteGroup] = field(default_factory=dict)
    fed: Sender | None = None
    # When its presence expires unless refreshed (None: never).
    expires: float | None = None
    # Lost (Last Will, resync, this router cut off) but held in grace until then: its members
    # stay, and its presence coming back before then revives it (Federation.grace).
    grace_until: float | None = None
    # When the groups it has not published again since the resync are dropped as ghosts.
    ghost_check_at: float | None = None

    @property
    def label(self) -> str:
        """How the log names it: its name and its origin (the id its own log says it
        connected as: ``bridge connected to URL as ORIGIN``), so both logs can be matched."""
        return f"{self.name} ({self.origin})" if self.name and self.name != self.origin \
            else self.origin

    def fanout(self, group: str) -> RemoteGroup:
        f = self.fanouts.get(group)
        if f is None:
            assert self.fed is not None
            f = self.fanouts[group] = RemoteGroup(self.fed, self, group)
        return f


# ------------------------------------------------------------------ records (docs/federation.md)

# A snapshot is published again once the deltas since the last one weigh twice as much as
# it (at least COMPACT_MIN): a join or leave then costs its delta plus at most half as much
# again, and the broker retains at most three snapshots' weight per (router, group).
COMPACT_MIN = 4096
# Deltas held per (router, group) until the snapshot they follow is complete.
MAX_HELD_DELTAS = 65_536
Record = tuple[str, str, bytes]  # (group, tag, payload)


class Published:
    """What this router published of one group: its version (run, seq), the members as
    packed, the snapshot's chunk count, and the delta slots used since it and ever."""

    def __init__(self, run: bytes) -> None:
        self.run = run
        self.seq = 0
        self.members: dict[bytes, bytes] = {}
        self.chunks = 0
        self.slot = 0  # the next delta's slot
        self.slots = 0  # slots ever used (all deleted on a leave)
        self.delta_bytes = 0
        self.snap_bytes = 0

    def update(self, members: dict[bytes, list[Any]]) -> None:
        """The members now (a snapshot follows): a new version if they changed."""
        new = {a: pack_member(m) for a, m in members.items()}
        if new != self.members:
            self.seq += 1
        self.members = new

    def uses(self, tag: str) -> bool:
        n = int(tag[1:])
        return n < self.chunks if tag[0] == "c" else n < self.slots

    def compaction_due(self) -> bool:
        return self.delta_bytes >= max(2 * self.snap_bytes, COMPACT_MIN)

    def snapshot(self, group: str, limit: int) -> list[Record]:
        """The snapshot at the current version, in chunks of at most ``limit`` bytes; the
        chunks of a larger snapshot before it are deleted."""
        self.seq = max(self.seq, 1)
        chunks = split_chunks(self.run, self.seq, list(self.members.values()), limit)
        out = [(group, f"c{i}" if i else "", c) for i, c in enumerate(chunks)]
        out += [(group, f"c{i}", b"") for i in range(len(chunks), self.chunks)]
        self.chunks = len(chunks)
        self.slot = self.delta_bytes = 0
        self.snap_bytes = sum(len(c) for c in chunks)
        return out


def delta_records(group: str, pub: Published, members: dict[bytes, list[Any]],
                  suspected: set[bytes], limit: int) -> list[Record]:
    """The deltas from what ``pub`` published to ``members`` (none if nothing changed):
    one, unless it would exceed ``limit`` bytes."""
    packed = {a: pack_member(m) for a, m in members.items()}
    joins = [p for a, p in packed.items() if pub.members.get(a) != p]
    leaves = [a for a in pub.members if a not in packed]
    pub.members = packed
    out: list[Record] = []
    room = max(limit - 128, 1)
    while joins or leaves:
        size, j, lv = 0, list[bytes](), list[bytes]()
        while joins and (not j or size + len(joins[-1]) <= room):
            size += len(joins[-1])
            j.append(joins.pop())
        while leaves and not joins and (not (j or lv) or size + len(leaves[-1]) + 3 <= room):
            size += len(leaves[-1]) + 3
            lv.append(leaves.pop())
        pub.seq += 1
        payload = encode_delta(pub.run, pub.seq, j, lv, [a for a in lv if a in suspected])
        out.append((group, f"d{pub.slot}", payload))
        pub.slot += 1
        pub.slots = max(pub.slots, pub.slot)
        pub.delta_bytes += len(payload)
    return out


def deletions(group: str, pub: Published) -> list[Record]:
    """What deletes every retained record of ``pub``: the head last (it says "left")."""
    return ([(group, f"c{i}", b"") for i in range(1, pub.chunks)]
            + [(group, f"d{i}", b"") for i in range(pub.slots)] + [(group, "", b"")])


class Stream:
    """One (router, group)'s records as received: the version applied, the snapshot chunks
    and the deltas waiting for it (a late joiner or a resync reads the retained snapshot
    and the retained deltas in any order, and applies them in version order)."""

    def __init__(self) -> None:
        self.applied: tuple[bytes, int] | None = None
        self.head: tuple[bytes, int, int] | None = None
        self.chunks: dict[tuple[bytes, int], dict[int, list[Member]]] = {}
        self.deltas: dict[tuple[bytes, int], Delta] = {}

    def add(self, rec: Chunk | Delta) -> list[tuple[str, list[Member] | Delta]]:
        """What to apply now, in order: ("snapshot", members) or ("delta", delta)."""
        a = self.applied
        if a is not None and rec.run == a[0] and rec.seq <= a[1]:
            return []  # applied already
        if isinstance(rec, Chunk):
            if rec.part == 0:
                self.head = (rec.run, rec.seq, rec.total)
            parts = self.chunks.setdefault((rec.run, rec.seq), {})
            parts[rec.part] = rec.members
            while len(self.chunks) > 3:
                del self.chunks[next(iter(self.chunks))]
        elif len(self.deltas) < MAX_HELD_DELTAS:
            self.deltas[(rec.run, rec.seq)] = rec
        out: list[tuple[str, list[Member] | Delta]] = []
        h = self.head
        if h is not None and (a is None or h[0] != a[0] or h[1] > a[1]):
            parts = self.chunks.get(h[:2], {})
            if len(parts) == h[2]:
                out.append(("snapshot", [m for i in range(h[2]) for m in parts[i]]))
                a = self.applied = h[:2]
        if a is not None:
            while (d := self.deltas.pop((a[0], a[1] + 1), None)) is not None:
                out.append(("delta", d))
                a = self.applied = (a[0], a[1] + 1)
            self.chunks = {v: p for v, p in self.chunks.items() if v[0] != a[0] or v[1] > a[1]}
            self.deltas = {v: d for v, d in self.deltas.items() if v[0] == a[0] and v[1] > a[1]}
        return out
