"""The JGroups 2.12 session: GossipRouter objects from TUNNEL / TCPGOSSIP 2.x clients.

2.12 has no framing: every request is a self-delimiting ``GossipData`` object (reference notes
§1), so a parse error leaves the stream unusable and closes the connection. Replies are partly
untyped (CONNECT is answered by one raw byte, GOSSIP_GET by a raw member list), so every reply
is queued as one push on this connection's FIFO outbox: nothing can interleave with it, and
a reply that cannot be queued closes the connection rather than being dropped.

:meth:`JGroups2Session.on_data` is the hot loop; the parsing is the codec's
:class:`gossiprouter.protocol.jgroups2_scan.Scanner`, which cuts each chunk into runs of MESSAGEs
with byte-identical headers, re-wrapped (group rewritten to null, as 2.12 does) into one bytes
object shared by every receiver, and other objects, decoded by the codec's full decoder
(:class:`gossiprouter.protocol.jgroups2.Decoder`). What is left here are the decisions: the
membership check and the route of each run, the handling of each other object, and the
policies for oversized and partial objects.
"""

from __future__ import annotations

import logging

from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.jgroups2_scan import Route, Scanner
from gossiprouter.protocol.jgroups_address import V2, JAddress
from gossiprouter.protocol.jgroups_scan import CONTROL, HELD, OVERSIZED, PARTIAL
from gossiprouter.routing.entries import Entry
from gossiprouter.sessions.base import Hub
from gossiprouter.sessions.jgroups_common import JGroupsSession, wire_address, wire_physical
from gossiprouter.sessions.outbox import Reply

log = logging.getLogger("gossiprouter")

_EMPTY_MEMBERS = b"\x00\x00"  # a GOSSIP_GET reply with no members


class JGroups2Session(JGroupsSession):
    """One JGroups 2.12 connection (TUNNEL or TCPGOSSIP, one RouterStub)."""

    protocol = "jgroups2"
    prefix = "jgroups2:"
    version = V2
    scanner_class = Scanner
    scanner: Scanner

    def __init__(self, hub: Hub, peer: str) -> None:
        super().__init__(hub, peer)
        # table group -> a (group, addr) this connection registered there (the sender check)
        self._witness: dict[str, tuple[str, bytes]] = {}
        # Groups where this connection was found to have a member, during on_data (only this
        # connection's own CONNECT/DISCONNECT/CLOSE can change that, so it is reset after every
        # other object).
        self._member_of: set[str] = set()

    # ------------------------------------------------------------------ the hot loop

    def on_data(self, data: bytes, now: float) -> None:
        """Process one received chunk: every complete object in it, in order."""
        scanner = self.scanner
        # Unless the scanner holds an incomplete object, which this chunk continues.
        chunk = self._start(data, now, carried=not scanner.holding)
        if chunk is None:
            return
        data = chunk
        self._member_of.clear()
        for kind, start, end, count, head in scanner.scan(data, self._run):
            if kind == CONTROL:
                if self._held:  # the object completed a held one: its bytes are released
                    self._reserve(0)
                self._handle(head)
                if self._after_control(data, end):
                    return
                self._member_of.clear()
            elif kind == OVERSIZED:
                # Above jgroups_max_frame, after a CONNECT (before, the scanner's decoder
                # refuses it): skipped as it streams past, the stream stays in sync.
                self._skip_frame(data, end, count, "frame_too_large")
            elif kind == PARTIAL:
                if not self._carry(data, start, end - start):
                    if count:  # a message body of known length: skipped unbuffered
                        self._skip_frame(data, end, end - start, "partial_frames_budget")
                    else:
                        self._no_budget()
            elif kind == HELD:
                if not self._reserve(count):
                    self._no_budget()
            else:  # ERROR: the stream is unusable
                self._reserve(0)
                self.fail(head)

    def _run(self, head: Route, frames: bytes, count: int) -> bool:
        """A run of ``count`` MESSAGEs with one header, re-wrapped, from the scanner: the
        membership check, then the route. True (stop scanning) when that closed this
        connection."""
        group = head[1]
        if group in self._member_of or self._is_member(group, self._member_of, count):
            self.route(group, head[2], frames, count)
            fast = self.hub.fast
            if fast is not None and self.fast_id is not None and group in self._member_of:
                # The compiled fast path repeats it: the header re-wrapped, to the same. Only
                # with a registration in the group (_is_member adds it then), not within the
                # after-leave window, whose end is not a change of the table.
                fast.learn_jgroups(self, group, head[2], head[4], head[3], head[0])
            return self.outbox.closed
        return False

    def _is_member(self, group: str, known: set[str] | None = None, count: int = 1) -> bool:
        """True when this connection registered at least one address in table ``group``
        (then added to ``known``); else ``count`` messages are dropped and counted.

        2.12 messages carry no sender, so this is the closest JGroups 2.12 allows to
        "the sender is a member" (JGroups itself routes anything).
        """
        regs = self.hub.table.registrations(self)
        key = self._witness.get(group)
        if key is None or key not in regs:
            key = next((k for k in regs if k[0] == group), None)
        if key is not None:
            self._witness[group] = key
            if known is not None:
                known.add(group)
            return True
        if self._after_leave(group, None, count):
            return True
        self.hub.counters.drop("not_member", count)
        self.warn_limited("not_member", "MESSAGE to %r dropped: this connection has no member "
                          "there (send CONNECT first)", group)
        return False

    # ------------------------------------------------------------------ other objects

    def _no_budget(self) -> None:
        """An incomplete object that is not a message body cannot be skipped (2.12 objects are
        not length-framed): with no room in the router-wide budget, the connection closes."""
        self.scanner.reset()
        self._rest = bytearray()
        self._reserve(0)
        self.hub.counters.drop("partial_frames_budget")
        self.fail(ProtocolError("an incomplete object does not fit the router's "
                                "partial_frames_budget", code="limit"))

    def _handle(self, ev: j2.ServerEvent) -> None:
        match ev:
            case j2.Message(group, dest, payload):
                self._message(group, dest, payload)
            case j2.Connect():
                self.count_in("connect")
                self._connect(ev)
            case j2.Disconnect(group, addr):
                self.count_in("disconnect")
                if group is not None and addr is not None:
                    self.unregister(group, addr)
                # Always answered: TUNNEL's receiver thread stops on DISCONNECT_OK, and the
                # address is not registered here afterwards either way.
                self._reply(j2.disconnect_ok())
            case j2.GossipGet(group):
                self.count_in("gossip_get")
                self._gossip_get(group)
            case j2.Ping():
                self.count_in("ping")
            case j2.Close():
                self.count_in("close")
                self.leave_all()
                self.outbox.close("close")
            case j2.Unknown(t):
                self.count_in("unknown")
                self.warn_limited("unknown", "ignoring a GossipData of unknown type %#04x", t)

    def _message(self, group: str | None, dest: JAddress | None, payload: bytes) -> None:
        """A MESSAGE the scanner did not put in a run (e.g. no buffer, or an unusual header)."""
        if group is None:
            self.hub.counters.drop("no_group")
            self.warn_limited("no_group", "MESSAGE without a group dropped")
            return
        if not payload:
            # As 2.12 does: an empty or null buffer is not a message.
            self.hub.counters.drop("empty_message")
            self.warn_limited("empty_message", "MESSAGE with an empty buffer dropped")
            return
        full = self.prefix + group
        if self._is_member(full):
            self.route(full, None if dest is None else dest.key,
                       j2.message_to_client(dest, payload))

    def _connect(self, ev: j2.Connect) -> None:
        if ev.group is None or ev.addr is None:
            # 2.12 answers OP_FAIL for a null group (and closes without a word for a null
            # address); either way the client is broken: tell it, then close.
            self.warn_limited("connect", "CONNECT without %s refused",
                              "a group" if ev.group is None else "an address")
            self._reply(j2.op_fail())
            self.outbox.close("protocol")
            return
        res = self.register(ev.group, ev.addr, ev.name, ev.physical)
        if res is None:  # a limit: OP_FAIL, the connection stays usable (routing rule R14)
            self._reply(j2.op_fail())
            return
        held, notices = res
        # CONNECT_OK is this connection's first byte after the request: the registration above
        # and the push below run without yielding, and nothing else reaches this outbox in
        # between (table.connect only returns notices), so no routed message can precede or
        # split it. Registering first means a failed push (slow consumer) closes the
        # connection *after* the registration, which the close then undoes.
        self._reply(j2.connect_ok())
        for frame in held:
            self.push(frame)
        self.hub.deliver(notices)

    def _gossip_get(self, group: str | None) -> None:
        if group is None:
            # 2.12 closes the connection (NPE); an empty list is the harmless answer.
            self._reply(_EMPTY_MEMBERS)
            return
        members = []
        for e in self.members(group):
            addr = wire_address(e, V2)
            if addr is not None:
                members.append(j2.Member(addr, e.name, wire_physical(e, V2)))
        # One push: the reply has no type byte, so it must never be interleaved.
        self._reply(j2.gossip_get_reply(members[:0x7FFF]))

    def _reply(self, data: bytes) -> None:
        """Queue a reply; if the queue is full, make room (policy ``drop``: the oldest routed
        frames go, never a reply) or else close rather than drop it.

        The client can only tell replies from other objects by their order, so a dropped
        reply (the ``drop`` policy) would make it misread whatever follows: it is queued as a
        :class:`Reply`, which :meth:`Outbox.shed` never drops.
        """
        if self.queue(Reply(data)):
            return
        self.hub.counters.slow_consumer_disconnects += 1
        log.warning("closing %r: slow consumer (a reply did not fit its outbound queue)", self)
        self.outbox.close("slow_consumer", discard=True)

    # ------------------------------------------------------------------ carrier interface

    @classmethod
    def event_frame(cls, kind: str, entry: Entry) -> bytes | None:
        """JGroups 2.12 only understands SUSPECT (join/leave are for native watchers)."""
        if kind != "suspect":
            return None
        addr = wire_address(entry, V2)
        return None if addr is None else j2.suspect(addr)

    def farewell(self, code: str, message: str) -> bytes:
        # 2.12 has no way to say why: the connection is just closed.
        return b""


def factory(hub: Hub, peer: str, first: bytes) -> JGroups2Session:
    """The server's session factory for ``jgroups2`` (``first`` is fed by the server)."""
    return JGroups2Session(hub, peer)
