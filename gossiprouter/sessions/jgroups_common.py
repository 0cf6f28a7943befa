"""What the JGroups 2.12 and 5.x sessions share: namespaces, entry data, routing, limited logs.

JGroups payloads of the two wire families are not interchangeable, so each family lives in its
own namespace of the routing table: group ``G`` of a 2.12 client is stored as ``jgroups2:G``, of a
5.x client as ``jgroups5:G`` (:data:`gossiprouter.routing.entries.RESERVED_PREFIXES`). Native
clients may list and watch those groups but not join them.

An entry registered by a JGroups client keeps, in :attr:`Entry.wire`, a :class:`JWire` with the
exact JGroups encodings of its logical and physical addresses, so member lists and SUSPECTs
re-emit the bytes the member sent (ExtendedUUID, TopologyUUID, ... included). Entries created
otherwise (provisioned in the config file) are rendered from their key and ``(host, port)``
pairs when possible (:func:`wire_address`, :func:`wire_physical`).

:class:`JGroupsSession` holds the parts of a session that do not depend on the wire version:
registration, clean removal, the routing of one message, the steps of ``on_data`` around the
codec's scanner, and rate-limited logging.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.jgroups_address import JAddress
from gossiprouter.protocol.jgroups_scan import CACHE_MAX, Item
from gossiprouter.routing.entries import Entry, Kind, Notice, Physical, RoutingError
from gossiprouter.sessions.base import Hub, Session

log = logging.getLogger("gossiprouter")

# At most one log line per this many seconds per connection and kind of problem.
LOG_INTERVAL = 1.0
# How long after a member's clean leave its connection's trailing frames from it are still
# routed (UNICAST3 ACKs follow a 5.x TUNNEL member's UNREGISTER) and a repeated UNREGISTER of it
# (TCPGOSSIP sends two) is expected rather than refused with a warning.
AFTER_LEAVE = 5.0


@dataclass(frozen=True, slots=True)
class JWire:
    """The JGroups encodings of a member, kept in :attr:`Entry.wire`.

    ``physical`` is None when the client sent a null list (2.12) or a null address (5.x).
    """

    addr: JAddress
    physical: tuple[JAddress, ...] | None


def host_ports(addrs: Sequence[JAddress] | None) -> Physical:
    """The ``(host, port)`` pairs of the IpAddresses among ``addrs`` (for native GET_MEMBERS)."""
    if not addrs:
        return ()
    out: list[tuple[str, int]] = []
    for a in addrs:
        hp = a.host_port
        if hp is not None and hp[0]:
            out.append(hp)
    return tuple(out)


def wire_address(entry: Entry, version: int) -> JAddress | None:
    """The JGroups address of ``entry`` in wire ``version``, or None if it has none.

    Entries not registered by a client of that version (provisioned ones) get a plain UUID
    when their key is 16 bytes (msb||lsb, the JAddress key of a UUID).
    """
    w = entry.wire
    if isinstance(w, JWire) and w.addr.version == version:
        return w.addr
    if len(entry.addr) == 16:
        msb = int.from_bytes(entry.addr[:8], "big", signed=True)
        lsb = int.from_bytes(entry.addr[8:], "big", signed=True)
        return JAddress.from_uuid(msb, lsb, version=version)
    return None


def wire_physical(entry: Entry, version: int) -> tuple[JAddress, ...] | None:
    """The physical addresses of ``entry`` as JGroups IpAddresses in wire ``version``."""
    w = entry.wire
    if isinstance(w, JWire) and w.addr.version == version:
        return w.physical
    out: list[JAddress] = []
    for host, port in entry.physical:
        try:
            out.append(JAddress.from_ip(host, port, version=version))
        except ValueError:  # a host name, not an IP literal: JGroups cannot carry it
            continue
    return tuple(out) or None


class Scanner(Protocol):
    """What the sessions need of a codec's scanner (``jgroups5_scan.Scanner``,
    ``jgroups2_scan.Scanner``)."""

    max_frame: int

    def __init__(self, prefix: str, max_frame: int) -> None: ...

    def registered(self, max_frame: int) -> None: ...

    def scan(self, data: bytes, on_run: Callable[[Any, bytes, int], bool]) -> Iterator[Item]: ...


class JGroupsSession(Session):
    """The version-independent part of the JGroups sessions.

    Subclasses set :attr:`protocol`, :attr:`prefix`, :attr:`version` and
    :attr:`scanner_class`, and implement ``on_data`` (the routing decisions on what the
    scanner finds), ``event_frame`` (membership events, encoded once per event by the hub) and
    ``farewell``.
    """

    prefix = "jgroups?:"
    version = 0
    scanner_class: ClassVar[type[Scanner]]

    def __init__(self, hub: Hub, peer: str) -> None:
        super().__init__(hub, peer)
        cfg = hub.config
        # Until the connection registers a member it is not trusted with more than
        # preauth_max_frame (a message before that is dropped as not_member anyway); then
        # jgroups_max_frame, above which a message is skipped, never buffered (_oversized).
        self.scanner = self.scanner_class(self.prefix, cfg.preauth_max_frame)
        self.registered = False
        # Bytes of a skipped frame still to come (see _skip_through).
        self._skip = 0
        # JGroups retransmits what is dropped, and a 5.x RouterStub survives only one
        # router-side close: dropping is the default (docs/jgroups.md §5). Under it, a stalled
        # member keeps what it is owed up to outbound_queue_bytes, the oldest frames dropped
        # beyond, never anything by time (push; docs/operations.md, "A stalled JGroups member").
        self.outbox.policy = cfg.jgroups_slow_consumer_policy
        self.outbox.oldest_first = self.outbox.policy == "drop"
        self.now = 0.0
        self._logged_at: dict[str, float] = {}
        self._oversize_logged: set[str] = set()
        # (table group, address key) -> when this connection unregistered it (AFTER_LEAVE).
        self._left: dict[tuple[str, bytes], float] = {}

    @property
    def holding(self) -> bool:
        """The next chunk continues something: a frame kept, a skipped one, or an object
        the scanner's decoder holds."""
        return bool(self._rest) or self._skip > 0 or getattr(self.scanner, "holding", False)

    def hand_back(self, limit: int) -> bytes | None:
        """As :meth:`Session.hand_back`, unless the rest of a skipped frame is still to come or
        the scanner's decoder holds an object (that state stays here)."""
        if self._skip or getattr(self.scanner, "holding", False):
            return None
        return super().hand_back(limit)

    # ------------------------------------------------------------------ the queue

    def push(self, data: bytes, count: int = 1) -> None:
        """As :meth:`Session.push`, but under policy ``drop`` the oldest queued frames make
        room for ``data`` (:meth:`make_room`): a stalled member that resumes gets the newest
        traffic at once, and JGroups retransmits the oldest, which its senders still hold.
        ``data`` itself is dropped only when it cannot fit at all."""
        if not self.queue(data):
            super().push(data, count)  # it does not fit: dropped, or the policy's close

    def queue(self, data: bytes) -> bool:
        """Queue ``data``, under policy ``drop`` making room for it first if need be
        (:meth:`make_room`); False when it does not fit (nothing queued)."""
        ob = self.outbox
        if ob.push(data) or ob.closed:
            return True
        return ob.oldest_first and self.make_room(len(data)) and ob.push(data)

    def make_room(self, size: int) -> bool:
        """Drop the oldest whole frames queued for this connection until ``size`` more bytes
        fit its bounds (:meth:`Outbox.shed`); counted in drops and dropped_bytes
        (``slow_consumer``). False, and nothing dropped, when they cannot fit."""
        dropped = self.outbox.shed(size)
        if dropped is None:
            return False
        frames = sum(map(self.frames_in, dropped))
        nbytes = sum(map(len, dropped))
        self.outbox.dropped += frames
        self.hub.counters.drop("slow_consumer", frames, nbytes)
        self.warn_limited("shed", "outbound queue full (outbound_queue_bytes %d): its oldest "
                          "frames are dropped to make room (%d bytes now)",
                          self.outbox.max_bytes, nbytes)
        return True

    @staticmethod
    def frames_in(chunk: bytes) -> int:
        """How many frames a queued chunk holds, for the drop counters (2.12 objects are not
        framed: a chunk, one frame or a run of them, counts as one)."""
        return 1

    # ------------------------------------------------------------------ helpers

    def warn_limited(self, kind: str, msg: str, *args: object) -> None:
        """Log ``msg`` at most once per second per connection and ``kind``.

        A misbehaving client can produce a problem per message; the log must not become the
        router's bottleneck.
        """
        last = self._logged_at.get(kind)
        if last is not None and self.now - last < LOG_INTERVAL:
            return
        self._logged_at[kind] = self.now
        log.warning("%r: " + msg, self, *args)

    # ------------------------------------------------------------------ on_data's steps

    def _start(self, data: bytes, now: float, carried: bool = True) -> bytes | None:
        """Where on_data starts, once per chunk: the clock; the rest of a skipped frame is
        dropped; with ``carried``, a frame started in an earlier chunk is completed first
        (``_complete``). None when nothing is left to scan."""
        self.last_recv = self.now = now
        if self._skip:
            data = self._skip_through(data)
            if not data:
                return None
        return self._complete(data) if carried else data

    def _after_control(self, data: bytes, end: int) -> bool:
        """A control frame ending at ``end`` was handled: charge it. True when the scan must
        stop: the connection closed, or its budget or turn is spent (the rest of ``data`` is
        kept for later)."""
        self.spend_control()
        if self.outbox.closed:
            return True
        if self.paused:
            self.keep(data, end)
            return True
        return False

    def _skip_frame(self, data: bytes, end: int, n: int, reason: str) -> None:
        """Skip a frame of ``n`` bytes that ends at ``end``, possibly past ``data``: the rest
        streams past unbuffered (``_oversized`` says why)."""
        self._oversized(n, reason)
        if end > len(data):
            self._skip = end - len(data)

    def _skip_through(self, data: bytes) -> bytes:
        """What is left of ``data`` after the rest of a skipped frame (per chunk, not per
        frame): the frame streams past without being buffered."""
        k = self._skip
        if len(data) <= k:
            self._skip = k - len(data)
            return b""
        self._skip = 0
        return data[k:]

    def _oversized(self, n: int, reason: str) -> None:
        """Skip a frame of ``n`` bytes (``frame_too_large``: above jgroups_max_frame;
        ``partial_frames_budget``: the router-wide budget has no room for it): counted, and
        logged once per connection and reason; the connection stays open and in sync."""
        self.hub.counters.drop(reason)
        level = logging.DEBUG if reason in self._oversize_logged else logging.WARNING
        self._oversize_logged.add(reason)
        if reason == "frame_too_large":
            why = f"above jgroups_max_frame {self.hub.config.jgroups_max_frame}"
        else:
            why = (f"the router's partial_frames_budget "
                   f"({self.hub.config.partial_frames_budget}) is in use")
        log.log(level, "%r: skipping a message of %d bytes: %s (counted in drops{reason=%s}; "
                "JGroups retransmits it; further ones on this connection are logged at debug)",
                self, n, why, reason)

    def _after_leave(self, group: str, key: bytes | None, count: int = 1) -> bool:
        """True for ``count`` frames from ``key`` (None: any address; 2.12 messages carry no
        sender) that this connection unregistered from ``group`` less than AFTER_LEAVE ago:
        they are routed, as the Java router does, counted and logged at debug only (a clean
        5.x TUNNEL leave sends UNICAST3 ACKs after its UNREGISTER)."""
        left = self._left
        if not left:
            return False
        now = self.now
        if key is not None:
            t = left.get((group, key))
            ok = t is not None and now - t < AFTER_LEAVE
        else:
            ok = any(g == group and now - t < AFTER_LEAVE for (g, _), t in left.items())
        if ok:
            self.count_in("after_leave", count)
            log.debug("%r: routing a frame sent to %r just after its sender left", self, group)
        return ok

    def count_in(self, name: str, count: int = 1) -> None:
        """Count ``count`` frames received (control frames by type; MESSAGE counts as
        ``routed``)."""
        fin = self.hub.counters.frames_in
        key = f"{self.protocol}_{name}"
        fin[key] = fin.get(key, 0) + count

    def fail(self, e: ProtocolError) -> None:
        """A protocol violation the stream cannot survive: close this connection."""
        self.hub.counters.protocol_errors += 1
        log.info("closing %r: %s: %s", self, e.code, e)
        self.close(e.code, str(e))

    # ------------------------------------------------------------------ membership

    def register(
        self, group: str, addr: JAddress, name: str | None, physical: tuple[JAddress, ...] | None
    ) -> tuple[list[bytes], list[Notice]] | None:
        """Register ``addr`` in JGroups ``group`` through this connection.

        Returns the frames held for it during a reconnect grace and the notices to deliver;
        the caller queues its own reply (if any) first, then the held frames, then delivers the
        notices. None when a table rule refused it (logged and counted; nothing changed).
        """
        table = self.hub.table
        full = self.prefix + group
        known = table.entry(full, addr.key)
        try:
            entry, notices, held = table.connect(
                self, full, addr.key, name, host_ports(physical), wire=JWire(addr, physical)
            )
        except RoutingError as e:
            self.hub.counters.drop("refused_registration")
            self.hub.counters.refused(e.code)
            self.warn_limited("register", "registration of %s in %r refused: %s (%s)",
                              addr, full, e.message, e.code)
            return None
        if known is None:
            self.hub.log_membership("joined", entry, self)
        if not self.registered:
            self.registered = True
            self.scanner.registered(self.hub.config.jgroups_max_frame)
        self._left.pop((full, addr.key), None)
        return held, notices

    def unregister(self, group: str, addr: JAddress) -> bool:
        """A clean leave of ``addr`` from ``group`` (no SUSPECT); False if this connection did
        not register it (JGroups lets anybody unregister anybody; we follow routing rule R8)."""
        full = self.prefix + group
        table = self.hub.table
        entry = table.entry(full, addr.key)
        try:
            notices = table.disconnect(self, full, addr.key)
        except RoutingError as e:
            t = self._left.get((full, addr.key))
            if t is not None and self.now - t < AFTER_LEAVE:
                # TCPGOSSIP unregisters twice on close (stop() and handleDisconnect()).
                self.count_in("unregister_repeated")
                log.debug("%r: repeated unregister of %s from %r (it already left)", self,
                          addr, full)
                return False
            self.hub.counters.drop("not_member")
            self.warn_limited("unregister", "unregister of %s from %r refused: %s", addr, full,
                              e.message)
            return False
        left = self._left
        if len(left) >= CACHE_MAX:
            left.clear()
        left[(full, addr.key)] = self.now
        if entry is not None:
            self.hub.log_membership("left", entry, self)
        self.hub.deliver(notices)
        return True

    def leave_all(self) -> None:
        """Remove, without SUSPECT, every address that only this connection carries.

        Addresses that another (newer) connection also registered stay: they are dropped from
        this connection silently when it closes (routing rules R4/R5).
        """
        table = self.hub.table
        notices: list[Notice] = []
        for (group, addr), e in list(table.registrations(self).items()):
            if e.carriers == [self] and e.kind == Kind.CONNECTION and not e.sticky:
                notices += table.disconnect(self, group, addr)
                self.hub.log_membership("left", e, self)  # the join line's form
        self.hub.deliver(notices)

    def members(self, group: str) -> list[Entry]:
        """The entries of JGroups ``group``, in registration order."""
        return self.hub.table.members(self.prefix + group)

    # ------------------------------------------------------- routing (called by the hot loop)

    def route(self, group: str, dest: bytes | None, frames: bytes, count: int = 1) -> None:
        """Deliver ``count`` whole frames (``frames``, already in the receivers' wire form) from
        this connection to ``dest`` (a routing key; None = every member, the sender included).

        Called once per run of MESSAGEs the scanner finds (``_run``) and for a MESSAGE the full
        decoder handled. It reads the table the way ``resolve_unicast`` /
        ``resolve_multicast(include_sender=True)`` do, without their call overhead, and queues
        straight on the receiver's outbox, falling back to :meth:`Carrier.push` (the
        slow-consumer policy) only when the frame does not fit.
        """
        hub = self.hub
        counters = hub.counters
        counters.routed += count
        table = hub.table
        g = table.groups.get(group)
        if dest is None:
            if g is None:
                return
            targets = g.targets()
            for t in targets:
                if not t.outbox.push(frames):
                    t.push(frames, count)
            counters.delivered += count * len(targets)
            if g.graced:
                for e in g.graced:
                    table.hold(e, frames)
            return
        entry = None if g is None else g.entries.get(dest)
        if entry is None:
            # JGroups semantics: no reply to the sender; its retransmission protocols cope.
            counters.drop("unknown_destination", count)
            return
        carriers = entry.carriers
        if not carriers:  # in reconnect grace: held, delivered if it comes back in time
            table.hold(entry, frames)
            return
        c = carriers[-1]
        if not c.outbox.push(frames):
            c.push(frames, count)
        counters.delivered += count
