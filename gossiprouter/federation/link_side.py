"""The bridge's side of the relay thread's broker link (federation/link.py): what the thread
needs to publish routed messages as :class:`gossiprouter.federation.peers.Peers` does, and
where it counts what it published (server/broker_link.py calls these).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

import trio

from gossiprouter.federation.batch import BATCH_PROPERTY, FORMAT
from gossiprouter.federation.mqtt_topics import route_topic
from gossiprouter.federation.signing import MAC_PROPERTY

if TYPE_CHECKING:
    from gossiprouter.core.ratelog import RateLimitedLog
    from gossiprouter.federation.batch import Batches
    from gossiprouter.federation.broker import BridgeStats
    from gossiprouter.federation.liveness import Liveness
    from gossiprouter.federation.signing import Signer
    from gossiprouter.federation.state import Federation

# A routed message's user properties: its sender's origin, its wall-clock send time in ms;
# and a heartbeat's (its value: the sender's origin).
FROM_PROPERTY = "gossiprouter-from"
SENT_PROPERTY = "gossiprouter-sent"
BEAT_PROPERTY = "gossiprouter-beat"


class LinkedBridge(Protocol):
    """What LinkSide reads of the bridge (peers.Peers, which holds a LinkSide: the bridge is
    named by this protocol, not imported)."""

    origin: str
    prefix: str
    max_packet: int | None
    queue_limit: int
    batches: Batches
    federation: Federation
    liveness: Liveness
    stats: BridgeStats
    _signer: Signer | None
    _oversized_log: RateLimitedLog

    def _route(self, origin: str) -> Any: ...

    def _flush_routes(self) -> None: ...

    def _reachable(self, origin: str, now: float) -> None: ...


class LinkSide:
    """One bridge's side of the link (see the module docstring)."""

    def __init__(self, peers: LinkedBridge) -> None:
        self.peers = peers

    @property
    def federation(self) -> Federation:
        return self.peers.federation

    @property
    def origin(self) -> str:
        return self.peers.origin

    def params(self) -> tuple[bytes, str, bytes, int, int, int, int, int, int, int]:
        """How the relay thread publishes routed messages as ``Peers._publish_route`` does
        (its ``link_enable``): the key, the run of its own signatures (not Python's: the two
        number theirs apart), the user properties (origin; the send time's key; the batch
        mark; the signature's key), the envelope's bound, the broker's Maximum Packet Size
        (0: none announced) and bridge_queue_bytes."""
        from gossiprouter.federation.paho_fast import property_key, user_properties

        p = self.peers
        signer = p._signer
        origin = user_properties([(FROM_PROPERTY, p.origin)])
        sent = property_key(SENT_PROPERTY)
        batch = user_properties([(BATCH_PROPERTY, FORMAT)])
        mac = b"" if signer is None else property_key(MAC_PROPERTY)
        return (b"" if signer is None else signer.key,
                ("r" if signer is None else signer.run) + "t", origin + sent + batch + mac,
                len(origin), len(sent), len(batch), len(mac), p.batches.limit,
                p.max_packet or 0, p.queue_limit)

    def names(self) -> tuple[str, str, str, str, str]:
        """The user properties' names the thread reads: origin, send time, batch mark,
        signature, heartbeat."""
        return FROM_PROPERTY, SENT_PROPERTY, BATCH_PROPERTY, MAC_PROPERTY, BEAT_PROPERTY

    def in_topic(self, origin: str) -> bytes:
        """Router ``origin``'s route topic to this router (what the thread reads)."""
        p = self.peers
        return route_topic(p.prefix, origin, p.origin).encode()

    def age_ms(self, origin: str) -> int:
        """The age beyond which ``origin``'s routed frames are dropped on arrival, in its
        clock's terms (Liveness.too_old: the limit plus the link's clock offset); 0: none."""
        live = self.peers.liveness
        if live.frame_age <= 0:
            return 0
        return max(1, round((live.frame_age + live.link(origin).base()) * 1000))

    def received(self, origin: str, messages: int, payloads: int, frames: int,
                 delivered: int, expired: int) -> None:
        """What the relay thread read from router ``origin`` (delivered, or dropped as too
        old), counted as Peers._on_federation and Federation.on_route count Python's; the
        router is heard from (a heartbeat's only news then: Liveness.heard)."""
        p = self.peers
        st = p.batches.stats
        st.messages_in += messages
        st.payloads_in += payloads
        fs = p.federation.stats
        fs.routed_in += frames
        fs.delivered_in += delivered
        live = p.liveness
        live.link(origin).expired += expired
        now = trio.current_time()
        if live.heard(origin, now, time.time()):
            p._reachable(origin, now)

    def route_target(self, origin: str) -> tuple[bytes, int]:
        """Router ``origin``'s route topic and the bound of a routed message's bytes beyond
        its payload on it."""
        r = self.peers._route(origin)
        return r.raw, r.bound

    def flush_batched(self) -> None:
        """Publish the routed messages Python batched for this tick now."""
        p = self.peers
        if p.batches:
            p._flush_routes()

    def counted(self, origin: str, messages: int, payloads: int, frames: int, lost: int,
                lost_frames: int) -> None:
        """What the relay thread published to router ``origin`` (or dropped), counted as
        ``Peers._send_route`` and ``_flush_routes`` count Python's."""
        p = self.peers
        link = p.liveness.link(origin)
        link.sent += messages
        link.lost += lost
        st = p.batches.stats
        st.messages_out += messages
        st.payloads_out += payloads
        fs = p.federation.stats
        fs.routed_out += frames
        fs.not_forwarded += lost_frames

    def refused(self, oversized: int, queue_full: int, replayed: int = 0) -> None:
        """Routed messages the relay thread dropped: beyond the broker's limit, or with
        bridge_queue_bytes reached; read and refused as replays."""
        p = self.peers
        p.federation.stats.unauthenticated += replayed
        p.stats.queue_full += queue_full
        if oversized:
            p.stats.oversized += oversized
            p._oversized_log.warning(
                "bridge: not sent: %d routed messages beyond the broker's maximum packet size "
                "(%s)", oversized, p.max_packet)
