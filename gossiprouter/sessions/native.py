"""The native protocol session: GRTR frames in, routing decisions and queued bytes out.

:meth:`NativeSession.on_data` is the router's hot loop: one received chunk in,
bytes queued on the receivers' outboxes out, no I/O. ROUTE frames are
recognised from their first two body bytes and forwarded as the exact bytes
received (one bytes object shared by every receiver of a multicast); every
other frame goes through the full, validating decoder.
"""

from __future__ import annotations

import logging
import struct

from gossiprouter.protocol import native as wire
from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.native_state import NativeState, Role, State
from gossiprouter.protocol.scan import same_frames
from gossiprouter.routing import Carrier, Entry, RoutingError, RoutingTable, is_reserved
from gossiprouter.sessions.base import Hub, Session
from gossiprouter.topics import TopicError, TopicId, pattern, topic_id

log = logging.getLogger("gossiprouter")

_LEN = struct.Struct(">I")
_ROUTE0, _ROUTE1 = 0x95, int(wire.T.ROUTE)
_PUB0, _PUB1 = 0x98, int(wire.T.PUBLISH)  # fixarray of 8, PUBLISH
_EVENT_KINDS = frozenset(wire.EVENT_KINDS)
_Route = tuple[str, bytes | None, bytes]  # group, dest, sender
# Requests naming a group that authentication (tokens' group patterns) may forbid.
_GROUP_REQUESTS = (wire.Connect, wire.GetMembers, wire.Watch, wire.Subscribe, wire.Unsubscribe)


def _federation(table: RoutingTable) -> dict[str, str]:
    """WELCOME's ``federation`` setting: present only on a bridged router."""
    return {} if table.federation is None else {"federation": table.federation}


def deliver_publication(table: RoutingTable, group: str, sender: bytes, tid: TopicId,
                        frame: bytes, echo: bool, count: int = 1) -> int:
    """Queue the PUBLISH ``frame`` (the same bytes for every receiver) on
    each connection carrying at least one member of ``group`` whose pattern matches
    ``tid``; returns the number of copies.

    A member matching through several patterns is one target; several such members on
    one connection (shared transport) get one copy, which the client hands to each of
    its matching channels. The publisher's own member (``sender``) is left out unless
    ``echo``. A member in reconnect grace has the frame held for it. ``frame`` may be
    ``count`` whole PUBLISH frames to the same id (a run), delivered as one chunk.
    """
    carriers: dict[Carrier, None] = {}
    for e in table.topic_targets(group, tid):
        if e.addr == sender and not echo:
            continue
        c = e.carrier
        if c is None:
            table.hold(e, frame)
        else:
            carriers[c] = None
    for c in carriers:
        c.push(frame, count)
    table.stats.topic_deliveries += len(carriers) * count
    return len(carriers) * count


class NativeSession(Session):
    """One native-protocol connection, after its ``GRTR`` preamble."""

    protocol = "native"

    def __init__(self, hub: Hub, peer: str, identity: str | None = None) -> None:
        super().__init__(hub, peer)
        # The protocol state (HELLO first and once, who may send what: the table in
        # protocol/native_state.py), consulted for every control frame in and out.
        self.proto = NativeState(Role.ROUTER)
        # ``proto.state is State.OPEN``, kept in step by _sync: the hot loop's per-frame
        # test stays one attribute read.
        self.ready = False
        self.identity = identity
        # Largest frame accepted: small until the HELLO is accepted (a HELLO is tiny, and an
        # unauthenticated client must not make the router buffer megabytes), then max_frame.
        self.max_in = hub.config.preauth_max_frame
        # header bytes (group, dest, sender) -> (group, dest, sender) for the ROUTE fast path
        self._route_cache: dict[bytes, _Route] = {}
        self._unknown_dest_at: dict[str, float] = {}
        self._now = 0.0

    # ------------------------------------------------------------------ the hot loop

    def on_data(self, data: bytes, now: float) -> None:
        """Process one received chunk: every complete frame in it, in order.

        The router's hot loop. Consecutive ROUTE frames whose headers (group,
        dest, sender) are byte-identical form a *run*: the first frame of a
        run is parsed and checked, the following ones only compared with its
        header bytes (one C-level ``startswith``) and their payload length
        checked; the whole run is then routed once, as one slice of the
        received bytes shared by every receiver. Anything else goes through
        the validating decoder.
        """
        self.last_recv = self._now = now
        resumed = self._complete(data)
        if resumed is None:
            return
        data = resumed
        size = len(data)
        max_frame = self.max_in
        unpack = _LEN.unpack_from
        ob = self.outbox
        pos = 0
        run_hdr = b""  # header bytes of the current run ("" = no run)
        run_route: _Route | None = None
        run_start = run_n = 0
        while size - pos >= 4:
            n = unpack(data, pos)[0]
            end = pos + 4 + n
            body = pos + 4
            if run_hdr and end <= size and data.startswith(run_hdr, body, end):
                # Same header as the previous frame: check the payload's bin length.
                p = body + len(run_hdr)
                if p < end:
                    m = data[p]
                    if m == 0xC4:
                        plen = p + 2
                        ok = plen + data[p + 1] == end
                    elif m == 0xC5:
                        plen = p + 3
                        ok = plen + ((data[p + 1] << 8) | data[p + 2]) == end
                    elif m == 0xC6:
                        plen = p + 5
                        ok = plen + unpack(data, p + 1)[0] == end
                    else:
                        ok = False
                    if ok:
                        # Frames of the same size with the same prefix (length,
                        # header, payload length) follow each other in bulk.
                        if data[end : end + 4] == data[pos:body]:
                            k = same_frames(data, pos, end - pos, plen - pos, size)
                            run_n += k
                            pos += k * (end - pos)
                        else:
                            run_n += 1
                            pos = end
                        continue
            if run_n:
                assert run_route is not None
                self._forward(run_route, data[run_start:pos], run_n)
                run_hdr, run_n = b"", 0
                if ob.closed:
                    return
            if n > max_frame:
                self._fail(ProtocolError(
                    f"frame of {n} bytes exceeds max_frame {max_frame}" if self.ready else
                    f"frame of {n} bytes before HELLO was accepted exceeds preauth_max_frame "
                    f"{max_frame}", code="frame_too_large"))
                return
            if end > size:
                break
            if n > 2 and data[body] == _ROUTE0 and data[body + 1] == _ROUTE1 and self.ready:
                found = self._lookup(data, body, end)
                if found is not None:
                    run_hdr, run_route = found
                    run_start, run_n = pos, 1
            elif n > 2 and data[body] == _PUB0 and data[body + 1] == _PUB1 and self.ready:
                end = self._publish_run(data, pos, end, size)
            else:
                try:
                    frame = wire.frame_from_body(data[body:end])
                except ProtocolError as e:
                    self._fail(e)
                    return
                self._control(frame)
                max_frame = self.max_in  # raised by HELLO
                self.spend_control()
                if self.paused and not ob.closed:  # budget or turn spent: resume later
                    self.keep(data, end)
                    return
            if ob.closed:
                return
            pos = end
        if run_n:
            assert run_route is not None
            self._forward(run_route, data[run_start:pos], run_n)
        if pos < size and not self._carry(
                data, pos, 4 + unpack(data, pos)[0] if size - pos >= 4 else 4):
            # Native frames cannot be skipped without telling the client it lost one.
            self.hub.counters.drop("partial_frames_budget")
            self._fail(ProtocolError(
                "the router's partial_frames_budget is in use; retry later", code="limit"))

    def _lookup(self, data: bytes, body: int, end: int) -> tuple[bytes, _Route] | None:
        """Parse and check a ROUTE header; None (after answering the error) if it is refused."""
        try:
            group_b, dest, sender, hlen = wire.route_header(data, body, end)
            hdr = data[body : body + hlen]
            route = self._route_cache.get(hdr)
            if route is None:
                group = group_b.decode()
                if not group or len(group_b) > wire.MAX_GROUP:
                    raise ProtocolError("group must be 1 to 1024 bytes of UTF-8")
                if len(sender) > wire.MAX_ADDR or (dest is not None and len(dest) > wire.MAX_ADDR):
                    raise ProtocolError("address longer than 255 bytes")
                if len(self._route_cache) > 4096:
                    self._route_cache.clear()
                route = self._route_cache[hdr] = (group, dest, sender)
        except ProtocolError as err:
            self._fail(err)
            return None
        except UnicodeDecodeError:
            self._fail(ProtocolError("group is not UTF-8"))
            return None
        group, dest, sender = route
        if not self.hub.table.holds(self, group, sender):
            self._error(None, "not_member",
                        f"sender is not registered in {group!r} on this connection")
            return None
        return hdr, route

    def _forward(self, route: _Route, frames: bytes, count: int) -> None:
        """Deliver ``count`` whole ROUTE frames (``frames``) with the same header."""
        group, dest, sender = route
        if not self.hub.forward(self, group, dest, sender, frames, count):
            # Unknown destination: tell the client, at most once a second per group.
            assert dest is not None
            last = self._unknown_dest_at.get(group, -1e9)
            if self._now - last >= 1.0:
                self._unknown_dest_at[group] = self._now
                self._error(None, "unknown_destination",
                            f"no member {dest.hex()} in {group!r}; dropped")

    # ------------------------------------------------------------------ control frames

    def _control(self, f: wire.Frame) -> None:
        # Control frames only (ROUTE is counted as counters.routed): metrics by type.
        fin = self.hub.counters.frames_in
        fin[type(f).__name__] = fin.get(type(f).__name__, 0) + 1
        try:
            # The table refuses a first frame that is not HELLO, a second HELLO and the
            # frames only a router sends; what passes is handled below.
            self.proto.receive(type(f))
        except ProtocolError as e:
            self._fail(e)
            return
        if isinstance(f, wire.Hello):
            self._hello(f)
            return
        auth = self.hub.auth
        if (auth is not None and isinstance(f, _GROUP_REQUESTS)
                and not auth.permits(self.identity, f.group)):
            self._error(f.req, "forbidden",
                        f"identity {self.identity!r} may not use group {f.group!r}")
            return
        match f:
            case wire.Ping(nonce):
                self._reply(wire.Pong(nonce))
            case wire.Pong():
                pass
            case wire.Connect():
                self._connect(f)
            case wire.Disconnect(req, group, addr):
                try:
                    notices = self.hub.table.disconnect(self, group, addr)
                except RoutingError as e:
                    self._error(req, e.code, e.message)
                    return
                log.info("%s left %r (DISCONNECT) via %r", addr.hex(), group, self)
                self._reply(wire.Ok(req))
                self.hub.deliver(notices)
            case wire.GetMembers(req, group):
                members = [
                    wire.MemberInfo(e.addr, e.name, e.physical)
                    for e in self.hub.table.members(group)
                ]
                # A big group takes several frames (OK ``more``), each within max_frame.
                if self._may_send(wire.Ok):
                    for part in wire.encode_members(req, members, self.hub.config.max_frame):
                        self.push(part)
            case wire.Watch(req, group):
                try:
                    self.hub.table.watch(self, group)
                except RoutingError as e:
                    self._error(req, e.code, e.message)
                    return
                self._reply(wire.Ok(req))
            case wire.Unwatch(req, group):
                self.hub.table.unwatch(self, group)
                self._reply(wire.Ok(req))
            case wire.Subscribe() | wire.Unsubscribe():
                self._subscription(f)
            case wire.Publish():
                self._publish(f)
            case wire.Route():
                # Only reached when the fast path did not recognise the encoding
                # (e.g. a non-minimal msgpack array header); route it the same way.
                frame = wire.encode(f)
                found = self._lookup(frame, 4, len(frame))
                if found is not None:
                    self._forward(found[1], frame, 1)

    def _hello(self, f: wire.Hello) -> None:
        common = set(f.versions) & set(wire.SUPPORTED_VERSIONS)
        if not common:
            self.hub.counters.protocol_errors += 1
            log.info("closing %r: unsupported protocol versions %s", self, list(f.versions))
            self.close("unsupported_version",
                       f"router speaks versions {list(wire.SUPPORTED_VERSIONS)}, "
                       f"client offered {list(f.versions)}")
            return
        if self.hub.auth is not None:
            identity = self.hub.auth.identify(f.token, self)
            if identity is None:
                self.close("unauthorized", "HELLO needs a valid token (tokens_file is set)")
                return
            self.identity = identity
        cfg = self.hub.config
        self.max_in = cfg.max_frame
        self._reply(wire.Welcome(max(common), cfg.name, {
            "max_frame": cfg.max_frame,
            "heartbeat_ms": int(cfg.heartbeat_interval * 1000),
            "idle_timeout_ms": int(cfg.idle_timeout * 1000),
            "outbound_queue_bytes": cfg.outbound_queue_bytes,
            **_federation(self.hub.table),
        }))

    def _connect(self, f: wire.Connect) -> None:
        if is_reserved(f.group):
            self._error(f.req, "forbidden",
                        f"{f.group!r} is a JGroups namespace: native clients may only list "
                        "and watch it")
            return
        table = self.hub.table
        known = table.entry(f.group, f.addr)
        try:
            entry, notices, held = table.connect(
                self, f.group, f.addr, f.name, f.physical, identity=self.identity
            )
        except RoutingError as e:
            self._error(f.req, e.code, e.message)
            return
        self._reply(wire.Ok(f.req))
        for frame in held:
            self.push(frame)
        if known is None:
            self.hub.log_membership("joined", entry, self)
        self.hub.deliver(notices)

    # ------------------------------------------------------------------ topics

    def _subscription(self, f: wire.Subscribe | wire.Unsubscribe) -> None:
        try:
            pat = pattern(f.provider, f.broadcast, f.partition)
        except TopicError as e:
            self._error(f.req, "bad_topic", str(e))
            return
        table = self.hub.table
        try:
            if isinstance(f, wire.Subscribe):
                table.subscribe(self, f.group, f.addr, pat)
            else:
                table.unsubscribe(self, f.group, f.addr, pat)
        except RoutingError as e:
            self._error(f.req, e.code, e.message)
            return
        self._reply(wire.Ok(f.req))

    def _publish_run(self, data: bytes, pos: int, end: int, size: int) -> int:
        """Handle the PUBLISH frame at ``data[pos:end]`` and every following frame of the
        same size and header (group, sender, id, flags, payload length): one validation,
        one match and one push per receiving connection for the whole run, as for ROUTE.
        Returns where the run ends."""
        try:
            f = wire.frame_from_body(data[pos + 4 : end])
        except ProtocolError as e:
            self._fail(e)
            return end
        assert isinstance(f, wire.Publish)
        plen = len(f.payload)
        bin_hdr, marker = (2, 0xC4) if plen < 0x100 else (3, 0xC5) if plen < 0x10000 else (5, 0xC6)
        step = end - pos
        prefix = step - plen  # length prefix, header and the payload's bin header
        k = 1
        # Only a minimally encoded payload length makes the prefix a fixed-size header.
        if end + step <= size and data[pos + prefix - bin_hdr] == marker:
            k = same_frames(data, pos, step, prefix, size)
        if k == 1:
            self._publish(f, data[pos:end])
            return end
        run_end = pos + k * step
        self._publish(f, data[pos:run_end], k, step)
        return run_end

    def _publish(self, f: wire.Publish, frames: bytes | None = None, count: int = 1,
                 step: int = 0) -> None:
        """Deliver ``count`` publications: ``f`` and, for a run, the ``count`` frames of
        ``step`` bytes in ``frames`` that share its header (their payloads differ)."""
        table = self.hub.table
        if not table.holds(self, f.group, f.sender):
            self._error(None, "not_member",
                        f"sender is not registered in {f.group!r} on this connection")
            return
        try:
            tid = topic_id(f.provider, f.broadcast, f.partition)
        except TopicError as e:
            self._error(None, "bad_topic", str(e))
            return
        glob = bool(f.flags & wire.PUB_GLOBAL)
        if glob:
            table.stats.published_global += count
        else:
            table.stats.published_local += count
        # The received bytes (or, off the fast path, one encoding) shared by every receiver.
        if frames is None:
            frames = wire.encode(f)
        self.hub.counters.delivered += deliver_publication(
            table, f.group, f.sender, tid, frames, bool(f.flags & wire.PUB_ECHO), count)
        on_global = table.on_global
        if glob and on_global is not None:
            on_global(f.group, f.sender, tid, f.payload)
            plen = len(f.payload)
            for i in range(1, count):
                stop = (i + 1) * step
                on_global(f.group, f.sender, tid, frames[stop - plen : stop])

    # ------------------------------------------------------------------ carrier interface

    @classmethod
    def event_frame(cls, kind: str, entry: Entry) -> bytes:
        return wire.encode(wire.Event(entry.group, kind, entry.addr, entry.name, entry.physical))

    # ------------------------------------------------------------------ errors

    def farewell(self, code: str, message: str) -> bytes:
        return wire.encode_error(None, code, message)

    def close(self, code: str, message: str) -> None:
        if self.proto.state is not State.CLOSED:
            self.proto.send(wire.Error)  # the farewell, legal in every state but CLOSED
            self.proto.close()
            self._sync()
        super().close(code, message)

    def on_eof(self) -> None:
        self.proto.close()
        self._sync()

    def _sync(self) -> None:
        """Keep the hot loop's ``ready`` equal to ``proto.state is State.OPEN``."""
        self.ready = self.proto.state is State.OPEN

    def _may_send(self, t: type[wire.Frame]) -> bool:
        """Whether to queue a frame of type ``t`` of this connection's own (WELCOME, OK,
        ERROR, PONG; routed frames never come here): False once the connection is closing
        (the outbox would refuse it anyway). The state table is asked first, so a bug that
        would answer out of turn (an OK before WELCOME, a second WELCOME) raises
        LocalProtocolError here, an internal error, instead of confusing the client."""
        if self.outbox.closed:
            return False
        self.proto.send(t)
        self._sync()
        return True

    def _reply(self, frame: wire.Frame) -> None:
        if self._may_send(type(frame)):
            self.outbox.push(wire.encode(frame))

    def _error(self, req: int | None, code: str, message: str) -> None:
        """Refuse a request (the connection stays open): the one place native refusals are
        answered, so the one place they are counted (metric refusals, by code)."""
        self.hub.counters.refused(code)
        self._reply(wire.Error(req, code, message))

    def _fail(self, e: ProtocolError) -> None:
        self.hub.counters.protocol_errors += 1
        log.info("closing %r: %s: %s", self, e.code, e)
        self.close(e.code, str(e))
