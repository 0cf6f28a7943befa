"""What every protocol session shares: the bounded outbound queue and the hub.

A *session* is the per-connection protocol logic: it turns received bytes
into routing-table operations and bytes queued for other connections. It does
no I/O: the server feeds it bytes and drains its :class:`Outbox`. Sessions are
the *carriers* the routing table stores.

The :class:`Hub` is the state all sessions of one router share: the routing
table, the settings, the counters.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from gossiprouter.routing import Entry, Kind, Notice, RoutingTable

if TYPE_CHECKING:
    from gossiprouter.config import Config
    from gossiprouter.ops.auth import Authenticator

log = logging.getLogger("gossiprouter")


def _nothing() -> None:
    pass


class Outbox:
    """A connection's outbound queue, bounded in bytes and in frames.

    ``push`` never blocks: fan-out must never wait for one receiver. When a
    frame would overflow the queue, the policy decides: ``drop`` drops it for
    this receiver and counts it; ``disconnect`` discards the queue, queues the
    session's farewell (e.g. ERROR ``slow_consumer``) and asks for the
    connection to be closed.
    """

    __slots__ = (
        "busy",
        "chunks",
        "close_reason",
        "closed",
        "congestion",
        "direct",
        "dropped",
        "flagged",
        "hwm",
        "last_progress",
        "max_bytes",
        "max_frames",
        "nbytes",
        "on_close",
        "policy",
        "wake",
    )

    def __init__(
        self, max_bytes: int, max_frames: int, policy: str, congestion: Congestion | None = None
    ) -> None:
        self.chunks: list[bytes] = []
        self.nbytes = 0
        self.max_bytes = max_bytes
        self.max_frames = max_frames
        # Above this many queued bytes the receiver is congested: whoever
        # pushes to it is briefly paused (see Congestion).
        self.hwm = max_bytes // 4
        self.policy = policy
        self.dropped = 0
        self.closed = False
        self.close_reason = ""
        self.congestion = congestion or Congestion()
        self.flagged = False
        self.last_progress = 0.0
        # Set by the server: wake the writer / bound the final flush / send
        # without blocking (None when not possible, e.g. TLS); busy while the
        # writer is sending.
        self.direct: Callable[[bytes], int] | None = None
        self.busy = False
        self.wake: Callable[[], None] = _nothing
        self.on_close: Callable[[], None] = _nothing

    def push(self, data: bytes) -> bool:
        """Queue ``data``; False if it was not queued (dropped, or closing).

        When the queue is empty and the writer idle, the bytes are first
        offered to ``direct`` (a non-blocking send set by the server): most
        of the time the socket takes them all and no writer task needs to
        wake up, which is most of a light-loaded router's cost per message.
        """
        if self.closed:
            return False
        chunks = self.chunks
        if not chunks and self.direct is not None and not self.busy:
            try:
                sent = self.direct(data)
            except OSError:
                sent = 0  # the writer will meet the error and close the connection
            if sent == len(data):
                return True
            if sent:
                # Part of a frame is on the wire: the rest must follow whatever
                # the bounds say, or the stream would be corrupt.
                chunks.append(data[sent:])
                self.nbytes += len(data) - sent
                self.wake()
                return True
        n = self.nbytes + len(data)
        if n > self.max_bytes or len(chunks) >= self.max_frames:
            return False
        chunks.append(data)
        self.nbytes = n
        if len(chunks) == 1:
            self.wake()
        elif n > self.hwm:
            self.congestion.hit(self)
        return True

    def take(self, limit: int = 1 << 20) -> list[bytes]:
        """The oldest queued chunks, about ``limit`` bytes (at least one chunk), in order."""
        chunks = self.chunks
        if self.nbytes <= limit:
            self.chunks = []
            self.nbytes = 0
            return chunks
        size = 0
        i = 0
        for i, c in enumerate(chunks):  # noqa: B007 - i is used after the loop
            size += len(c)
            if size >= limit:
                break
        out = chunks[: i + 1]
        del chunks[: i + 1]
        self.nbytes -= size
        return out

    def close(self, reason: str, farewell: bytes = b"", *, discard: bool = False) -> None:
        """Stop accepting frames; queue ``farewell`` last; ask for the connection to close."""
        if self.closed:
            return
        self.direct = None
        if discard:
            self.chunks = []
            self.nbytes = 0
        if farewell:
            self.chunks.append(farewell)
            self.nbytes += len(farewell)
        self.closed = True
        self.close_reason = reason
        self.wake()
        self.on_close()


def same_frames(data: bytes, pos: int, step: int, plen: int, size: int) -> int:
    """How many frames of ``step`` bytes, starting at ``pos``, begin with the same ``plen``
    bytes as the one at ``pos`` (at least 1).

    Equal prefixes (header and payload length) make equally valid frames of the same route, so
    a bulk of equal-size messages needs no Python loop per frame: the j-th byte of every frame
    is one strided slice, and ``lstrip`` counts how many of them match, both at C speed.
    """
    k = (size - pos) // step
    if k <= 1:
        return 1
    span = (k - 1) * step + 1
    for j in range(plen):
        col = data[pos + j : pos + j + span : step]
        rest = len(col.lstrip(col[:1]))
        if rest:
            k = len(col) - rest
            if k == 1:
                return 1
            span = (k - 1) * step + 1
    return k


class Congestion:
    """Back-pressure without head-of-line blocking (after the NATS server's stall).

    When a push leaves a receiver's queue above its high-water mark, the
    connection whose input caused it is paused for a few milliseconds before
    its next read, as long as that receiver is still draining (its writer
    made progress recently). A healthy but slower receiver thus slows the
    senders to its pace instead of being cut off, while a receiver that has
    stopped reading stops slowing anyone and is cut off (or has its frames
    dropped) when its queue is full.
    """

    __slots__ = ("outboxes", "pending")

    def __init__(self) -> None:
        self.pending = False
        self.outboxes: list[Outbox] = []

    def hit(self, ob: Outbox) -> None:
        self.pending = True
        if not ob.flagged:
            ob.flagged = True
            self.outboxes.append(ob)

    def draining(self, now: float, stalled_after: float) -> bool:
        """True while a flagged receiver is above its high-water mark and still reading."""
        keep = []
        for ob in self.outboxes:
            if ob.nbytes > ob.hwm and not ob.closed:
                keep.append(ob)
            else:
                ob.flagged = False
        self.outboxes = keep
        return any(now - ob.last_progress < stalled_after for ob in keep)


@dataclass
class Counters:
    """Router-wide counters (exported as metrics by the operations layer)."""

    frames_in: dict[str, int] = field(default_factory=dict)
    bytes_in: int = 0
    # Counted by the server's writer per socket write (not per frame): every frame type.
    bytes_out: int = 0
    writes: int = 0
    routed: int = 0
    delivered: int = 0
    drops: dict[str, int] = field(default_factory=dict)
    slow_consumer_disconnects: int = 0
    protocol_errors: int = 0
    # Membership events queued for clients (one per event per receiving connection).
    events_out: int = 0

    def drop(self, reason: str, n: int = 1) -> None:
        self.drops[reason] = self.drops.get(reason, 0) + n


class Session:
    """Base class of the protocol sessions; a session is a routing-table carrier."""

    protocol = "?"

    def __init__(self, hub: Hub, peer: str) -> None:
        self.hub = hub
        self.peer = peer
        cfg = hub.config
        self.outbox = Outbox(cfg.outbound_queue_bytes, cfg.outbound_queue_frames,
                             cfg.slow_consumer_policy, hub.congestion)
        self.last_recv = 0.0
        # The start of a frame not yet complete, and how many bytes it needs.
        self._rest = bytearray()
        self._need = 0

    def __repr__(self) -> str:
        return f"<{self.protocol} {self.peer}>"

    # --- called by the server
    def on_data(self, data: bytes, now: float) -> None:
        raise NotImplementedError

    def _complete(self, data: bytes) -> bytes | None:
        """``data`` behind the carried-over start of a frame; None while that frame
        is still incomplete (no bytes are copied or parsed again until it is)."""
        rest = self._rest
        if not rest:
            return data
        rest += data
        if len(rest) < self._need:
            return None
        self._rest = bytearray()
        return bytes(rest)

    def _carry(self, data: bytes, pos: int, need: int) -> None:
        """Keep ``data[pos:]``, the start of a frame of ``need`` bytes, for the next chunk."""
        self._rest = bytearray(memoryview(data)[pos:])
        self._need = need

    def on_eof(self) -> None:
        """The peer closed its side; nothing more will be received."""

    def close(self, code: str, message: str) -> None:
        """Close this connection from the router side, telling the peer why if it can."""
        self.outbox.close(code, self.farewell(code, message))

    def farewell(self, code: str, message: str) -> bytes:
        """The bytes that tell the peer why it is being closed (protocol-specific)."""
        return b""

    # --- called by the hub / other sessions (the carrier interface)
    def push(self, data: bytes, count: int = 1) -> None:
        """Queue ``count`` routed frames (``data``) for this connection, applying the
        slow-consumer policy."""
        ob = self.outbox
        if ob.push(data):
            return
        if ob.closed:
            return
        if ob.policy == "drop":
            ob.dropped += count
            self.hub.counters.drop("slow_consumer", count)
            return
        self.hub.counters.slow_consumer_disconnects += 1
        log.warning(
            "closing %r: slow consumer (%d bytes / %d frames queued, limits %d / %d)",
            self, ob.nbytes, len(ob.chunks), ob.max_bytes, ob.max_frames,
        )
        ob.close(
            "slow_consumer",
            self.farewell("slow_consumer", "outbound queue full: not reading fast enough"),
            discard=True,
        )

    @classmethod
    def event_frame(cls, kind: str, entry: Entry) -> bytes | None:
        """The bytes that tell a client of this protocol that ``entry`` joined / left /
        is suspected, or None when the protocol has no such frame. It depends only on
        the protocol, so the hub encodes it once per event for all its receivers."""
        return None

    def notify(self, kind: str, entry: Entry) -> None:
        """Tell this connection that ``entry`` joined / left / is suspected."""
        data = self.event_frame(kind, entry)
        if data:
            self.push(data)


class Hub:
    """The state every session of one router shares."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.table = RoutingTable(
            suspect_events=config.suspect_events,
            grace=config.grace,
            grace_buffer_bytes=config.grace_buffer_bytes,
        )
        self.table.limits.addresses_per_connection = config.addresses_per_connection
        self.table.limits.groups_per_connection = config.groups_per_connection
        self.table.limits.subscriptions_per_member = config.subscriptions_per_member
        self.counters = Counters()
        self.congestion = Congestion()
        # Set by the server to defer notice delivery (see deliver()).
        self.defer: Callable[[], None] | None = None
        self.pending: list[Notice] = []
        # Native-protocol tokens; set by gossiprouter.ops when tokens_file is configured.
        self.auth: Authenticator | None = None
        for p in config.provisioned:
            self.table.connect(None, p.group, p.addr, p.name, p.physical,
                               kind=Kind.PROVISIONED, sticky=True)

    def deliver(self, notices: list[Notice]) -> None:
        """Send ``notices`` now, or (when the server set :attr:`defer`) a moment later.

        Deferring suspects matters when many connections drop at once: every member
        lost is announced to every remaining member, and waiting a few
        milliseconds lets the other closes be noticed first, so events are not
        queued for connections that are already gone (a mass disconnect of N
        members would otherwise cost N² events).
        """
        if self.defer is None:
            self.flush_notices(notices)
            return
        # join/leave go to the (few) watchers at once, in order with the traffic
        # around them; only suspects, which go to every member, wait.
        # Notices stay in order: once one waits, every later one waits behind it.
        if not self.pending and all(n.kind != "suspect" for n in notices):
            self.flush_notices(notices)
            return
        if not self.pending:
            self.defer()
        self.pending.extend(notices)

    def flush_notices(self, notices: list[Notice]) -> None:
        """Deliver notices to whoever should get them *now*: the group's current
        connections (suspect) or watchers (join, leave).

        Notices for one group and audience are sent as one block per connection,
        encoded once per protocol, so a burst of N events to M connections costs M
        pushes, not N x M. Within an audience the order is kept.
        """
        table = self.table
        buckets: dict[tuple[str, bool], list[Notice]] = {}
        for n in notices:
            buckets.setdefault((n.entry.group, n.kind == "suspect"), []).append(n)
        for (group, to_members), bucket in buckets.items():
            g = table.groups.get(group)
            if g is None:
                continue
            # A member registered again meanwhile is not gone any more.
            live = [n for n in bucket
                    if n.kind == "join" or g.entries.get(n.entry.addr) in (None, n.entry)]
            if not live:
                continue
            targets = g.targets() if to_members else tuple(g.watchers)
            blocks: dict[type, bytes] = {}
            for t in targets:
                s = cast(Session, t)
                cls = type(s)
                if cls.notify is not Session.notify:  # e.g. in-process members
                    for n in live:
                        s.notify(n.kind, n.entry)
                    continue
                block = blocks.get(cls)
                if block is None:
                    frames = (cls.event_frame(n.kind, n.entry) for n in live)
                    block = blocks[cls] = b"".join(f for f in frames if f)
                if block:
                    s.push(block, len(live))
                    self.counters.events_out += len(live)

    def take_pending(self) -> list[Notice]:
        pending, self.pending = self.pending, []
        return pending

    def log_membership(self, what: str, entry: Entry, via: object) -> None:
        if log.isEnabledFor(logging.INFO):
            log.info(
                "%s %s (%s%s) in %r via %r", what, entry.name or "-", entry.addr.hex(),
                "".join(f" {h}:{p}" for h, p in entry.physical), entry.group, via,
            )
