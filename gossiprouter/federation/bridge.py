"""The federation bridge: global topic publications, and federated membership and routing
(docs/federation.md), through one connection to an MQTT 5 broker.

Every router of a federation connects to the same broker (``--bridge
mqtt://HOST:PORT``). A **global** publication of a local client is delivered
locally first, then published once to the broker; the broker hands it to the
other routers whose local subscribers' patterns match, and each of them
delivers it to its own subscribers. The routers also tell each other, under
``%fed/{prefix}/<router>/``, which members each carries, and forward each other the
frames for those members.

:class:`Bridge` is one object built in parts, one module a job:

* :mod:`gossiprouter.federation.mqtt_topics`: the mapping of multicast ids and patterns to
  MQTT topics and filters, and the names of the federation's own topics (no I/O);
* :mod:`gossiprouter.federation.broker` (:class:`~gossiprouter.federation.broker.BrokerSession`,
  the base): the connection to the broker, paho's life cycle, reconnects with backoff, the
  subscriptions to the union of the local patterns;
* :mod:`gossiprouter.federation.publications`
  (:class:`~gossiprouter.federation.publications.Publications`): the global topic
  publications, out and in, with echo prevention and duplicate copies dropped;
* :mod:`gossiprouter.federation.peers` (:class:`~gossiprouter.federation.peers.Peers`): the
  federation traffic, presence and its Last Will, membership records, routed frames, the
  resync after each (re)connect and the clean leave; the state it applies is
  :mod:`gossiprouter.federation.state` (sans-IO), its payloads
  :mod:`gossiprouter.federation.codec`;
* this module: :class:`Bridge`, which ties them to the router's routing table, runs them,
  and hands each message from the broker to the part it is for.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio

from gossiprouter.core.config import Config
from gossiprouter.federation.peers import Peers
from gossiprouter.federation.publications import Publications

if TYPE_CHECKING:
    from paho.mqtt.client import Client, MQTTMessage

    from gossiprouter.sessions.base import Hub

log = logging.getLogger("gossiprouter.federation.bridge")


class _Users:
    """The properties of a PUBLISH read directly: its user properties only."""

    __slots__ = ("UserProperty",)

    def __init__(self, users: list[tuple[str, str]]) -> None:
        self.UserProperty = users


class Bridge(Peers, Publications):
    """One router's link to the federation broker (see the module docstring)."""

    def __init__(self, hub: Hub, config: Config) -> None:
        super().__init__(hub, config)
        self._client.on_message = self._on_message
        self._client.fast_publish = self._on_fast_publish
        self.table.on_patterns = self._on_patterns
        self.table.on_global = self.forward
        self.table.federation = f"{self.scheme}://{self.host}:{self.port}/{self.prefix}"

    def view(self) -> dict[str, Any]:
        """The bridge state for /groups and logs."""
        self.hub.sync()  # what the relay thread published, in the counters
        s = self.stats
        f = self.federation
        return {"broker": f"{self.scheme}://{self.host}:{self.port}", "state": self.state,
                "federation": {"routers": f.live_routers(), "remote_members": f.remote_members(),
                               "peers": f.peers(), **vars(f.stats)},
                "origin": self.origin, "last_error": self.last_error,
                "subscriptions": len(self.filters), "forwarded": s.forwarded,
                "not_forwarded": s.not_forwarded, "received": s.received,
                "echo_dropped": s.echo_dropped, "malformed": s.malformed,
                "duplicates_dropped": s.duplicates_dropped,
                "connects": s.connects, "failures": s.failures, "subacks": s.subacks,
                "failovers": s.failovers, "queued_bytes": self.queued_bytes(),
                "links": {o: {"up": p.up, "rtt": p.rtt, "sent": p.sent, "lost": p.lost,
                              "expired": p.expired}
                          for o, p in sorted(self.liveness.links.items())[:100]},
                "queue_full": s.queue_full,
                "brokers": [f"{sc}://{h}:{p}" for sc, h, p in self.endpoints],
                "oversized": s.oversized, "max_packet": self.max_packet,
                "refused_filters": s.refused_filters,
                # The compiled fast path's thread carries the routed messages both ways
                # (docs/federation.md, "The routed path on the relay thread").
                "relay_thread_routes": self._link is not None and self._link.routing}

    async def run(self) -> None:
        """Connect, serve, reconnect with backoff and jitter, until cancelled."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_cut_off)
            nursery.start_soon(self._ticker)
            await self._connect_loop()
            nursery.cancel_scope.cancel()

    def _on_fast_publish(self, topic: str, payload: bytes,
                         users: list[tuple[str, str]]) -> bool:
        # Routed frames and heartbeats (QoS 0, user properties only) read directly
        # (paho_fast.BufferedClient.fast_publish); publications go paho's way.
        if not topic.startswith(self._fed_root):
            return False
        self._on_federation(topic, payload, _Users(users))
        return True

    def _on_message(self, client: Client, userdata: Any, msg: MQTTMessage) -> None:
        if msg.topic.startswith(self._fed_root):
            self._on_federation(msg.topic, bytes(msg.payload),
                                getattr(msg, "properties", None))
            return
        try:
            self._on_publication(msg)
        except Exception:
            # Last resort, as for the federation's messages: raised here, it would end the
            # bridge's task and the router with it.
            self.stats.malformed += 1
            log.exception("bridge: publication on %r could not be handled", msg.topic)
