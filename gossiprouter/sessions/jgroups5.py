"""The JGroups 3.6.5+/4.x/5.x session: length-framed GossipData from TUNNEL / TCPGOSSIP clients.

Every frame is an ``int32`` length and that many bytes (reference notes §2), so the stream is
cut into frames first and each frame is parsed *within* its bounds: a frame that does not parse
is counted, logged at most once per second, and skipped, and the connection stays in sync. A
length above ``jgroups_max_frame`` is skipped as the frame streams past, never buffered
(``_skip``), and so is a frame the router-wide ``partial_frames_budget`` has no room for: a 5.x
RouterStub survives only one router-side close, and JGroups retransmits what is dropped. Before
the connection's first REGISTER the limit is ``preauth_max_frame`` and a longer prefix closes
the connection. The length ``-5`` is the peer's graceful close.

:meth:`JGroups5Session.on_data` is the hot loop; the parsing is the codec's
:class:`gossiprouter.protocol.jgroups5_scan.Scanner`, which cuts each chunk into runs of MESSAGE
frames with byte-identical headers (forwarded as one slice of the received chunk, length
prefixes included, shared by every receiver) and other frames. What is left here are the
decisions: the sender check and the route of each run, the full decoder
(:class:`gossiprouter.protocol.jgroups5.Decoder`) and handling of each other frame, and the
policies for oversized, partial and closing frames.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.jgroups5_scan import Route, Scanner
from gossiprouter.protocol.jgroups_address import V5, JAddress
from gossiprouter.protocol.jgroups_scan import CLOSED, CONTROL, OVERSIZED, PARTIAL
from gossiprouter.routing.entries import Entry
from gossiprouter.sessions.base import Hub
from gossiprouter.sessions.jgroups_common import JGroupsSession, wire_address, wire_physical

log = logging.getLogger("gossiprouter")

ALL_GROUPS = j5.ALL_GROUPS


class JGroups5Session(JGroupsSession):
    """One JGroups 3.6.5+ connection (a RouterStub of TUNNEL or TCPGOSSIP)."""

    protocol = "jgroups5"
    prefix = "jgroups5:"
    version = V5
    scanner_class = Scanner

    def __init__(self, hub: Hub, peer: str) -> None:
        super().__init__(hub, peer)
        # This connection's registrations during on_data (the sender check of _run).
        self._regs: Mapping[tuple[str, bytes], Entry] = {}

    @staticmethod
    def frames_in(chunk: bytes) -> int:
        """The frames in a queued chunk: each is an int32 length and that many bytes."""
        n = pos = 0
        end = len(chunk)
        while pos + 4 <= end:
            pos += 4 + max(0, int.from_bytes(chunk[pos:pos + 4], "big", signed=True))
            n += 1
        return max(n, 1)

    # ------------------------------------------------------------------ the hot loop

    def on_data(self, data: bytes, now: float) -> None:
        """Process one received chunk: every complete frame in it, in order."""
        chunk = self._start(data, now)
        if chunk is None:
            return
        data = chunk
        # This connection's registrations, for the sender check; a new dict may appear only
        # through this connection's own REGISTER, so it is fetched again after control frames.
        self._regs = self.hub.table.registrations(self)
        for kind, start, end, count, head in self.scanner.scan(data, self._run):
            if kind == CONTROL:
                self._frame(data[start:end])
                if self._after_control(data, end):
                    return
                self._regs = self.hub.table.registrations(self)
            elif kind == OVERSIZED:
                if not self.registered:
                    # Refused on the prefix, nothing buffered: before its first registration
                    # there is no member to keep in sync with.
                    self.fail(ProtocolError(
                        f"frame length {count} before any REGISTER exceeds preauth_max_frame "
                        f"{self.scanner.max_frame}", code="frame_too_large"))
                    return
                # Skipped as it streams past: the stream stays in sync, the member connected.
                self._skip_frame(data, end, count, "frame_too_large")
            elif kind == PARTIAL:
                if not self._carry(data, start, end - start):
                    # No room in the router-wide budget: skipped like an oversized frame.
                    self._skip_frame(data, end, end - start - 4, "partial_frames_budget")
            elif kind == CLOSED:
                self._close_marker()
            else:  # ERROR: a negative length other than the close marker
                self.fail(head)

    def _run(self, head: Route, frames: bytes, count: int) -> bool:
        """A run of ``count`` MESSAGEs with one header, from the scanner: the sender check,
        then the route. True (stop scanning) when that closed this connection."""
        registered = head[3] in self._regs
        if registered or self._is_member(head[1], head[3], count):
            self.route(head[1], head[2], frames, count)
            fast = self.hub.fast
            if registered and fast is not None and self.fast_id is not None:
                # The compiled fast path repeats it: the frames as received, to the same. Only
                # for a registered sender: the after-leave window is not the table's to end.
                fast.learn_jgroups(self, head[1], head[2], head[4], b"", 0)
            return self.outbox.closed
        return False

    def _is_member(self, group: str, reg: tuple[str, bytes] | None, count: int = 1) -> bool:
        """The sender must be registered in the group on this connection (JGroups routes
        anything; ``count`` frames from an unregistered sender are dropped and counted).
        ``reg`` is the (table group, sender key) registration, None for a frame without a
        sender."""
        if reg is not None and reg in self.hub.table.registrations(self):
            return True
        if reg is not None and self._after_leave(*reg, count):
            return True
        self.hub.counters.drop("not_member", count)
        self.warn_limited("not_member", "MESSAGE to %r dropped: its sender is not registered "
                          "there on this connection", group)
        return False

    # ------------------------------------------------------------------ other frames

    def _frame(self, frame: bytes) -> None:
        """One complete frame that is not a plain MESSAGE: the full decoder."""
        dec = j5.Decoder(self.scanner.max_frame)
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
            case j5.CloseMarker():  # not reached: the scanner reports the -5 length itself
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
