"""What the JGroups 2.12 and 5.x sessions share: namespaces, entry data, routing, limited logs.

JGroups payloads of the two wire families are not interchangeable, so each family lives in its
own namespace of the routing table: group ``G`` of a 2.12 client is stored as ``jgroups2:G``, of a
5.x client as ``jgroups5:G`` (:data:`gossiprouter.routing.RESERVED_PREFIXES`). Native clients
may list and watch those groups but not join them.

An entry registered by a JGroups client keeps, in :attr:`Entry.wire`, a :class:`JWire` with the
exact JGroups encodings of its logical and physical addresses, so member lists and SUSPECTs
re-emit the bytes the member sent (ExtendedUUID, TopologyUUID, ... included). Entries created
otherwise (provisioned in the config file) are rendered from their key and ``(host, port)``
pairs when possible (:func:`wire_address`, :func:`wire_physical`).

:class:`JGroupsSession` holds the parts of a session that do not depend on the wire version:
registration, clean removal, the routing of one message, and rate-limited logging.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.jgroups_common import JAddress
from gossiprouter.routing import Entry, Kind, Notice, Physical, RoutingError
from gossiprouter.sessions.base import Hub, Session

log = logging.getLogger("gossiprouter")

#: Reads a big-endian u32 (frame and payload lengths) in the hot loops.
U32 = struct.Struct(">I").unpack_from

# A per-connection header cache is cleared when it grows past this: one entry per (group,
# destination) a client sends to is plenty for clusters of hundreds of members, and a client
# cycling through made-up destinations must not grow the router's memory without bound.
CACHE_MAX = 1024
# Distinct header lengths remembered per connection (see the sessions' hot loops).
LENGTHS_MAX = 16
# At most one log line per this many seconds per connection and kind of problem.
LOG_INTERVAL = 1.0


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


class JGroupsSession(Session):
    """The version-independent part of the JGroups sessions.

    Subclasses set :attr:`protocol`, :attr:`prefix` and :attr:`version`, and implement
    ``on_data``, ``notify`` and ``farewell``.
    """

    prefix = "jgroups?:"
    version = 0

    def __init__(self, hub: Hub, peer: str) -> None:
        super().__init__(hub, peer)
        self.max_frame = hub.config.max_frame
        self.now = 0.0
        self._logged_at: dict[str, float] = {}

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

    def count_in(self, name: str) -> None:
        """Count a control frame received (metrics by type; MESSAGE counts as ``routed``)."""
        fin = self.hub.counters.frames_in
        key = f"{self.protocol}_{name}"
        fin[key] = fin.get(key, 0) + 1

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
            self.warn_limited("register", "registration of %s in %r refused: %s (%s)",
                              addr, full, e.message, e.code)
            return None
        if known is None:
            self.hub.log_membership("joined", entry, self)
        return held, notices

    def unregister(self, group: str, addr: JAddress) -> bool:
        """A clean leave of ``addr`` from ``group`` (no SUSPECT); False if this connection did
        not register it (JGroups lets anybody unregister anybody; we follow routing rule R8)."""
        full = self.prefix + group
        try:
            notices = self.hub.table.disconnect(self, full, addr.key)
        except RoutingError as e:
            self.hub.counters.drop("not_member")
            self.warn_limited("unregister", "unregister of %s from %r refused: %s", addr, full,
                              e.message)
            return False
        log.info("%s (%s) left %r via %r", addr, addr.key.hex(), full, self)
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
                log.info("%s (%s) left %r via %r (connection closed cleanly)", e.name or "-",
                         addr.hex(), group, self)
        self.hub.deliver(notices)

    def members(self, group: str) -> list[Entry]:
        """The entries of JGroups ``group``, in registration order."""
        return self.hub.table.members(self.prefix + group)

    # ------------------------------------------------------------------ routing (slow path)

    def route(self, group: str, dest: bytes | None, frames: bytes, count: int = 1) -> None:
        """Deliver ``count`` whole frames (``frames``, already in the receivers' wire form) from
        this connection to ``dest`` (a routing key; None = every member, the sender included).

        The hot path's second half: it reads the table the way ``resolve_unicast`` /
        ``resolve_multicast(include_sender=True)`` do, without their call overhead, and queues
        straight on the receiver's outbox, falling back to :meth:`Session.push` (the
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
            targets = cast("tuple[Session, ...]", g.targets())
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
        c: Session = carriers[-1]  # type: ignore[assignment]  # carriers are sessions here
        if not c.outbox.push(frames):
            c.push(frames, count)
        counters.delivered += count
