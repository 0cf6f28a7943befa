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
from typing import cast

from gossiprouter.protocol import native as wire
from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.routing import Entry, RoutingError, is_reserved
from gossiprouter.sessions.base import Hub, Session

log = logging.getLogger("gossiprouter")

_LEN = struct.Struct(">I")
_ROUTE0, _ROUTE1 = 0x95, int(wire.T.ROUTE)
_EVENT_KINDS = frozenset(wire.EVENT_KINDS)


class NativeSession(Session):
    """One native-protocol connection, after its ``GRTR`` preamble."""

    protocol = "native"

    def __init__(self, hub: Hub, peer: str, identity: str | None = None) -> None:
        super().__init__(hub, peer)
        self.buf = bytearray()
        self.ready = False
        self.identity = identity
        # header bytes (group, dest, sender) -> (group, dest, sender) for the ROUTE fast path
        self._route_cache: dict[bytes, tuple[str, bytes | None, bytes]] = {}
        self._unknown_dest_at: dict[str, float] = {}
        self._now = 0.0

    # ------------------------------------------------------------------ the hot loop

    def on_data(self, data: bytes, now: float) -> None:
        """Process one received chunk: every complete frame in it, in order."""
        self.last_recv = self._now = now
        buf = self.buf
        if buf:
            buf += data
            data = bytes(buf)
        max_frame = self.hub.config.max_frame
        size = len(data)
        pos = 0
        closed = self.outbox
        while size - pos >= 4 and not closed.closed:
            n = (data[pos] << 24) | (data[pos + 1] << 16) | (data[pos + 2] << 8) | data[pos + 3]
            if n > max_frame:
                self._fail(
                    ProtocolError(
                        f"frame of {n} bytes exceeds max_frame {max_frame}",
                        code="frame_too_large",
                    )
                )
                return
            end = pos + 4 + n
            if end > size:
                break
            start = pos + 4
            if n > 2 and data[start] == _ROUTE0 and data[start + 1] == _ROUTE1 and self.ready:
                self._route(data, pos, start, end)
            else:
                try:
                    frame = wire.frame_from_body(data[start:end])
                except ProtocolError as e:
                    self._fail(e)
                    return
                self._control(frame)
            pos = end
        if pos == size:
            if buf:
                buf.clear()
        else:
            self.buf = bytearray(data[pos:])

    def _route(self, data: bytes, pos: int, start: int, end: int) -> None:
        try:
            group_b, dest, sender, hlen = wire.route_header(data, start, end)
            key = data[start : start + hlen]
            hit = self._route_cache.get(key)
            if hit is None:
                group = group_b.decode()
                if not group or len(group_b) > wire.MAX_GROUP:
                    raise ProtocolError("group must be 1 to 1024 bytes of UTF-8")
                if len(sender) > wire.MAX_ADDR or (dest is not None and len(dest) > wire.MAX_ADDR):
                    raise ProtocolError("address longer than 255 bytes")
                if len(self._route_cache) > 4096:
                    self._route_cache.clear()
                hit = self._route_cache[key] = (group, dest, sender)
            group, dest, sender = hit
        except ProtocolError as err:
            self._fail(err)
            return
        except UnicodeDecodeError:
            self._fail(ProtocolError("group is not UTF-8"))
            return
        hub = self.hub
        table = hub.table
        if not table.holds(self, group, sender):
            self._error(None, "not_member", f"sender is not registered in {group!r} on this "
                        "connection")
            return
        frame = data[pos:end]
        hub.counters.routed += 1
        if dest is None:
            targets = table.resolve_multicast(group, self)
            for t in targets:
                cast(Session, t).push(frame)
            hub.counters.delivered += len(targets)
            g = table.groups[group]
            if g.graced:
                for e in g.graced:
                    if e.addr != sender:
                        table.hold(e, frame)
            return
        entry = table.resolve_unicast(group, dest)
        if entry is None:
            hub.counters.drop("unknown_destination")
            last = self._unknown_dest_at.get(group, -1e9)
            if self._now - last >= 1.0:
                self._unknown_dest_at[group] = self._now
                self._error(None, "unknown_destination",
                            f"no member {dest.hex()} in {group!r}; dropped")
            return
        c = entry.carrier
        if c is None:
            table.hold(entry, frame)
            return
        cast(Session, c).push(frame)
        hub.counters.delivered += 1

    # ------------------------------------------------------------------ control frames

    def _control(self, f: wire.Frame) -> None:
        if not self.ready:
            if isinstance(f, wire.Hello):
                self._hello(f)
            else:
                self._fail(ProtocolError(f"first frame must be HELLO, got {type(f).__name__}"))
            return
        match f:
            case wire.Ping(nonce):
                self.outbox.push(wire.encode(wire.Pong(nonce)))
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
                self.outbox.push(wire.encode(wire.Ok(req)))
                self.hub.deliver(notices)
            case wire.GetMembers(req, group):
                members = tuple(
                    wire.MemberInfo(e.addr, e.name, e.physical)
                    for e in self.hub.table.members(group)
                )
                self.outbox.push(wire.encode(wire.Ok(req, members)))
            case wire.Watch(req, group):
                self.hub.table.watch(self, group)
                self.outbox.push(wire.encode(wire.Ok(req)))
            case wire.Unwatch(req, group):
                self.hub.table.unwatch(self, group)
                self.outbox.push(wire.encode(wire.Ok(req)))
            case wire.Route():
                # Only reached when the fast path did not recognise the encoding
                # (e.g. a non-minimal msgpack array header); route it the same way.
                body = wire.encode(f)
                self._route(body, 0, 4, len(body))
            case wire.Hello():
                self._fail(ProtocolError("second HELLO"))
            case _:
                self._fail(ProtocolError(f"a client may not send {type(f).__name__}"))

    def _hello(self, f: wire.Hello) -> None:
        common = set(f.versions) & set(wire.SUPPORTED_VERSIONS)
        if not common:
            self.hub.counters.protocol_errors += 1
            log.info("closing %r: unsupported protocol versions %s", self, list(f.versions))
            self.close("unsupported_version",
                       f"router speaks versions {list(wire.SUPPORTED_VERSIONS)}, "
                       f"client offered {list(f.versions)}")
            return
        cfg = self.hub.config
        self.ready = True
        self.outbox.push(wire.encode(wire.Welcome(max(common), cfg.name, {
            "max_frame": cfg.max_frame,
            "heartbeat_ms": int(cfg.heartbeat_interval * 1000),
            "idle_timeout_ms": int(cfg.idle_timeout * 1000),
            "outbound_queue_bytes": cfg.outbound_queue_bytes,
        })))

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
        self.outbox.push(wire.encode(wire.Ok(f.req)))
        for frame in held:
            self.push(frame)
        if known is None:
            self.hub.log_membership("joined", entry, self)
        self.hub.deliver(notices)

    # ------------------------------------------------------------------ carrier interface

    def notify(self, kind: str, entry: Entry) -> None:
        self.outbox.push(
            wire.encode(wire.Event(entry.group, kind, entry.addr, entry.name, entry.physical))
        )

    # ------------------------------------------------------------------ errors

    def farewell(self, code: str, message: str) -> bytes:
        return wire.encode_error(None, code, message)

    def _error(self, req: int | None, code: str, message: str) -> None:
        self.outbox.push(wire.encode_error(req, code, message))

    def _fail(self, e: ProtocolError) -> None:
        self.hub.counters.protocol_errors += 1
        log.info("closing %r: %s: %s", self, e.code, e)
        self.close(e.code, str(e))
