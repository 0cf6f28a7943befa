"""The native protocol session: GRTR frames in, routing decisions and queued bytes out.

:meth:`NativeSession.on_data` is the router's hot loop: one received chunk in,
bytes queued on the receivers' outboxes out, no I/O. The connection's
:class:`~gossiprouter.protocol.native_scan.NativeScanner` cuts the chunk into runs of
ROUTE (or PUBLISH) frames with one header and single control frames; the session makes one
routing decision per run and forwards the run as the exact bytes received (one bytes object
shared by every receiver of a multicast). Control frames go through the full, validating
decoder.
"""

from __future__ import annotations

import logging

from gossiprouter.core.addresses import format_addr
from gossiprouter.core.topics import TopicError, TopicId, pattern, topic_id
from gossiprouter.protocol import native as wire
from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.native_scan import (
    CONTROL,
    MALFORMED,
    PARTIAL,
    PUBLICATIONS,
    RUN,
    TOO_LARGE,
    NativeScanner,
    RouteHeader,
)
from gossiprouter.protocol.native_state import NativeState, Role, State
from gossiprouter.routing.entries import Carrier, Entry, RoutingError, is_reserved
from gossiprouter.routing.table import RoutingTable
from gossiprouter.sessions.base import Hub, Session

log = logging.getLogger("gossiprouter")

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
        # ROUTE and PUBLISH are relayed on the fast path only after HELLO as well.
        self.scanner = NativeScanner(hub.config.preauth_max_frame)
        self._unknown_dest_at: dict[str, float] = {}

    # ------------------------------------------------------------------ the hot loop

    def on_data(self, data: bytes, now: float) -> None:
        """Process one received chunk: every complete frame in it, in order.

        The router's hot loop: the scanner says where the runs and the control frames are
        (``gossiprouter.protocol.native_scan``); the session decides, once per run, who
        receives it, and handles each control frame. It stops where the connection closes or
        its control budget is spent (the rest is kept for ``on_data(b"")``).
        """
        self.last_recv = self.now = now
        resumed = self._complete(data)
        if resumed is None:
            return
        data = resumed
        ob = self.outbox
        for item in self.scanner.scan(data):
            if item[0] == RUN:
                self._route(item[4], data[item[1] : item[2]], item[3])
            elif item[0] == PUBLICATIONS:
                start, end, count = item[1], item[2], item[3]
                self._publish(item[4], data[start:end], count, (end - start) // count)
            elif item[0] == CONTROL:
                end = item[2]
                try:
                    frame = wire.frame_from_body(data[item[1] + 4 : end])
                except ProtocolError as e:
                    self._fail(e)
                    return
                self._control(frame)
                self.spend_control()
                if self.paused and not ob.closed:  # budget or turn spent: resume later
                    self.keep(data, end)
                    return
            elif item[0] == MALFORMED:
                self._fail(item[4])
                return
            elif item[0] == TOO_LARGE:
                n, max_frame = item[3], self.scanner.max_frame
                self._fail(ProtocolError(
                    f"frame of {n} bytes exceeds max_frame {max_frame}" if self.ready else
                    f"frame of {n} bytes before HELLO was accepted exceeds preauth_max_frame "
                    f"{max_frame}", code="frame_too_large"))
                return
            elif item[0] == PARTIAL and not self._carry(data, item[1], item[3]):
                # The cut frame at the end does not fit the router-wide budget. Native frames
                # cannot be skipped without telling the client it lost one.
                self.hub.counters.drop("partial_frames_budget")
                self._fail(ProtocolError(
                    "the router's partial_frames_budget is in use; retry later", code="limit"))
            if ob.closed:
                return

    def _route(self, route: RouteHeader, frames: bytes, count: int) -> None:
        """Deliver ``count`` whole ROUTE frames (``frames``) with the header ``route``, or
        answer each of them ``not_member`` if its sender is not registered here."""
        group, dest, sender = route
        if not self.hub.table.holds(self, group, sender):
            for _ in range(count):
                self._error(None, "not_member",
                            f"sender is not registered in {group!r} on this connection")
            return
        if self.hub.forward(self, group, dest, sender, frames, count):
            fast = self.hub.fast
            if fast is not None and self.fast_id is not None:
                fast.learn_native(self, route, frames)  # the compiled fast path repeats it
        else:
            # Unknown destination: tell the client, at most once a second per group.
            assert dest is not None
            last = self._unknown_dest_at.get(group, -1e9)
            if self.now - last >= 1.0:
                self._unknown_dest_at[group] = self.now
                self._error(None, "unknown_destination",
                            f"no member {format_addr(dest)} in {group!r}; dropped")

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
                log.info("%s left %r (DISCONNECT) via %r", format_addr(addr), group, self)
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
            case wire.Route(group, dest, sender):
                # Only reached when the scanner did not recognise the encoding (e.g. a
                # non-minimal msgpack array header): relayed re-encoded, else the same way.
                self._route((group, dest, sender), wire.encode(f), 1)

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
        self.scanner.max_frame = cfg.max_frame
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
        """Keep the hot loop's ``ready`` (and the scanner's ``relay``: ROUTE and PUBLISH on
        the fast path) equal to ``proto.state is State.OPEN``."""
        self.ready = self.scanner.relay = self.proto.state is State.OPEN

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
