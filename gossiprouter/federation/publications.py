"""The federation bridge's topic publications: a local client's **global** publication goes to
the other routers through the broker, and theirs come back to this router's subscribers.

A global publication of a local client is delivered locally first, then published once to the
broker (:meth:`Publications.forward`, as the routing table's ``on_global``); the broker hands
it to the other routers whose local subscribers' patterns match, and each of them delivers it
to its own subscribers (:meth:`Publications._on_publication`). Topics and filters:
:mod:`gossiprouter.federation.mqtt_topics`.

* **Echo prevention**: subscriptions use MQTT 5 *No Local*, so the broker never
  returns a router's own publications; every publication also carries this
  bridge's random instance id as a user property, and one that comes back
  with it anyway is dropped and counted (``echo_dropped``). A publication
  from the broker is delivered locally and never published again, so nothing
  loops whatever the topology, and a router never delivers its own global
  publication twice (locally once, before it is sent).
* **Duplicates**: a broker may send one copy per matching subscription; every publication
  carries its origin's sequence number, and the extra copies are dropped (:class:`_Dedup`).
* **Guarantee**: QoS 0 by default, i.e. at most once, the router's own promise
  for every frame; ``bridge_qos = 1`` gives at least once between router and
  broker while connected (duplicates possible around a reconnect).
* **Failures**: while the broker is unreachable local delivery goes on
  untouched; global publications that could not be handed to a connected
  client are counted in ``not_forwarded`` (never queued: a later delivery of
  stale positions is worse than none).
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from typing import TYPE_CHECKING

from gossiprouter.core.config import Config
from gossiprouter.core.topics import TopicId
from gossiprouter.federation.broker import BrokerSession
from gossiprouter.federation.mqtt_topics import mqtt_topic, parse_mqtt_topic
from gossiprouter.protocol import native as wire

if TYPE_CHECKING:
    from paho.mqtt.client import MQTTMessage

    from gossiprouter.sessions.base import Hub

log = logging.getLogger("gossiprouter.federation.bridge")

ORIGIN_PROPERTY = "gossiprouter-origin"
SENDER_PROPERTY = "gossiprouter-sender"
SEQ_PROPERTY = "gossiprouter-seq"
# Publications remembered per origin to drop the broker's extra copies (see _Dedup).
DEDUP_WINDOW = 4096
MAX_ORIGINS = 1024


class _Dedup:
    """Drops the copies of one publication that a broker sends for overlapping filters.

    MQTT lets a broker deliver one copy per matching subscription (mosquitto does), and
    the union of local patterns overlaps as soon as two members use ``+`` and ``*``. Every
    bridged publication carries its origin's sequence number; per origin (a router's id and
    a random id of its run) the last ``DEDUP_WINDOW`` numbers received are remembered
    (copies arrive back to back). Nothing else is inferred from the numbers, so a forged
    huge one costs one slot of the window, never the origin's later publications.
    """

    def __init__(self) -> None:
        self._origins: dict[str, tuple[set[int], deque[int]]] = {}

    def first(self, origin: str, seq: int) -> bool:
        st = self._origins.get(origin)
        if st is None:
            if len(self._origins) >= MAX_ORIGINS:
                # Forget the oldest origin (a router restarted long ago gets a new id).
                del self._origins[next(iter(self._origins))]
            st = self._origins[origin] = (set(), deque())
        seen, order = st
        if seq in seen:
            return False
        seen.add(seq)
        order.append(seq)
        if len(order) > DEDUP_WINDOW:
            seen.discard(order.popleft())
        return True


class Publications(BrokerSession):
    """The topic publications a bridge forwards and receives (see the module docstring)."""

    def __init__(self, hub: Hub, config: Config) -> None:
        super().__init__(hub, config)
        self._seq = 0
        self._dedup = _Dedup()
        # The origin of this run's publications: the federation id is stable across restarts,
        # the sequence numbers are not, so each start is a new de-duplication window.
        self._pub_origin = f"{self.origin}/{uuid.uuid4().hex[:12]}"

    def forward(self, group: str, sender: bytes, tid: TopicId, payload: bytes) -> None:
        """Publish one global publication of a local client (already delivered locally)."""
        if not self._writable(len(payload)):
            self.stats.not_forwarded += 1
            return
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        self._seq += 1
        user = [(ORIGIN_PROPERTY, self._pub_origin), (SENDER_PROPERTY, sender.hex()),
                (SEQ_PROPERTY, str(self._seq))]
        topic = mqtt_topic(self.prefix, group, tid)
        if not self._fits(topic, payload, *(v for _, v in user)):
            self.stats.not_forwarded += 1
            return
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.UserProperty = user
        info = self._client.publish(topic, payload, self.qos, properties=props)
        if info.rc:
            self.stats.not_forwarded += 1
            return
        self.stats.forwarded += 1
        self._queued_more(len(payload) + len(topic) + 64)
        self._kick_writer()

    def _on_publication(self, msg: MQTTMessage) -> None:
        origin = sender = seq = None
        props = getattr(msg, "properties", None)
        for k, v in getattr(props, "UserProperty", None) or ():
            if k == ORIGIN_PROPERTY:
                origin = v
            elif k == SENDER_PROPERTY:
                sender = v
            elif k == SEQ_PROPERTY:
                seq = v
        if origin == self._pub_origin:
            self.stats.echo_dropped += 1
            return
        if seq is not None and not (seq.isascii() and seq.isdigit() and len(seq) <= 20):
            # Not one this bridge writes: int() refuses "²" (isdigit() does not) and more
            # than 4,300 digits, and raised out of paho's callback.
            self.stats.malformed += 1
            log.debug("bridge: dropping %r: bad sequence number", msg.topic)
            return
        if origin is not None and seq is not None \
                and not self._dedup.first(origin, int(seq)):
            self.stats.duplicates_dropped += 1
            return
        try:
            group, tid = parse_mqtt_topic(self.prefix, msg.topic)
            addr = bytes.fromhex(sender) if sender is not None else b""
            if len(addr) > wire.MAX_ADDR:
                raise ValueError("sender too long")
        except ValueError as e:
            self.stats.malformed += 1
            log.debug("bridge: dropping %r: %s", msg.topic, e)
            return
        from gossiprouter.sessions.native import deliver_publication

        max_frame = self.hub.config.max_frame
        if len(msg.payload) > max_frame:  # before the copy: it may be a retained 9 MiB
            self.stats.too_large += 1
            return
        payload = bytes(msg.payload)
        frame = wire.encode_publish(group, addr, tid[0], tid[1], tid[2], wire.PUB_GLOBAL,
                                    payload)
        if len(frame) - 4 > max_frame:
            # No subscriber could take it (each would be cut for frame_too_large).
            self.stats.too_large += 1
            return
        self.stats.received += 1
        self.table.stats.federated_in += 1
        # Delivered here and never forwarded again: on_global is not called for it.
        self.hub.counters.delivered += deliver_publication(self.table, group, addr, tid, frame,
                                                           False)
