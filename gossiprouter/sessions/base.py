"""What every protocol session shares: the session base class and the hub.

A *session* is the per-connection protocol logic: it turns received bytes
into routing-table operations and bytes queued for other connections. It does
no I/O: the server feeds it bytes and drains its :class:`~.outbox.Outbox`. Sessions are
the *carriers* the routing table stores.

The :class:`Hub` is the state all sessions of one router share: the routing
table, the settings, the counters (:mod:`.counters`). A session holds its hub, and the hub
closes a session it must contain (:meth:`Hub.contain`): the two are one module.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, Protocol

from gossiprouter.core.addresses import format_addr
from gossiprouter.protocol import jgroups2 as _j2
from gossiprouter.protocol import jgroups5 as _j5
from gossiprouter.protocol import native as _native
from gossiprouter.protocol.jgroups_address import JAddress
from gossiprouter.routing.entries import (
    RESERVED_PREFIXES,
    Carrier,
    Entry,
    Kind,
    Notice,
    Physical,
    RoutingError,
)
from gossiprouter.routing.table import RoutingTable
from gossiprouter.sessions.counters import Counters
from gossiprouter.sessions.outbox import Congestion, Outbox, WriteBatch

if TYPE_CHECKING:
    from gossiprouter.core.config import Config

log = logging.getLogger("gossiprouter")


class FastRoutes(Protocol):
    """What the sessions tell the compiled fast path (gossiprouter.server.fastpath.FastPath): the
    routing decision just made for a run of routed frames, for its thread to repeat on the
    next frames with the same header until the routing table changes."""

    def learn_native(self, session: Session, route: tuple[str, bytes | None, bytes],
                     frames: bytes) -> None: ...

    def learn_jgroups(self, session: Session, group: str, dest: bytes | None, key: bytes,
                      out: bytes, skip: int) -> None: ...

    def collect(self) -> None: ...

    def take(self, session: Session) -> bytes: ...


class Authority(Protocol):
    """What the native session asks of token authentication (``Hub.auth``), defined here so
    that the sessions name no implementation: :class:`gossiprouter.ops.auth.Authenticator`
    is the one the router uses (the server sets it from its hooks)."""

    def identify(self, token: str | None, who: object) -> str | None:
        """The identity ``token`` stands for, or None to refuse the HELLO of ``who``."""
        ...

    def permits(self, identity: str | None, group: str) -> bool:
        """May ``identity`` CONNECT to, list or WATCH ``group``?"""
        ...


# Control frames one connection may have handled per turn of the event loop, before the
# server lets every other connection run (see Session.spend_control).
TURN_CONTROLS = 64


class Session:
    """Base class of the protocol sessions; a session is a routing-table carrier."""

    protocol: ClassVar[str] = "?"
    # Carrier: membership events go out as frames, encoded once per class (Hub._notify).
    events_by_call: ClassVar[bool] = False

    def __init__(self, hub: Hub, peer: str) -> None:
        self.hub = hub
        self.peer = peer
        cfg = hub.config
        self.outbox = Outbox(cfg.outbound_queue_bytes, cfg.outbound_queue_frames,
                             cfg.slow_consumer_policy, hub.congestion, hub.batch)
        self.last_recv = 0.0
        # The clock (trio.current_time()) of the chunk being handled, as given to on_data: what
        # the session's rate limits (one error or log line a second...) measure time with.
        self.now = 0.0
        # The start of a frame not yet complete, and how many bytes it needs.
        self._rest = bytearray()
        self._need = 0
        # Bytes this session holds against the router-wide budget (Counters.partial_bytes).
        self._held = 0
        # The control budget (a token bucket, see spend_control) and this turn's share.
        self.control_rate = cfg.control_rate
        self.control_burst = float(cfg.control_burst)
        self.tokens = self.control_burst
        self.over_since: float | None = None
        self.turn_left = TURN_CONTROLS
        self.paused = False
        self._refilled = 0.0
        # Past the handshake: the first control frame was handled (for the native protocol
        # that is HELLO, as anything else first closes the connection).
        self.established = False
        # The compiled fast path (gossiprouter.server.fastpath): this connection's id in the relay
        # thread (None: not known to it), and whether the thread writes it now.
        self.fast_id: int | None = None
        self.fast_attached = False

    @property
    def holding(self) -> bool:
        """The start of a frame is kept for the next chunk: that chunk continues it."""
        return bool(self._rest)

    def hand_back(self, limit: int) -> bytes | None:
        """Give up the start of a cut frame this session keeps, for a reader that puts it in
        front of the next chunk (the compiled fast path's thread), with its share of the
        partial-frames budget; None (nothing given) when the session keeps nothing, or
        anything else, or a frame of more than ``limit`` bytes, or is still in its handshake
        (whose frames only Python handles)."""
        rest = self._rest
        if not rest or not self.established or self._need > limit or len(rest) > limit:
            return None
        self._rest = bytearray()
        self._need = 0
        self._reserve(0)
        return bytes(rest)

    def __repr__(self) -> str:
        return f"<{self.protocol} {self.peer}>"

    def fast_take(self) -> bytes:
        """The outbox's ``reclaim`` while the fast path's thread writes this connection: the
        bytes it holds for it (it stops writing). A bound method rather than a closure per
        connection: every plain-TCP connection has one (issue 24)."""
        fast = self.hub.fast
        return b"" if fast is None else fast.take(self)

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
        self._reserve(0)
        return bytes(rest)

    def _carry(self, data: bytes, pos: int, need: int) -> bool:
        """Keep ``data[pos:]``, the start of a frame of ``need`` bytes, for the next chunk.

        False (nothing kept) when ``need`` does not fit the router-wide budget; the caller
        decides what that means for its protocol (skip the frame, or close).
        """
        if not self._reserve(need):
            return False
        self._rest = bytearray(memoryview(data)[pos:])
        self._need = need
        return True

    def _reserve(self, n: int) -> bool:
        """Hold ``n`` bytes (replacing what this session held) of an incomplete frame against
        the router-wide budget; False, holding nothing more, when it does not fit.

        The whole frame is reserved once its length is known, not the bytes received so far,
        so that many frames started at once cannot together outgrow the budget later. Frames
        up to ``preauth_max_frame`` are always admitted (counted, not checked): splitting a
        small frame across two reads is routine, and refusing it would hurt honest members;
        what they can pin is bounded by connections x preauth_max_frame.
        """
        counters = self.hub.counters
        held = self._held
        if n > held:
            cfg = self.hub.config
            if (n > cfg.preauth_max_frame
                    and counters.partial_bytes - held + n > cfg.partial_frames_budget):
                return False
        counters.partial_bytes += n - held
        self._held = n
        return True

    def release(self) -> None:
        """The connection is closed: give back its receive buffers, its share of the budget
        and its queue now, not whenever the cycle collector runs (called by the server)."""
        self._rest = bytearray()
        self._need = 0
        self._reserve(0)
        self.outbox.detach()

    def on_eof(self) -> None:
        """The peer closed its side; nothing more will be received."""

    # --- fairness: the control budget and the turn's share (issue 12)
    def spend_control(self) -> None:
        """Charge one control frame (anything but ROUTE / MESSAGE) to this connection.

        Sessions call it once per control frame; routed runs never do. Two bounds: a token
        bucket (``control_rate`` per second, ``control_burst`` at most) and this turn's share
        of the event loop (TURN_CONTROLS frames). When either is spent, :attr:`paused` is set:
        the session stops after the frame, keeps the rest of its input (:meth:`keep`) and the
        server resumes it later with ``on_data(b"")``: after a checkpoint for a spent share,
        after the bucket has refilled for a spent budget. ``over_since`` says since when the
        bucket has not been full: the server closes a connection that stays over its budget.
        """
        self.established = True
        self.turn_left -= 1
        if self.turn_left <= 0:
            self.paused = True
        rate = self.control_rate
        if not rate:
            return
        now = self.last_recv
        t = self.tokens + (now - self._refilled) * rate
        self._refilled = now
        if t >= self.control_burst:
            t = self.control_burst
            self.over_since = None
        t -= 1
        self.tokens = t
        if t < 0:
            self.paused = True
            if self.over_since is None:
                self.over_since = now

    def new_turn(self) -> None:
        """Called by the server before it feeds the session in a new turn."""
        self.turn_left = TURN_CONTROLS
        self.paused = False

    def keep(self, data: bytes, pos: int) -> None:
        """Paused at ``pos``: keep ``data[pos:]`` (whole frames) for ``on_data(b"")``."""
        if pos < len(data):
            self._carry(data, pos, 0)

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
            self.hub.counters.drop("slow_consumer", count, len(data))
            return
        self.overflowed()

    def overflowed(self) -> None:
        """The outbound queue is full and the policy is ``disconnect``: close as a slow
        consumer, discarding what is queued."""
        ob = self.outbox
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
        self.table.check = self.check_registration
        self.table.limits.watches_per_connection = config.watches_per_connection
        self.table.limits.max_groups = config.max_groups
        self.table.limits.subscriptions_per_member = config.subscriptions_per_member
        self.counters = Counters()
        self.congestion = Congestion()
        # Opened by the dispatcher around each round when coalesce_writes is on.
        self.batch = WriteBatch()
        # Set by the server to defer notice delivery (see deliver()).
        self.defer: Callable[[], None] | None = None
        self.pending: list[Notice] = []
        # Native-protocol tokens: set by the server from its hooks (gossiprouter.ops when
        # tokens_file is configured); None: HELLO needs no token.
        self.auth: Authority | None = None
        # The compiled fast path, when the server runs it (server.fastpath): the sessions
        # tell it the routing decisions it may repeat on its own.
        self.fast: FastRoutes | None = None
        for p in config.provisioned:
            self.table.connect(None, p.group, p.addr, p.name, p.physical,
                               kind=Kind.PROVISIONED, sticky=True)

    def sync(self) -> None:
        """Bring the counters up to date with what the compiled fast path relayed (read them
        after this; the operations layer does)."""
        if self.fast is not None:
            self.fast.collect()

    def check_registration(self, group: str, addr: bytes, name: str | None, physical: Physical,
                           wire: object) -> None:
        """Refuse (RoutingError ``too_long``) a registration the router must not store.

        Two kinds of check, before anything is stored: the configured bounds on what a client
        may make the router keep (max_name_bytes, ...), and, for every protocol that can see
        the group, whether its codec can write the member back. A value accepted here can
        then never make a later reply, an honest client's member query included, fail.
        Native clients can see every group (GET_MEMBERS and WATCH of the JGroups namespaces);
        JGroups clients only their own namespace.
        """
        cfg = self.config
        short = group
        for prefix in RESERVED_PREFIXES:
            if group.startswith(prefix):
                short = group[len(prefix):]
        problem = None
        if len(short) * 4 > cfg.max_group_bytes and (
                len(short.encode("utf-8", "surrogatepass")) > cfg.max_group_bytes):
            problem = f"group longer than {cfg.max_group_bytes} bytes (max_group_bytes)"
        elif name is not None and len(name) * 4 > cfg.max_name_bytes and (
                len(name.encode("utf-8", "surrogatepass")) > cfg.max_name_bytes):
            problem = f"logical name longer than {cfg.max_name_bytes} bytes (max_name_bytes)"
        elif len(physical) > cfg.max_physical_addresses:
            problem = (f"{len(physical)} physical addresses, more than "
                       f"{cfg.max_physical_addresses} (max_physical_addresses)")
        elif any(len(h.encode("utf-8", "surrogatepass")) > cfg.max_name_bytes
                 for h, _ in physical):
            problem = f"physical host longer than {cfg.max_name_bytes} bytes (max_name_bytes)"
        else:
            # The JGroups encodings kept to write the member back (Entry.wire).
            held = [getattr(wire, "addr", None), *(getattr(wire, "physical", None) or ())]
            jaddrs = [a for a in held if isinstance(a, JAddress)]
            if len(jaddrs) > 1 + cfg.max_physical_addresses:
                problem = (f"{len(jaddrs) - 1} physical addresses, more than "
                           f"{cfg.max_physical_addresses} (max_physical_addresses)")
            elif any(len(a.raw) > cfg.max_address_bytes for a in jaddrs):
                problem = (f"address encoding longer than {cfg.max_address_bytes} bytes "
                           "(max_address_bytes)")
            elif group.startswith("jgroups5:"):
                problem = _j5.writable(short, name)
            elif group.startswith("jgroups2:"):
                problem = _j2.writable(name)
            if problem is None:
                problem = _native.member_problem(group, addr, name, physical, cfg.max_frame)
        if problem is not None:
            raise RoutingError("too_long", problem)

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

    def forward(self, carrier: Carrier, group: str, dest: bytes | None, sender: bytes,
                frames: bytes, count: int = 1) -> bool:
        """Deliver ``count`` whole native routed frames (``frames``, the same bytes for every
        receiver) from member ``sender`` of ``group``, carried by ``carrier``, to ``dest``
        or, when None, to the group. The caller has checked that ``carrier`` holds ``sender``
        (:meth:`RoutingTable.holds`).

        Native semantics: one copy per carrier, the sender's own carrier left out unless it
        carries another member of the group (:meth:`Group.targets_without`); a member in
        reconnect grace has the frames held for it. Returns False when ``dest`` is unknown
        (dropped and counted), for the caller to tell its sender as it can.
        """
        table = self.table
        counters = self.counters
        counters.routed += count
        if dest is None:
            targets = table.resolve_multicast(group, carrier)
            for t in targets:
                t.push(frames, count)
            counters.delivered += count * len(targets)
            g = table.groups.get(group)
            if g is not None and g.graced:
                for e in g.graced:
                    if e.addr != sender:
                        table.hold(e, frames)
            return True
        entry = table.resolve_unicast(group, dest)
        if entry is None:
            counters.drop("unknown_destination", count)
            return False
        c = entry.carrier
        if c is None:
            table.hold(entry, frames)
            return True
        c.push(frames, count)
        counters.delivered += count
        return True

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
            for s in targets:
                # This runs for whichever connection or task caused the notices: a failure
                # to tell one target is that target's (see server.py's error policy), so it
                # closes that target only and the others are still told.
                try:
                    self._notify(s, live, blocks)
                except Exception as exc:
                    self.contain(s, exc, "delivering a membership event")

    def _notify(self, s: Carrier, live: list[Notice], blocks: dict[type, bytes]) -> None:
        cls = type(s)
        if s.events_by_call:  # e.g. in-process members: no wire form to share
            for n in live:
                s.notify(n.kind, n.entry)
            return
        block = blocks.get(cls)
        if block is None:
            try:
                frames = (cls.event_frame(n.kind, n.entry) for n in live)
                block = b"".join(f for f in frames if f)
            except Exception as exc:
                # The events' data, not any receiver, is at fault: nobody of this protocol
                # gets them (logged and counted once), and nobody is closed for it.
                self.counters.internal_errors += 1
                self.counters.drop("unencodable_event", len(live))
                log.error("cannot encode %d membership events of %r for %s clients",
                          len(live), live[0].entry.group, cls.protocol, exc_info=exc)
                block = b""
            blocks[cls] = block
        if block:
            s.push(block, len(live))
            self.counters.events_out += len(live)

    def contain(self, s: object, exc: Exception, doing: str) -> None:
        """An unexpected exception while handling connection ``s``: log it once with its
        traceback, count it, and close that connection (ERROR ``internal_error`` where its
        protocol can say so). Everyone else is served on (server.py, "Errors")."""
        self.counters.internal_errors += 1
        if isinstance(s, Session) and s.outbox.close_reason == "internal_error":
            return  # already logged and closing: one traceback per connection is enough
        log.error("closing %r: internal error while %s", s, doing, exc_info=exc)
        if isinstance(s, Session) and not s.outbox.closed:
            try:
                s.close("internal_error", "internal router error; see the router's log")
            except Exception:  # the farewell itself failed: close without one
                s.outbox.close("internal_error")

    def take_pending(self) -> list[Notice]:
        pending, self.pending = self.pending, []
        return pending

    def log_membership(self, what: str, entry: Entry, via: object) -> None:
        if log.isEnabledFor(logging.INFO):
            log.info(
                "%s %s (%s%s) in %r via %r", what, entry.name or "-", format_addr(entry.addr),
                "".join(f" {h}:{p}" for h, p in entry.physical), entry.group, via,
            )
