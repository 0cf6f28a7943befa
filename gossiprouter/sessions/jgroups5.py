"""The JGroups 3.6.5+/4.x/5.x session: length-framed GossipData from TUNNEL / TCPGOSSIP clients.

Every frame is an ``int32`` length and that many bytes (reference notes §2), so the stream is
cut into frames first and each frame is parsed *within* its bounds: a frame that does not parse
is counted, logged at most once per second, and skipped, and the connection stays in sync. A
length above ``jgroups_max_frame`` is skipped as the frame streams past, never buffered
(``_skip``), and so is a frame the router-wide ``partial_frames_budget`` has no room for: a 5.x
RouterStub survives only one router-side close, and JGroups retransmits what is dropped. Before
the connection's first REGISTER the limit is ``preauth_max_frame`` and a longer prefix closes
the connection. The length ``-5`` is the peer's graceful close.

:meth:`JGroups5Session.on_data` is the hot loop. MESSAGE frames are forwarded as the exact bytes
received, length prefix included. Their header (type, group, destination, sender) is looked up,
as the exact header bytes, in a per-connection cache filled the first time a header is seen, so
a known header costs one slice and one dict lookup whatever address classes it holds (UUID,
ExtendedUUID, SiteUUID...). Consecutive MESSAGE frames with byte-identical headers form a *run*,
forwarded as one slice of the received chunk shared by every receiver. Every other frame goes
through the codec's full decoder (:class:`gossiprouter.protocol.jgroups5.Decoder`).
"""

from __future__ import annotations

import logging

from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.jgroups_common import V5, JAddress, NeedMore, Reader, read_address
from gossiprouter.protocol.scan import same_frames
from gossiprouter.routing import Entry
from gossiprouter.sessions.base import Hub
from gossiprouter.sessions.jgroups_common import (
    CACHE_MAX,
    LENGTHS_MAX,
    U32,
    JGroupsSession,
    wire_address,
    wire_physical,
)

log = logging.getLogger("gossiprouter")

_MESSAGE = j5.MESSAGE
_CLOSE = 0xFFFFFFFB  # the length -5 read as unsigned
_NEGATIVE = 0x80000000
ALL_GROUPS = j5.ALL_GROUPS
# A MESSAGE header: (header length, table group, destination key or None, (group, sender key)
# as the routing table's registration key, for the sender check).
_Route = tuple[int, str, bytes | None, tuple[str, bytes]]


class JGroups5Session(JGroupsSession):
    """One JGroups 3.6.5+ connection (a RouterStub of TUNNEL or TCPGOSSIP)."""

    protocol = "jgroups5"
    prefix = "jgroups5:"
    version = V5

    def __init__(self, hub: Hub, peer: str) -> None:
        super().__init__(hub, peer)
        self._routes: dict[bytes, _Route] = {}
        self._lengths: list[int] = []

    # ------------------------------------------------------------------ the hot loop

    def on_data(self, data: bytes, now: float) -> None:
        """Process one received chunk: every complete frame in it, in order."""
        self.last_recv = self.now = now
        if self._skip:
            data = self._skip_through(data)
            if not data:
                return
        resumed = self._complete(data)
        if resumed is None:
            return
        data = resumed
        size = len(data)
        ob = self.outbox
        routes = self._routes
        lengths = self._lengths
        max_frame = self.max_frame
        u32 = U32
        pos = 0
        # The current run of MESSAGE frames with one header: the header bytes (after the
        # length prefix), its length, its route, where the run starts, how many frames.
        run_hdr = b""
        hlen = 0
        run: _Route | None = None
        run_start = run_n = 0
        # This connection's registrations, for the sender check; a new dict may appear only
        # through this connection's own REGISTER, so it is fetched again after other frames.
        regs = self.hub.table.registrations(self)
        while size - pos >= 4:
            n = u32(data, pos)[0]
            end = pos + 4 + n
            if run_n and n <= max_frame and end <= size and data.startswith(run_hdr, pos + 4):
                q = pos + 4 + hlen
                if q + 4 <= end and q + 4 + u32(data, q)[0] == end:
                    if data[end : end + 4] == data[pos : pos + 4]:
                        # The next frame has the same length: count the bulk at C speed.
                        k = same_frames(data, pos, end - pos, 8 + hlen, size)
                        run_n += k
                        pos += k * (end - pos)
                    else:
                        run_n += 1
                        pos = end
                    continue
            if run_n:
                assert run is not None
                self.route(run[1], run[2], data[run_start:pos], run_n)
                run_n = 0
                if ob.closed:
                    return
            if n >= _NEGATIVE:
                if n == _CLOSE:
                    self._close_marker()
                else:
                    self.fail(ProtocolError(f"negative frame length {n - (1 << 32)}"))
                return
            if n > max_frame:
                if not self.registered:
                    # Refused on the prefix, nothing buffered: before its first registration
                    # there is no member to keep in sync with.
                    self.fail(ProtocolError(
                        f"frame length {n} before any REGISTER exceeds preauth_max_frame "
                        f"{max_frame}", code="frame_too_large"))
                    return
                # Skipped as it streams past: the stream stays in sync, the member connected.
                self._oversized(n, "frame_too_large")
                if end > size:
                    self._skip = end - size
                    return
                pos = end
                continue
            if end > size:
                break
            body = pos + 4
            if n and data[body] == _MESSAGE:
                hit: _Route | None = None
                for length in lengths:
                    hit = routes.get(data[body : body + length])
                    if hit is not None:
                        break
                if hit is None:
                    hit = self._learn(data, body, end)
                if hit is not None:
                    q = body + hit[0]
                    if q + 4 <= end and q + 4 + u32(data, q)[0] == end:
                        if hit[3] in regs or self._is_member(hit[1], hit[3]):
                            run = hit
                            hlen = hit[0]
                            run_hdr = data[body:q]
                            run_start = pos
                            run_n = 1
                        pos = end
                        continue
            self._frame(data[pos:end])
            self.spend_control()
            if ob.closed:
                return
            if self.paused:  # budget or turn spent: resume later
                self.keep(data, end)
                return
            regs = self.hub.table.registrations(self)
            max_frame = self.max_frame  # raised by the first REGISTER
            pos = end
        if run_n:
            assert run is not None
            self.route(run[1], run[2], data[run_start:pos], run_n)
            if ob.closed:
                return
        if pos < size:
            # The whole frame once its length is known; else just the length prefix.
            need = 4 + u32(data, pos)[0] if size - pos >= 4 else 4
            if not self._carry(data, pos, need):
                # No room in the router-wide budget: skipped like an oversized frame.
                self._oversized(need - 4, "partial_frames_budget")
                self._skip = need - (size - pos)

    def _learn(self, data: bytes, body: int, end: int) -> _Route | None:
        """Parse and cache the header of the MESSAGE frame ``data[body:end]``; None when it does
        not parse or has no group or sender (the full decoder then deals with the frame)."""
        r = Reader(data, body, end)
        try:
            r.u8()  # the type, 4
            group = r.string()
            dest = read_address(r, V5)
            sender = read_address(r, V5)
        except (NeedMore, ProtocolError):
            return None
        if group is None or sender is None:
            return None
        full = self.prefix + group
        length = r.pos - body
        route: _Route = (length, full, None if dest is None else dest.key, (full, sender.key))
        routes = self._routes
        if len(routes) >= CACHE_MAX:
            routes.clear()
            self._lengths.clear()
        routes[data[body : r.pos]] = route
        if length not in self._lengths:
            if len(self._lengths) >= LENGTHS_MAX:
                self._lengths.pop(0)
            self._lengths.append(length)
        return route

    def _is_member(self, group: str, reg: tuple[str, bytes] | None) -> bool:
        """The sender must be registered in the group on this connection (JGroups routes
        anything; a frame from an unregistered sender is dropped and counted). ``reg`` is the
        (table group, sender key) registration, None for a frame without a sender."""
        if reg is not None and reg in self.hub.table.registrations(self):
            return True
        if reg is not None and self._after_leave(*reg):
            return True
        self.hub.counters.drop("not_member")
        self.warn_limited("not_member", "MESSAGE to %r dropped: its sender is not registered "
                          "there on this connection", group)
        return False

    # ------------------------------------------------------------------ other frames

    def _frame(self, frame: bytes) -> None:
        """One complete frame that is not a plain MESSAGE: the full decoder."""
        dec = j5.Decoder(self.max_frame)
        dec.feed(frame)
        try:
            ev = dec.next_event()
        except ProtocolError as e:  # not reached: the length was checked by on_data
            self.fail(e)
            return
        if ev is not None:
            self._handle(ev)

    def _handle(self, ev: j5.Event) -> None:
        match ev:
            case j5.Message(group, dest, sender, raw):
                if group is None:
                    self.hub.counters.drop("no_group")
                    self.warn_limited("no_group", "MESSAGE without a group dropped")
                    return
                full = self.prefix + group
                if not self._is_member(full, None if sender is None else (full, sender.key)):
                    return
                self.route(full, None if dest is None else dest.key, raw)
            case j5.Heartbeat(raw):
                self.count_in("heartbeat")
                # JGroups 5.2.6+ clients time the router out without an echo of these bytes.
                self.push(raw)
            case j5.Register(group, addr, name, physical):
                self.count_in("register")
                if group is None or addr is None:
                    self._malformed("REGISTER without a group or an address")
                    return
                res = self.register(group, addr, name, None if physical is None else (physical,))
                if res is not None:  # no reply in 5.x, whatever happened
                    held, notices = res
                    for frame in held:
                        self.push(frame)
                    self.hub.deliver(notices)
            case j5.Unregister(group, addr):
                self.count_in("unregister")
                if group is None or addr is None:
                    self._malformed("UNREGISTER without a group or an address")
                    return
                self.unregister(group, addr)
            case j5.GetMembers(group):
                self.count_in("get_mbrs")
                self._get_members(group)
            case j5.Malformed(reason, body_len):
                self._malformed(f"{reason} ({body_len} bytes)")
            case j5.CloseMarker():  # not reached: on_data handles the -5 length itself
                self._close_marker()
            case _:
                # GET_MBRS_RSP, SUSPECT...: router -> client frames; a client has no business
                # sending them.
                self.count_in("unexpected")
                self.warn_limited("unexpected", "ignoring %s from a client", type(ev).__name__)

    def _malformed(self, reason: str) -> None:
        self.hub.counters.drop("malformed")
        self.warn_limited("malformed", "skipped a bad frame: %s", reason)

    def _close_marker(self) -> None:
        """The peer's graceful close (-5, then FIN).

        JGroups 5.x TUNNEL unregisters first; whatever is still registered is handled like any
        other close without UNREGISTER (removed and suspected, as JGroups 5.5.6 does), by the
        server when the outbox closes.
        """
        self.count_in("close")
        self.outbox.close("close_marker")

    def _get_members(self, group: str | None) -> None:
        if group is not None:
            # Type 3 (GET_MBRS_RSP), also for an unknown group (empty list): every 3.6.5+
            # client accepts it, while 5.0-5.4.3 clients fail on type 7.
            why = j5.writable(group, None)
            if why is not None:
                # The reply repeats the queried group name. One that cannot be written back
                # names no group that could exist (registration refuses it): skipped, as 5.x
                # does with frames it cannot answer; logged and counted.
                self.hub.counters.drop("unanswerable_query")
                self.warn_limited("get_mbrs", "GET_MBRS for %r not answered: %s", group, why)
                return
            self.push(j5.get_members_reply(group, self._member_list(self.members(group)), False))
            return
        # Every group (5.4.4+): one frame per group, the last one GET_MBRS_RSP_LAST.
        table = self.hub.table
        cut = len(self.prefix)
        groups = [
            (name[cut:], list(g.entries.values()))
            for name, g in table.groups.items()
            if name.startswith(self.prefix) and g.entries
        ]
        if not groups:
            # JGroups 5.5.6 sends nothing at all; a LAST frame tells the client it is done.
            self.push(j5.get_members_reply(ALL_GROUPS, (), True))
            return
        last = len(groups) - 1
        for i, (name, entries) in enumerate(groups):
            self.push(j5.get_members_reply(f"{ALL_GROUPS}:{name}", self._member_list(entries),
                                           i == last))

    @staticmethod
    def _member_list(entries: list[Entry]) -> list[j5.Member]:
        out = []
        for e in entries[:0x7FFF]:
            addr = wire_address(e, V5)
            if addr is None:
                continue
            physical = wire_physical(e, V5)
            out.append(j5.Member(addr, e.name, physical[0] if physical else None))
        return out

    # ------------------------------------------------------------------ carrier interface

    @classmethod
    def event_frame(cls, kind: str, entry: Entry) -> bytes | None:
        """JGroups 5.x only understands SUSPECT (join/leave are for native watchers)."""
        if kind != "suspect":
            return None
        addr: JAddress | None = wire_address(entry, V5)
        return None if addr is None else j5.suspect(entry.group[len(cls.prefix) :], addr)

    def farewell(self, code: str, message: str) -> bytes:
        # 5.x cannot say why either, but the -5 marker tells the client it was deliberate.
        return j5.CLOSE_MARKER


def factory(hub: Hub, peer: str, first: bytes) -> JGroups5Session:
    """The server's session factory for ``jgroups5`` (``first`` is fed by the server)."""
    return JGroups5Session(hub, peer)
