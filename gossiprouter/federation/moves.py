"""Lossless moves between federated routers, sans-IO (docs/federation.md, "Lossless moves").

A member moves from router B to router C (CONNECT on C, then DISCONNECT on B). Frames that
other routers sent to B because their view still had the member there reach B after it
left. :class:`Moves` keeps, for :class:`gossiprouter.federation.state.Federation`:

* the **fan-out numbers**: every routed message carries ``seq``, the number of the fan-out at
  the router that routed it first (the copies of one multicast to several routers share it);
* at the **old router**, the members that left it: a frame for one of them is handed on
  once, marked handed (never passed on again), to the live router that carries it now; if
  no router is known to carry it yet (the DISCONNECT came before the new router's record),
  the frame is **held** until that record arrives, then handed on, within
  :data:`MOVE_HOLD` seconds and :data:`MOVE_HOLD_BYTES`;
* at the **new router**, per (first router, group, member), the numbers handed to the member
  and those delivered to it directly while it is new here or also carried elsewhere: a
  frame handed on twice, or a multicast it already had, is dropped (``duplicates``).

No trio, no sockets: tested with bytes (tests/test_federation.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from gossiprouter.federation.codec import NEWCOMER
from gossiprouter.federation.remote import FederationStats, RemoteMember, RemoteRouter
from gossiprouter.routing.entries import Entry, Group, RemoteCarrier

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    from gossiprouter.federation.codec import Route
    from gossiprouter.federation.remote import Published

# Multicasts of a group after a move for which the member's old router hands them on, and
# its new one remembers which it delivered: a broker round trip is far fewer.
MOVE_WINDOW = 10_000
# How long the old router holds frames for a member that left it before any router is known
# to carry it (the new router's record is normally a broker round trip away), and how many
# bytes at most (each frame counted once per member it is held for); then they are dropped
# and counted as undeliverable (a member that left for good).
MOVE_HOLD = 5.0
MOVE_HOLD_BYTES = 8 << 20
# Members that left this router tracked at most at once (each one is a few dict entries).
MAX_LEFT = 1024
# Fan-out numbers remembered per window (Seen): 65,536 fan-outs of the first router, a
# minute at 1,000 frames/s, far more than a hold or a broker round trip.
SEQ_WINDOW = 1 << 16
# At most this many windows (8 KiB each) per kind: per (router, group, member).
SEQ_WINDOWS = 4096
# Members of a group whose multicasts are remembered at once (those carried elsewhere too
# first): a mass join costs each multicast at most this many more steps.
MAX_RECENT = 256


class Seen:
    """The fan-out numbers added within the last :data:`SEQ_WINDOW` of the highest one, as a
    ring of bits; a number below the window counts as seen (too old to be told: dropped
    rather than delivered twice)."""

    __slots__ = ("bits", "top")

    def __init__(self) -> None:
        self.bits = bytearray(SEQ_WINDOW // 8)
        self.top = -1

    def add(self, seq: int) -> None:
        if seq > self.top:
            if self.top < 0 or seq - self.top >= SEQ_WINDOW:
                self.bits = bytearray(SEQ_WINDOW // 8)
            else:
                self._clear(self.top + 1, seq)  # the ring's slots now reused
            self.top = seq
        elif seq <= self.top - SEQ_WINDOW:
            return
        i = seq % SEQ_WINDOW
        self.bits[i >> 3] |= 1 << (i & 7)

    def _clear(self, lo: int, hi: int) -> None:
        """Clear the slots of the numbers ``lo`` to ``hi - 1`` (fewer than the window):
        whole bytes at once."""
        bits = self.bits
        while lo < hi:
            i = lo % SEQ_WINDOW
            if i & 7 == 0 and hi - lo >= 8:
                n = min((hi - lo) >> 3, (SEQ_WINDOW - i) >> 3)
                bits[i >> 3:(i >> 3) + n] = bytes(n)
                lo += n << 3
            else:
                bits[i >> 3] &= ~(1 << (i & 7)) & 0xFF
                lo += 1

    def __contains__(self, seq: object) -> bool:
        if not isinstance(seq, int) or self.top < 0 or seq > self.top:
            return False
        if seq <= self.top - SEQ_WINDOW:
            return True
        i = seq % SEQ_WINDOW
        return bool(self.bits[i >> 3] & (1 << (i & 7)))


def window(windows: dict[Any, Seen], key: Any) -> Seen:
    """``windows[key]``, made if new (all of them forgotten past :data:`SEQ_WINDOWS`)."""
    w = windows.get(key)
    if w is None:
        if len(windows) >= SEQ_WINDOWS:
            windows.clear()
        w = windows[key] = Seen()
    return w


class Host(Protocol):
    """What :class:`Moves` needs of its federation (``Federation``)."""

    origin: str
    stats: FederationStats
    published: dict[str, Published]
    clock: Callable[[], float]  # now, for a hold's end
    wake: Callable[[], None]  # a hold's end is due: the ticker must know

    def send(self, remote: RemoteRouter, group: str, dest: bytes | None, frames: bytes,
             count: int, handed: bool = False, seq: int = 0, src: str | None = None,
             multicast: bool = False) -> None: ...


# A held frame: (first router, its fan-out number, a multicast, the frames, their count).
Held = tuple[str, int, bool, bytes, int]


@dataclass
class Left:
    """A member that left this router for no router known yet: what was held for it."""

    until: float
    frames: list[Held] = field(default_factory=list)
    nbytes: int = 0


def _local(g: Group, addr: bytes) -> bool:
    e = g.entries.get(addr)
    return e is not None and bool(e.carriers) and not isinstance(e.carriers[-1], RemoteCarrier)


class Moves:
    """The moves' state of one router (see the module docstring)."""

    def __init__(self, fed: Host) -> None:
        self.fed = fed
        self.now = 0.0  # the last tick's time (Federation.tick; the tests' clock)
        # The fan-out number of what this router routes first, and the frames it was last
        # given: one fan-out pushes the same frames to every router.
        self.seq = 0
        # Where the numbers come from when the relay thread numbers fan-outs too (its link:
        # one sequence); None: counted here.
        self.take: Callable[[], int] | None = None
        self._last_frames: bytes | None = None
        # group -> (rev, the members carried here then): what changed between multicasts
        self._carried: dict[str, tuple[int, frozenset[bytes]]] = {}
        # group -> member that left for a live router -> multicasts still to hand on to it
        self._moved: dict[str, dict[bytes, int]] = {}
        # group -> member that left for no router known yet -> what is held for it
        self._left: dict[str, dict[bytes, Left]] = {}
        self.held_bytes = 0
        # group -> member new here or also carried elsewhere -> multicasts still to watch
        self._recent: dict[str, dict[bytes, int]] = {}
        # group -> members that connected here while another live router carried them (a
        # move's new router), published as live NEWCOMER: the first router delivers their
        # multicasts while it carries them too (Federation.delivered_elsewhere)
        self._newcomers: dict[str, set[bytes]] = {}
        # (first router, group, member) -> numbers delivered to it directly / handed to it
        self._delivered: dict[tuple[str, str, bytes], Seen] = {}
        self._handed: dict[tuple[str, str, bytes], Seen] = {}

    # ------------------------------------------------------------------ sending

    def number(self, frames: bytes) -> int:
        """The fan-out number of ``frames`` routed first here (the same object: the same
        fan-out, pushed to the next router)."""
        if frames is not self._last_frames:
            take = self.take
            self.seq = self.seq + 1 if take is None else take()
            self._last_frames = frames
        return self.seq

    def quiet(self, group: str) -> bool:
        """No move of ``group`` is watched now: its multicasts need no bookkeeping here (the
        relay thread may deliver them: server/broker_link.py)."""
        return group not in self._recent and group not in self._moved and group not in self._left

    def held_frames(self) -> int:
        return sum(len(lf.frames) for left in self._left.values() for lf in left.values())

    # ------------------------------------------------------------------ newcomers

    def mark(self, g: Group | None, members: dict[bytes, list[Any]],
             pub: Published | None) -> None:
        """Before ``members`` of ``g`` (carried here) are published: live NEWCOMER for those
        that connected here (since ``pub``, the last publication) while another live router
        carried them, for as long as one does."""
        if g is None:
            return
        new = self._newcomers.get(g.name, set())
        for addr, m in members.items():
            e = g.entries.get(addr)
            if not m[5] or e is None or not any(
                    isinstance(c, RemoteMember) and c.live for c in e.carriers):
                new.discard(addr)
            elif addr in new or pub is None or addr not in pub.members:
                new.add(addr)
                m[5] = NEWCOMER
        new.intersection_update(members)
        if new:
            self._newcomers[g.name] = new
        else:
            self._newcomers.pop(g.name, None)

    def newcomer(self, g: Group, addr: bytes) -> bool:
        """Whether ``addr``, carried here and by another live router, is (or will be
        published as) a newcomer here (:meth:`mark`)."""
        if addr in self._newcomers.get(g.name, ()):
            return True
        pub = self.fed.published.get(g.name)
        return pub is None or addr not in pub.members

    def newcomer_here(self, group: str, addr: bytes) -> bool:
        return addr in self._newcomers.get(group, ())

    def delivered_elsewhere(self, g: Group, e: Entry, origin: str) -> bool:
        """Whether another router delivers ``origin``'s multicasts to ``e`` (connected here
        too): ``origin`` itself if it has a live connection of it; else, of the routers
        with one, the one it connected to first when the other is a move's new router
        (published as live 2: docs/federation.md, "Lossless moves"), else the smallest id."""
        mine: bool | None = None
        for r in e.carriers:
            if not (isinstance(r, RemoteCarrier) and r.live):
                continue
            if r.router == origin:
                return True
            theirs = r.newcomer
            if mine is None:
                mine = self.newcomer(g, e.addr)
            if mine != theirs:
                if mine:
                    return True  # it was there first
            elif r.router < self.fed.origin:
                return True
        return False

    # ------------------------------------------------------------------ the old router

    def unicast(self, g: Group, dest: bytes, c: Any, rt: Route) -> bool:
        """A frame (not handed) for ``dest``, which has no connection here: handed on to the
        live router that carries it, or held if it left here for no router known yet.
        False: neither (undeliverable)."""
        if isinstance(c, RemoteMember) and c.live:
            self.fed.send(c.remote, g.name, dest, rt.frames, rt.frame_count, True, rt.seq,
                          rt.origin)
            self.fed.stats.handed_on += rt.frame_count
            return True
        left = self._left.get(g.name, {}).get(dest)
        if left is None:
            pub = self.fed.published.get(g.name)
            if pub is None or dest not in pub.members:
                return False  # never published here: nobody sends it here
            left = self._leave(g.name, dest)
        return left is not None and self._hold(left, (rt.origin, rt.seq, False, rt.frames,
                                                      rt.frame_count))

    def left_here(self, g: Group | None, addrs: Collection[bytes]) -> None:
        """``addrs`` no longer carried here (a flush found them gone): frames for them may
        still come for a while, from routers that have not heard it yet."""
        if g is None:
            return  # no member of the group known here: nothing is accepted for it
        for addr in addrs:
            e = g.entries.get(addr)
            c = None if e is None or not e.carriers else e.carriers[-1]
            if isinstance(c, RemoteMember) and c.live:
                self._moved.setdefault(g.name, {})[addr] = MOVE_WINDOW
            elif not _local(g, addr):
                self._leave(g.name, addr)

    def _leave(self, group: str, addr: bytes) -> Left | None:
        left = self._left.setdefault(group, {})
        lf = left.get(addr)
        if lf is None and sum(len(x) for x in self._left.values()) < MAX_LEFT:
            lf = left[addr] = Left(self.fed.clock() + MOVE_HOLD)
            self.fed.wake()
        return lf

    def _hold(self, lf: Left, item: Held) -> bool:
        n = len(item[3])
        if self.held_bytes + n > MOVE_HOLD_BYTES:
            return False
        lf.frames.append(item)
        lf.nbytes += n
        self.held_bytes += n
        return True

    def arrived(self, g: Group | None, addr: bytes, rm: RemoteMember) -> None:
        """``rm``'s router carries ``addr`` now (its record): what was held for it here is
        handed on, and its multicasts are for a while."""
        left = self._left.get(rm.group)
        lf = None if left is None else left.pop(addr, None)
        if lf is None:
            return
        if not left:
            del self._left[rm.group]
        self.held_bytes -= lf.nbytes
        if g is None or _local(g, addr) or not rm.live:
            self.fed.stats.undeliverable += sum(h[4] for h in lf.frames)
            return
        for origin, seq, multicast, frames, count in lf.frames:
            if multicast and origin == rm.router:
                self.fed.stats.undeliverable += count  # its own: never handed back
                continue
            self.fed.send(rm.remote, rm.group, addr, frames, count, True, seq, origin,
                          multicast)
            self.fed.stats.handed_on += count
        self._moved.setdefault(rm.group, {})[addr] = MOVE_WINDOW

    def next_due(self) -> float | None:
        """The end of the first hold (None: nothing held)."""
        return min((lf.until for left in self._left.values() for lf in left.values()),
                   default=None)

    def expire(self, now: float) -> None:
        """Frames held past :data:`MOVE_HOLD`: the member left for good (undeliverable)."""
        self.now = now
        for group, left in list(self._left.items()):
            for addr, lf in list(left.items()):
                if lf.until <= now:
                    del left[addr]
                    self.held_bytes -= lf.nbytes
                    self.fed.stats.undeliverable += sum(h[4] for h in lf.frames)
            if not left:
                del self._left[group]

    # ------------------------------------------------------------------ multicasts

    def refresh(self, g: Group) -> None:
        """After a change of ``g`` (a multicast's receivers recomputed): the members that
        left here (for a live router: their multicasts are handed on; for none yet: held)
        and those new here or also carried elsewhere (what they get is remembered)."""
        here = frozenset(a for a, e in g.entries.items()
                         if e.carriers and not isinstance(e.carriers[-1], RemoteCarrier))
        rev, before = self._carried.get(g.name, (-1, here))
        if rev == g.rev:
            return
        self._carried[g.name] = (g.rev, here)
        # Gone since the last multicast, or still published here (the flush is due).
        pub = self.fed.published.get(g.name)
        self.left_here(g, (before | (pub.members.keys() if pub else set())) - here)
        recent = self._recent.setdefault(g.name, {})
        for addr in here:
            if len(g.entries[addr].carriers) > 1 or (
                    addr not in before and len(recent) < MAX_RECENT):
                recent[addr] = MOVE_WINDOW
        if not recent:
            del self._recent[g.name]

    def multicast(self, g: Group, origin: str, seq: int, frames: bytes, count: int,
                  targets: Collection[Any]) -> None:
        """Multicast ``seq`` of ``origin`` delivered here to ``targets``: remembered for the
        recent members that got it, handed on or held for those that left."""
        name = g.name
        recent = self._recent.get(name)
        if recent:
            for addr, n in list(recent.items()):
                e = g.entries.get(addr)
                if e is None or n <= 1:
                    del recent[addr]
                else:
                    recent[addr] = n - 1
                if e is not None and e.carriers and e.carriers[-1] in targets:
                    window(self._delivered, (origin, name, addr)).add(seq)
            if not recent:
                del self._recent[name]
        moved = self._moved.get(name)
        if moved:
            for addr, n in list(moved.items()):
                e = g.entries.get(addr)
                c = None if e is None or not e.carriers else e.carriers[-1]
                if not isinstance(c, RemoteMember) or n <= 1:
                    del moved[addr]
                else:
                    moved[addr] = n - 1
                if isinstance(c, RemoteMember) and c.live and c.router != origin:
                    self.fed.send(c.remote, name, addr, frames, count, True, seq, origin, True)
                    self.fed.stats.handed_on += count
            if not moved:
                del self._moved[name]
        left = self._left.get(name)
        if left:
            for addr, lf in list(left.items()):
                if _local(g, addr):  # back here: what it gets is its own again
                    del left[addr]
                    self.held_bytes -= lf.nbytes
                    self.fed.stats.undeliverable += sum(h[4] for h in lf.frames)
                elif not self._hold(lf, (origin, seq, True, frames, count)):
                    self.fed.stats.undeliverable += count
            if not left:
                del self._left[name]

    # ------------------------------------------------------------------ the new router

    def handed_twice(self, rt: Route, dest: bytes) -> bool:
        """Whether frames handed on after a move (first routed by ``rt.src``, its fan-out
        ``rt.seq``) already reached ``dest``: handed here before, or (a multicast) delivered
        here directly; counted as duplicates."""
        assert rt.src is not None
        key = (rt.src, rt.group, dest)
        handed = window(self._handed, key)
        dup = rt.seq in handed
        if not dup and rt.multicast:
            got = self._delivered.get(key)
            dup = got is not None and rt.seq in got
        if dup:
            self.fed.stats.duplicates += rt.frame_count
        else:
            handed.add(rt.seq)
        return dup
