"""The JGroups 2.12 session: GossipRouter objects from TUNNEL / TCPGOSSIP 2.x clients.

2.12 has no framing: every request is a self-delimiting ``GossipData`` object (reference notes
§1), so a parse error leaves the stream unusable and closes the connection. Replies are partly
untyped (CONNECT is answered by one raw byte, GOSSIP_GET by a raw member list), so every reply
is queued as one push on this connection's FIFO outbox: nothing can interleave with it, and
a reply that cannot be queued closes the connection rather than being dropped.

:meth:`JGroups2Session.on_data` is the hot loop. A MESSAGE header (type, group, destination,
logical name, member and physical lists, the buffer's presence byte) is looked up, as the exact
header bytes, in a per-connection cache filled the first time a header is seen; on a hit only
the payload length is read. Consecutive MESSAGEs with byte-identical headers form a *run*,
re-wrapped (group rewritten to null, as 2.12 does) into one bytes object shared by every
receiver and pushed once. Anything else goes through the codec's full decoder
(:class:`gossiprouter.protocol.jgroups2.Decoder`).
"""

from __future__ import annotations

import logging

from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.jgroups_common import (
    V2,
    JAddress,
    NeedMore,
    Reader,
    read_address,
    read_addresses,
)
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

_MESSAGE = j2.MESSAGE
# A header of a MESSAGE: (header length, table group, destination key or None, the bytes that
# start the re-wrapped message up to and including the buffer's presence byte).
_Route = tuple[int, str, bytes | None, bytes]
# _learn's answers besides a route.
_SLOW = 0  # not a plain MESSAGE header: use the full decoder
_EMPTY_MEMBERS = b"\x00\x00"  # a GOSSIP_GET reply with no members
# The slow path hands the decoder the rest of a chunk in growing windows, so that a chunk of
# many small control objects is not copied once per object.
_FIRST_WINDOW = 256


class JGroups2Session(JGroupsSession):
    """One JGroups 2.12 connection (TUNNEL or TCPGOSSIP, one RouterStub)."""

    protocol = "jgroups2"
    prefix = "jgroups2:"
    version = V2

    def __init__(self, hub: Hub, peer: str) -> None:
        super().__init__(hub, peer)
        # A decoder holding an object of the slow path that is not complete yet.
        self._dec: j2.Decoder | None = None
        self._routes: dict[bytes, _Route] = {}
        self._lengths: list[int] = []
        # table group -> a (group, addr) this connection registered there (the sender check)
        self._witness: dict[str, tuple[str, bytes]] = {}

    # ------------------------------------------------------------------ the hot loop

    def on_data(self, data: bytes, now: float) -> None:
        """Process one received chunk: every complete object in it, in order."""
        self.last_recv = self.now = now
        if self._skip:
            data = self._skip_through(data)
            if not data:
                return
        pos = 0
        if self._dec is not None:
            pos = self._resume(data)
            if pos < 0:
                return
            self.spend_control()  # the object completed by this chunk
            if self.paused:
                self.keep(data, pos)
                return
        else:
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
        # The current run of MESSAGEs with one header: the header bytes, its length, its
        # route, and the (length + payload) part of each message.
        run_hdr = b""
        hlen = 0
        run: _Route | None = None
        parts: list[bytes] = []
        # Groups where this connection was found to have a member, during this call (only
        # this connection's own CONNECT/DISCONNECT/CLOSE can change that, so it is reset
        # after every object of the slow path).
        member_of: set[str] = set()
        while pos < size:
            if parts and data.startswith(run_hdr, pos):
                p = pos + hlen
                if p + 4 <= size:
                    n = u32(data, p)[0]
                    end = p + 4 + n
                    # n == 0 (dropped) and oversize (refused) are the slow path's business.
                    if n and end <= size and end - pos <= max_frame:
                        if data[end + hlen : end + hlen + 4] == data[p : p + 4]:
                            # The next one may have the same header and length: count the
                            # bulk at C speed.
                            step = end - pos
                            k = same_frames(data, pos, step, hlen + 4, size)
                            tail = step - hlen
                            parts += [data[a : a + tail] for a in range(p, p + k * step, step)]
                            pos += k * step
                        else:
                            parts.append(data[p:end])
                            pos = end
                        continue
            if parts:
                assert run is not None
                self._flush(run, parts)
                parts = []
                if ob.closed:
                    return
            if data[pos] == _MESSAGE:
                hit: _Route | int | None = None
                for length in lengths:
                    hit = routes.get(data[pos : pos + length])
                    if hit is not None:
                        break
                if hit is None:
                    hit = self._learn(data, pos, size)
                if isinstance(hit, tuple):
                    p = pos + hit[0]
                    if p + 4 > size:
                        if not self._carry(data, pos, p + 4 - pos):
                            self._no_budget()
                        return
                    n = u32(data, p)[0]
                    end = p + 4 + n
                    if n and end - pos <= max_frame:
                        if end > size:
                            if not self._carry(data, pos, end - pos):
                                self._oversized(end - pos, "partial_frames_budget")
                                self._skip = end - size
                            return
                        group = hit[1]
                        if group in member_of or self._is_member(group, member_of):
                            run = hit
                            hlen = hit[0]
                            run_hdr = data[pos:p]
                            parts.append(data[p:end])
                        pos = end
                        continue
                    if n and self.registered:
                        # Above jgroups_max_frame. The buffer's length is known: the message
                        # streams past unbuffered and the stream stays in sync (before a
                        # CONNECT, the decoder below refuses it and the connection closes).
                        self._oversized(end - pos, "frame_too_large")
                        if end > size:
                            self._skip = end - size
                            return
                        pos = end
                        continue
                elif hit:  # NeedMore: the header itself is incomplete
                    if not self._carry(data, pos, hit):
                        self._no_budget()
                    return
            pos = self._slow(data, pos, size)
            if self._dec is None:  # an object was handled (else it is incomplete, kept)
                self.spend_control()
            if ob.closed:
                return
            if self.paused:  # budget or turn spent: resume later
                self.keep(data, pos)
                return
            member_of.clear()
            max_frame = self.max_frame  # raised by the first CONNECT
        if parts:
            assert run is not None
            self._flush(run, parts)

    def _flush(self, run: _Route, parts: list[bytes]) -> None:
        """Route a run of messages with one header, re-wrapped (group null, as 2.12 does) into
        one bytes object shared by every receiver."""
        head = run[3]
        out = head + head.join(parts) if len(parts) > 1 else head + parts[0]
        self.route(run[1], run[2], out, len(parts))

    def _learn(self, data: bytes, pos: int, size: int) -> _Route | int:
        """Parse the header of the MESSAGE at ``pos`` and cache it.

        Returns the route; or the number of bytes the header needs when it is incomplete; or
        ``_SLOW`` when the object is not a MESSAGE with a group and a buffer, or does not parse
        (the full decoder then handles it, or closes the connection).
        """
        r = Reader(data, pos, size, pos + self.max_frame)
        try:
            r.u8()  # the type, 0x0a
            group = r.string()
            dest = read_address(r, V2)
            r.string()  # logical_name: unused in a MESSAGE
            read_addresses(r, V2)  # mbrs: unused
            read_addresses(r, V2)  # physical_addrs: unused
            has_buffer = r.presence("byte buffer")
        except NeedMore as e:
            return e.needed - pos
        except ProtocolError:
            return _SLOW
        if group is None or not has_buffer:
            return _SLOW
        length = r.pos - pos
        # The re-wrapped form: group null, the destination as received, no sender field.
        head = j2.message_to_client(dest, b"")[:-4]
        hdr = data[pos : r.pos]
        route: _Route = (length, self.prefix + group, None if dest is None else dest.key, head)
        routes = self._routes
        if len(routes) >= CACHE_MAX:
            routes.clear()
            self._lengths.clear()
        routes[hdr] = route
        if length not in self._lengths:
            if len(self._lengths) >= LENGTHS_MAX:
                self._lengths.pop(0)
            self._lengths.append(length)
        return route

    def _is_member(self, group: str, known: set[str] | None = None) -> bool:
        """True when this connection registered at least one address in table ``group``
        (then added to ``known``).

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
        if self._after_leave(group, None):
            return True
        self.hub.counters.drop("not_member")
        self.warn_limited("not_member", "MESSAGE to %r dropped: this connection has no member "
                          "there (send CONNECT first)", group)
        return False

    # ------------------------------------------------------------------ slow path

    def _slow(self, data: bytes, pos: int, size: int) -> int:
        """Decode and handle the object at ``pos`` with the full decoder; return where the next
        one starts (``size`` when the rest of the chunk is an incomplete object, kept)."""
        dec = j2.Decoder(self.max_frame)
        fed = pos
        window = _FIRST_WINDOW
        try:
            while True:
                stop = min(size, fed + window)
                dec.feed(data[fed:stop])
                fed = stop
                ev = dec.next_event()
                if ev is not None:
                    break
                if fed >= size:
                    self._dec = dec
                    if not self._reserve(dec.buffered):
                        self._no_budget()
                    return size
                window *= 4
        except ProtocolError as e:
            self.fail(e)
            return size
        self._handle(ev)
        return fed - dec.buffered

    def _resume(self, data: bytes) -> int:
        """Feed the decoder holding an incomplete object; return where the rest of ``data``
        starts once it is complete and handled, or -1."""
        dec = self._dec
        assert dec is not None
        dec.feed(data)
        try:
            ev = dec.next_event()
        except ProtocolError as e:
            self._dec = None
            self._reserve(0)
            self.fail(e)
            return -1
        if ev is None:
            if not self._reserve(dec.buffered):
                self._no_budget()
            return -1
        self._dec = None
        self._reserve(0)
        # The object ended inside ``data``: what the decoder still holds is the tail of it.
        pos = len(data) - dec.buffered
        self._handle(ev)
        return -1 if self.outbox.closed else pos

    def _no_budget(self) -> None:
        """An incomplete object that is not a message body cannot be skipped (2.12 objects are
        not length-framed): with no room in the router-wide budget, the connection closes."""
        self._dec = None
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
        """A MESSAGE the fast path did not take (e.g. no buffer, or an unusual header)."""
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
        """Queue a reply; if the queue is full, close rather than drop it.

        The client can only tell replies from other objects by their order, so a dropped
        reply (the ``drop`` policy) would make it misread whatever follows.
        """
        ob = self.outbox
        if ob.push(data) or ob.closed:
            return
        self.hub.counters.slow_consumer_disconnects += 1
        log.warning("closing %r: slow consumer (a reply did not fit its outbound queue)", self)
        ob.close("slow_consumer", discard=True)

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
