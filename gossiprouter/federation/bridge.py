"""The federation bridge: global topic publications, and federated membership and routing
(docs/federation.md), through one connection to an MQTT 5 broker.

Every router of a federation connects to the same broker (``--bridge
mqtt://HOST:PORT``). A **global** publication of a local client is delivered
locally first, then published once to the broker; the broker hands it to the
other routers whose local subscribers' patterns match, and each of them
delivers it to its own subscribers. What the bridge does, in order:

* **Mapping** (:func:`mqtt_topic`, :func:`mqtt_filter`): the multicast id
  ``(provider, broadcast, partition)`` of group ``group`` is the MQTT topic
  ``{prefix}/{group}/{provider}/{broadcast}/{partition...}``; a pattern maps
  level for level, ``+`` to ``+`` and a trailing ``*`` to ``#``. In a level
  ``/``, ``+``, ``#``, ``%``, control characters and Unicode noncharacters are
  percent-encoded (their UTF-8 bytes: ``%2F``, ``%2B``, ...) and an empty
  level is ``%``, so every level is one MQTT level, never a wildcard, and never
  refused by a broker.
* **Subscriptions**: the broker is subscribed to the union of the local
  patterns, reference-counted by the routing table (``on_patterns``): a filter
  is subscribed when the first local member takes the pattern and
  unsubscribed when the last one drops it (leave, expiry, UNSUBSCRIBE).
* **Echo prevention**: subscriptions use MQTT 5 *No Local*, so the broker never
  returns a router's own publications; every publication also carries this
  bridge's random instance id as a user property, and one that comes back
  with it anyway is dropped and counted (``echo_dropped``). A publication
  from the broker is delivered locally and never published again, so nothing
  loops whatever the topology, and a router never delivers its own global
  publication twice (locally once, before it is sent).
* **Guarantee**: QoS 0 by default, i.e. at most once, the router's own promise
  for every frame; ``bridge_qos = 1`` gives at least once between router and
  broker while connected (duplicates possible around a reconnect).
* **Failures**: while the broker is unreachable local delivery goes on
  untouched; global publications that could not be handed to a connected
  client are counted in ``not_forwarded`` (never queued: a later delivery of
  stale positions is worse than none). The bridge reconnects with full-jitter
  exponential backoff (0.5 s doubling up to ``bridge_reconnect_max``) and
  re-subscribes the whole union on every new connection (clean start).

* **Membership and routing** (:mod:`gossiprouter.federation.state` holds the state): under
  ``{prefix}/%fed/`` (a level the topic mapping never produces), a retained presence per
  router whose Last Will deletes it, a retained record per router and group, a route topic
  per router for forwarded frames, and a sync marker per router that ends the resync after
  each (re)connect. Topic names: :func:`presence_topic`, :func:`members_topic`,
  :func:`route_topic`, :func:`sync_topic`.

paho-mqtt is driven from trio through its external-socket API: the bridge
waits on the socket with ``trio.lowlevel.wait_readable`` / ``wait_writable``
and calls ``loop_read`` / ``loop_write`` / ``loop_misc``. paho's ``connect`` is
blocking (TCP connect and TLS handshake), so that one call runs in trio's worker
thread; the session itself runs in the router's trio thread, with no thread
per connection and no lock around the routing table.
"""

from __future__ import annotations

import logging
import random
import re
import ssl
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from gossiprouter.core.cli_errors import needs_extra
from gossiprouter.core.config import Config, ConfigError, parse_bridge_url
from gossiprouter.core.ratelog import RateLimitedLog
from gossiprouter.core.topics import ANY, TopicError, TopicId, topic_id
from gossiprouter.federation.state import PRESENCE_TTL, RECORD_TTL, Federation
from gossiprouter.protocol import native as wire

if TYPE_CHECKING:
    from paho.mqtt.client import Client, ConnectFlags, DisconnectFlags, MQTTMessage
    from paho.mqtt.properties import Properties
    from paho.mqtt.reasoncodes import ReasonCode

    from gossiprouter.sessions.base import Hub

log = logging.getLogger("gossiprouter.federation.bridge")

ORIGIN_PROPERTY = "gossiprouter-origin"
SENDER_PROPERTY = "gossiprouter-sender"
SEQ_PROPERTY = "gossiprouter-seq"
# On the presence deletion a router publishes when it shuts down cleanly: its members leave
# the others' views instead of being suspected (docs/federation.md, "Life cycle").
LEFT_PROPERTY = "gossiprouter-left"
# Publications remembered per origin to drop the broker's extra copies (see _Dedup).
DEDUP_WINDOW = 4096
MAX_ORIGINS = 1024
# Membership records of a burst of changes are published together this long after the first.
FLUSH_DELAY = 0.005
FED = "%fed"  # never an escaped group: a bare "%" is always escaped in topic levels
CONNECT_TIMEOUT = 5.0
CONNACK_TIMEOUT = 10.0
# Publications queued in paho but not yet written while the broker reads slowly. paho bounds
# only QoS>0 messages; beyond this the bridge counts QoS 0 ones as not forwarded instead of
# letting memory grow without bound.
MAX_UNWRITTEN = 10_000


# --------------------------------------------------------------------------- mapping


def _escaped(c: str) -> bool:
    """Characters that cannot stand in an MQTT level as they are: the separator and the
    wildcards, the escape character, and what MQTT brokers refuse in topic names (control
    characters, which mosquitto answers by disconnecting, and Unicode noncharacters)."""
    o = ord(c)
    return (c in "%/+#" or o < 0x20 or 0x7F <= o <= 0x9F or 0xFDD0 <= o <= 0xFDEF
            or (o & 0xFFFE) == 0xFFFE)


def escape_level(level: str) -> str:
    """One MQTT topic level for one string: never a wildcard, never splitting, never refused.
    Escaped characters are written as their UTF-8 bytes, ``%XX`` each (upper-case hex)."""
    if not level:
        return "%"
    if level.isascii() and level.isprintable() and not any(c in level for c in "%/+#"):
        return level
    return "".join("".join(f"%{b:02X}" for b in c.encode()) if _escaped(c) else c
                   for c in level)


_PCT = re.compile(r"(?:%[0-9A-F]{2})+")


def unescape_level(level: str) -> str:
    """The inverse of :func:`escape_level`; ValueError for a level it cannot produce."""
    if level == "%":
        return ""
    if "%" not in level:
        out = level
    else:
        try:
            out = _PCT.sub(lambda m: bytes.fromhex(m.group().replace("%", "")).decode(), level)
        except UnicodeDecodeError:
            raise ValueError(f"bad escape in MQTT level {level!r}") from None
    # Only the canonical spelling is accepted, so one id has exactly one topic.
    if escape_level(out) != level:
        raise ValueError(f"not a canonically escaped MQTT level: {level!r}")
    return out


def mqtt_topic(prefix: str, group: str, tid: TopicId) -> str:
    """The MQTT topic of a publication to ``tid`` in ``group``."""
    return "/".join((prefix, escape_level(group), *(escape_level(x) for x in
                                                     (tid[0], tid[1], *tid[2]))))


def mqtt_filter(prefix: str, group: str, pat: TopicId) -> str:
    """The MQTT topic filter of a pattern: ``+`` stays ``+``, a trailing ``*`` becomes ``#``
    (both mean "any number of levels, zero included")."""
    levels = [prefix, escape_level(group)]
    for i, x in enumerate((pat[0], pat[1], *pat[2])):
        if x == "+":
            levels.append("+")
        elif x == ANY and i == len(pat[2]) + 1:
            levels.append("#")
        else:
            levels.append(escape_level(x))
    return "/".join(levels)


def presence_topic(prefix: str, origin: str) -> str:
    """The retained presence of router ``origin`` (its Last Will empties it)."""
    return f"{prefix}/{FED}/router/{escape_level(origin)}"


def members_topic(prefix: str, origin: str, group: str) -> str:
    """The retained record of the members router ``origin`` carries in ``group``."""
    return f"{prefix}/{FED}/members/{escape_level(origin)}/{escape_level(group)}"


def route_topic(prefix: str, origin: str) -> str:
    """Where frames for router ``origin`` are published."""
    return f"{prefix}/{FED}/route/{escape_level(origin)}"


def sync_topic(prefix: str, origin: str) -> str:
    """The marker router ``origin`` sends itself to end a resync."""
    return f"{prefix}/{FED}/sync/{escape_level(origin)}"


def parse_mqtt_topic(prefix: str, topic: str) -> tuple[str, TopicId]:
    """(group, multicast id) of a bridged publication's topic; ValueError if it is not one."""
    levels = topic.split("/")
    if len(levels) < 4 or levels[0] != prefix:
        raise ValueError(f"not a gossiprouter topic: {topic!r}")
    try:
        group, provider, broadcast, *part = (unescape_level(x) for x in levels[1:])
        return group, topic_id(provider, broadcast, part)
    except TopicError as e:
        raise ValueError(f"{topic!r}: {e}") from None


# --------------------------------------------------------------------------- the bridge


def _expiring(seconds: int) -> Properties:
    """PUBLISH properties with an MQTT 5 Message Expiry Interval."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.MessageExpiryInterval = seconds
    return props


class _Dedup:
    """Drops the copies of one publication that a broker sends for overlapping filters.

    MQTT lets a broker deliver one copy per matching subscription (mosquitto does), and
    the union of local patterns overlaps as soon as two members use ``+`` and ``*``. Every
    bridged publication carries its origin's sequence number; per origin the last
    ``DEDUP_WINDOW`` numbers are remembered (copies arrive back to back, and one origin's
    publications in order), and anything older than the window counts as seen.
    """

    def __init__(self) -> None:
        self._origins: dict[str, tuple[set[int], deque[int], list[int]]] = {}

    def first(self, origin: str, seq: int) -> bool:
        st = self._origins.get(origin)
        if st is None:
            if len(self._origins) >= MAX_ORIGINS:
                # Forget the oldest origin (a router restarted long ago gets a new id).
                del self._origins[next(iter(self._origins))]
            st = self._origins[origin] = (set(), deque(), [seq - 1])
        seen, order, top = st
        if seq in seen or seq <= top[0] - DEDUP_WINDOW:
            return False
        seen.add(seq)
        order.append(seq)
        if len(order) > DEDUP_WINDOW:
            seen.discard(order.popleft())
        if seq > top[0]:
            top[0] = seq
        return True


@dataclass
class BridgeStats:
    """What the bridge counts (exported as metrics and in /groups)."""

    forwarded: int = 0  # global publications handed to the broker connection
    not_forwarded: int = 0  # global publications lost: broker not connected, or too slow
    received: int = 0  # publications from the broker delivered locally
    echo_dropped: int = 0  # own publications the broker sent back anyway (No Local ignored)
    malformed: int = 0  # broker messages under the prefix that are not valid publications
    duplicates_dropped: int = 0  # extra copies for overlapping subscriptions (MQTT allows them)
    connects: int = 0  # successful broker connections (CONNACK success)
    subacks: int = 0  # SUBSCRIBE requests the broker acknowledged
    refused_filters: int = 0  # filters the broker refused in a SUBACK
    failures: int = 0  # connection attempts or sessions that failed
    oversized: int = 0  # publications, routed messages, records beyond the broker's limit


class Bridge:
    """One router's link to the federation broker (see the module docstring)."""

    def __init__(self, hub: Hub, config: Config) -> None:
        try:
            from paho.mqtt.client import Client
            from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
        except ImportError:  # paho-mqtt is the bridge extra
            raise ConfigError(needs_extra("the bridge", "paho-mqtt", "bridge")) from None
        self.hub = hub
        self.table = hub.table
        try:
            self.scheme, self.host, self.port = parse_bridge_url(config.bridge)
        except ValueError as e:
            raise ConfigError(f"bridge = {config.bridge!r}: {e}") from None
        if config.bridge_qos not in (0, 1):
            raise ConfigError(f"bridge_qos = {config.bridge_qos!r}: expected 0 or 1")
        self.qos = config.bridge_qos
        if config.bridge_keepalive > 65535:  # MQTT's keep alive is 16 bits
            raise ConfigError(f"bridge_keepalive = {config.bridge_keepalive}: at most 65535")
        self.prefix = config.bridge_prefix
        self.reconnect_max = config.bridge_reconnect_max
        self.keepalive = config.bridge_keepalive
        # A new id on every start: a restarted router is a new origin, and two routers
        # configured with the same name still never drop each other's publications.
        self.origin = f"{config.name}#{uuid.uuid4().hex[:12]}"
        self.state = "disconnected"
        self.last_error: str | None = None
        self.stats = BridgeStats()
        self.filters: set[str] = set()
        self._client: Client = Client(
            CallbackAPIVersion.VERSION2, client_id=f"gossiprouter-{uuid.uuid4().hex}",
            protocol=MQTTProtocolVersion.MQTTv5)
        c = self._client
        c.connect_timeout = CONNECT_TIMEOUT
        if config.bridge_username:
            password = None
            if config.bridge_password_file:
                try:
                    password = Path(config.bridge_password_file).read_text().splitlines()[0]
                except (OSError, IndexError) as e:
                    raise ConfigError(f"bridge_password_file = {config.bridge_password_file!r}: "
                                      f"cannot read a password ({e})") from None
            c.username_pw_set(config.bridge_username, password)
        if self.scheme == "mqtts" or config.bridge_tls_ca or config.bridge_tls_cert:
            try:
                ctx = ssl.create_default_context(cafile=config.bridge_tls_ca or None)
                if config.bridge_tls_cert:
                    ctx.load_cert_chain(config.bridge_tls_cert, config.bridge_tls_key or None)
            except (OSError, ssl.SSLError) as e:
                raise ConfigError(f"bridge TLS files: {e}") from None
            c.tls_set_context(ctx)
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_message = self._on_message
        c.on_subscribe = self._on_subscribe
        # Deleted (empty and retained) by the broker when this router dies or is cut off, so
        # the others drop its members (docs/federation.md, "Life cycle").
        c.will_set(presence_topic(self.prefix, self.origin), b"", qos=1, retain=True)
        self._fed_root = f"{self.prefix}/{FED}/"
        self._route_topic = route_topic(self.prefix, self.origin)
        self._sync_topic = sync_topic(self.prefix, self.origin)
        self._fed_dirty = trio.Event()
        self._lost_at: float | None = None
        self._cut = trio.Event()  # set when a broker session ends
        self._fed_mid: int | None = None
        self.federation = Federation(hub, self.origin, config.name, self._send_route,
                                     self._mark_dirty)
        self.federation.publish = self._publish_group
        self._session_scope: trio.CancelScope | None = None
        # leave() was called (the router shuts down cleanly); ``left`` is set once the
        # leave is written and the broker connection closed with DISCONNECT (or there was
        # no connection to leave by).
        self._leaving = False
        self._disconnecting = False
        self.left = trio.Event()
        # The broker's Maximum Packet Size (CONNACK), if it announced one: a longer PUBLISH
        # makes it close the connection (MQTT 5 3.1.2.24), so none is sent (_fits).
        self.max_packet: int | None = None
        self._oversized_log = RateLimitedLog(log, 10.0)
        self._seq = 0
        self._dedup = _Dedup()
        self._wake_writer = trio.Event()
        self.table.on_patterns = self._on_patterns
        self.table.on_global = self.forward
        self.table.federation = f"{self.scheme}://{self.host}:{self.port}/{self.prefix}"

    def view(self) -> dict[str, Any]:
        """The bridge state for /groups and logs."""
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
                "oversized": s.oversized, "max_packet": self.max_packet,
                "refused_filters": s.refused_filters}

    # ------------------------------------------------------------------ router side

    def forward(self, group: str, sender: bytes, tid: TopicId, payload: bytes) -> None:
        """Publish one global publication of a local client (already delivered locally)."""
        if self.state != "connected" or self._unwritten() > MAX_UNWRITTEN:
            self.stats.not_forwarded += 1
            return
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        self._seq += 1
        user = [(ORIGIN_PROPERTY, self.origin), (SENDER_PROPERTY, sender.hex()),
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
        self._kick_writer()

    def _send_route(self, origin: str, payload: bytes) -> bool:
        if self.state != "connected" or self._unwritten() > MAX_UNWRITTEN:
            return False
        topic = route_topic(self.prefix, origin)
        if not self._fits(topic, payload):
            return False
        info = self._client.publish(topic, payload, self.qos)
        if info.rc:
            return False
        self._kick_writer()
        return True

    def _publish_presence(self) -> None:
        self._client.publish(presence_topic(self.prefix, self.origin),
                             self.federation.presence(), qos=1, retain=True,
                             properties=_expiring(PRESENCE_TTL))
        self._kick_writer()

    def _publish_records(self, records: list[tuple[str, bytes]]) -> None:
        props = _expiring(RECORD_TTL)
        for group, payload in records:
            topic = members_topic(self.prefix, self.origin, group)
            if not self._fits(topic, payload):
                # The others keep this group's previous record of this router (or none):
                # better than a broker that cuts the router off at every reconnect.
                continue
            # A deletion (empty payload) must not expire: it is the absence of a record.
            self._client.publish(topic, payload, qos=1, retain=True,
                                 properties=props if payload else None)
        if records:
            self._kick_writer()

    def leave(self) -> None:
        """The router shuts down cleanly (Server.shutdown), before it closes its connections:
        delete its records and presence at the broker, then DISCONNECT, so the broker does
        not publish the Last Will. The other routers see its members leave, not suspected;
        a router killed (or cancelled) still goes by its Last Will, and is suspected."""
        if self._leaving:
            return
        self._leaving = True
        records = self.federation.leave()
        if self.state != "connected":
            # Nothing can be published: its presence is gone already (Last Will) or expires.
            self.left.set()
            return
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        self.state = "leaving"  # routed frames and publications from now: not forwarded
        self._publish_records(records)
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.UserProperty = [(LEFT_PROPERTY, "1")]
        # After the records on the one connection, so every router has applied them (leave)
        # before it drops this router.
        self._client.publish(presence_topic(self.prefix, self.origin), b"", qos=1, retain=True,
                             properties=props)
        self._kick_writer()
        self._disconnect_when_acked()
        log.info("bridge: leaving the federation (%d records withdrawn)", len(records))

    def _disconnect_when_acked(self) -> None:
        """Leaving: DISCONNECT once the broker has acknowledged every QoS 1 message. paho
        sends at most 20 ahead of their PUBACKs and queues the rest, so a DISCONNECT queued
        at once went before them: the last records and the presence deletion were never
        sent. Called again by the reader as PUBACKs arrive."""
        if self.state != "leaving" or self._disconnecting:
            return
        if getattr(self._client, "_out_messages", None):  # paho's unacknowledged QoS>0
            return
        self._disconnecting = True
        self._client.disconnect()
        self._kick_writer()

    def _publish_group(self, group: str) -> None:
        # Before a routed message of that group (Federation.send); while not connected the
        # change stays dirty, and the snapshot after the reconnect carries it.
        if self.state == "connected":
            self._publish_records(self.federation.flush_group(group))

    def _fits(self, topic: str, payload: bytes, *user_props: str) -> bool:
        """Whether a PUBLISH of ``payload`` to ``topic`` is within the broker's Maximum Packet
        Size (counted and logged when not). An upper bound of the packet's size: fixed header
        5, topic, packet id 2, properties (length 4, expiry 5, the user properties' values
        with their keys, at most 40 bytes each)."""
        limit = self.max_packet
        if limit is None:
            return True
        size = (len(payload) + len(topic.encode()) + 20
                + sum(40 + len(v.encode()) for v in user_props))
        if size <= limit:
            return True
        self.stats.oversized += 1
        self._oversized_log.warning(
            "bridge: not sent: a message of %d bytes on %s is beyond the broker's maximum "
            "packet size (%d)", len(payload), topic, limit)
        return False

    def _unwritten(self) -> int:
        # paho keeps unwritten packets in _out_packet and offers no public count of them.
        q = getattr(self._client, "_out_packet", ())
        return len(q)

    def _on_patterns(self, group: str, pats: list[TopicId], added: bool) -> None:
        from paho.mqtt.subscribeoptions import SubscribeOptions

        filters = [mqtt_filter(self.prefix, group, p) for p in pats]
        if added:
            self.filters.update(filters)
            if self.state == "connected":
                opts = SubscribeOptions(qos=self.qos, noLocal=True)
                self._client.subscribe([(f, opts) for f in filters])
        else:
            self.filters.difference_update(filters)
            if self.state == "connected":
                self._client.unsubscribe(filters)
        self._kick_writer()

    # ------------------------------------------------------------------ paho callbacks

    def _on_connect(self, client: Client, userdata: Any, flags: ConnectFlags,
                    reason: ReasonCode, properties: Properties | None) -> None:
        if reason.is_failure:
            self.last_error = f"broker refused the connection: {reason}"
            log.warning("bridge: %s", self.last_error)
            return
        if self._leaving:
            # Connected while the router was already shutting down: nothing to announce,
            # and a clean DISCONNECT keeps the Last Will from being published.
            self.state = "leaving"
            self._disconnecting = True
            client.disconnect()
            self._kick_writer()
            return
        from paho.mqtt.subscribeoptions import SubscribeOptions

        self.state = "connected"
        self.last_error = None
        self._lost_at = None
        limit = getattr(properties, "MaximumPacketSize", None)
        self.max_packet = limit if isinstance(limit, int) else None
        self.stats.connects += 1
        log.info("bridge connected to %s://%s:%d as %s (%d subscriptions)", self.scheme,
                 self.host, self.port, self.origin, len(self.filters))
        if self.filters:
            opts = SubscribeOptions(qos=self.qos, noLocal=True)
            client.subscribe([(f, opts) for f in sorted(self.filters)])
        # Membership: presences before records (one SUBSCRIBE, served in order), then the
        # snapshot, then the marker that comes back after every retained message.
        fed = self.federation
        fed.begin_sync()
        root = self._fed_root
        state = SubscribeOptions(qos=1, noLocal=True)
        _, self._fed_mid = client.subscribe([
            (root + "router/+", state), (root + "members/#", state),
            (self._route_topic, SubscribeOptions(qos=self.qos, noLocal=True)),
            (self._sync_topic, SubscribeOptions(qos=1))])
        self._publish_presence()
        self._publish_records(fed.snapshot())
        client.publish(self._sync_topic, b"", qos=1)

    def _on_disconnect(self, client: Client, userdata: Any, flags: DisconnectFlags,
                       reason: ReasonCode, properties: Properties | None) -> None:
        if self.state == "connected":
            log.warning("bridge lost the broker: %s", reason)
            self.last_error = f"disconnected: {reason}"
        # (Otherwise the CONNACK refusal, already in last_error, says more.)
        if self.state == "leaving":
            log.info("bridge: left the federation")
            self.left.set()
        self.state = "disconnected"
        if self._session_scope is not None:
            self._session_scope.cancel()

    def _on_subscribe(self, client: Client, userdata: Any, mid: int,
                      reasons: list[ReasonCode], properties: Properties | None) -> None:
        if mid == self._fed_mid:
            # The federation's own subscriptions: not the topic filters counted here.
            if any(r.is_failure for r in reasons):
                log.error("bridge: the broker refused the federation's subscriptions: %s",
                          reasons)
            return
        self.stats.subacks += 1
        refused = [r for r in reasons if r.is_failure]
        if refused:
            self.stats.refused_filters += len(refused)
            log.warning("bridge: the broker refused %d subscription(s): %s", len(refused),
                        refused[0])

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
        if origin == self.origin:
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

        payload = bytes(msg.payload)
        frame = wire.encode_publish(group, addr, tid[0], tid[1], tid[2], wire.PUB_GLOBAL,
                                    payload)
        self.stats.received += 1
        self.table.stats.federated_in += 1
        # Delivered here and never forwarded again: on_global is not called for it.
        self.hub.counters.delivered += deliver_publication(self.table, group, addr, tid, frame,
                                                           False)

    def _on_federation(self, topic: str, payload: bytes, props: Properties | None) -> None:
        fed = self.federation
        try:
            if topic == self._route_topic:  # the routed frames: first, nothing else parsed
                fed.on_route(payload)
                return
            if topic == self._sync_topic:
                fed.end_sync()
                return
            levels = topic[len(self._fed_root):].split("/")
            if levels[0] == "router" and len(levels) == 2:
                left = any(k == LEFT_PROPERTY for k, _ in
                           getattr(props, "UserProperty", None) or ())
                expiry = getattr(props, "MessageExpiryInterval", None)
                fed.on_presence(unescape_level(levels[1]), payload, trio.current_time(),
                                left=left, expiry=expiry if isinstance(expiry, int) else None)
            elif levels[0] == "members" and len(levels) == 3:
                fed.on_record(unescape_level(levels[1]), unescape_level(levels[2]), payload)
            else:
                raise ValueError("unknown federation topic")
        except ValueError as e:
            fed.stats.malformed += 1
            log.debug("bridge: dropping %r: %s", topic, e)
        except Exception:
            # Last resort: raised here, it would leave paho's callback and end the bridge's
            # task, and with it the router. The decoders count what they cannot read; this
            # is for what they missed (a bug), logged with its traceback.
            fed.stats.malformed += 1
            log.exception("bridge: federation message on %r could not be handled", topic)

    # ------------------------------------------------------------------ the connection

    async def run(self) -> None:
        """Connect, serve, reconnect with backoff and jitter, until cancelled."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_cut_off)
            await self._connect_loop()
            nursery.cancel_scope.cancel()

    async def _watch_cut_off(self) -> None:
        # The others declare this router dead 1.5 keepalives after it lost the broker (its
        # Last Will); it drops them after as long, so both sides see the same partition.
        while True:
            await self._cut.wait()
            self._cut = trio.Event()
            while (lost := self._lost_at) is not None and self.state != "connected":
                deadline = lost + 1.5 * self.keepalive
                if trio.current_time() < deadline:
                    await trio.sleep_until(deadline)
                    continue
                self._lost_at = None
                if self.federation.routers:
                    log.warning("bridge: no broker for %.1fs: dropping the other routers' "
                                "members", 1.5 * self.keepalive)
                    self.federation.cut_off()

    async def _connect_loop(self) -> None:
        n = 0
        try:
            while not self._leaving:
                self.state = "connecting"
                started = trio.current_time()
                try:
                    # Blocking TCP connect + TLS handshake + CONNECT: in a worker thread;
                    # nothing else touches the client meanwhile (state is not connected).
                    # Abandoned on cancellation, so a blackholed broker cannot hold up
                    # the router's shutdown; the socket is closed in the finally below.
                    await trio.to_thread.run_sync(self._connect_blocking,
                                                  abandon_on_cancel=True)
                except (OSError, ssl.SSLError, ValueError) as e:
                    self.last_error = f"cannot connect: {e.strerror or e}" if isinstance(
                        e, OSError) else f"cannot connect: {e}"
                    self.stats.failures += 1
                    log.info("bridge: %s", self.last_error)
                else:
                    await self._session()
                    if self._leaving:
                        return  # (the finally below sets ``left``)
                    self._lost_at = trio.current_time()
                    self._cut.set()
                    if trio.current_time() - started > 30.0:
                        n = 0
                    self.stats.failures += 1
                self.state = "disconnected"
                delay = random.uniform(0.0, min(self.reconnect_max, 0.5 * 2.0 ** min(n, 30)))
                n += 1
                await trio.sleep(delay)
        finally:
            self.state = "stopped"
            self.left.set()  # whatever was not written by now never will be
            sock = self._client.socket()
            if sock is not None:
                sock.close()

    def _connect_blocking(self) -> None:
        self._client.connect(self.host, self.port, keepalive=self.keepalive, clean_start=True)

    async def _session(self) -> None:
        c = self._client
        sock = c.socket()
        if sock is None:
            return
        with trio.CancelScope() as scope:
            self._session_scope = scope
            try:
                async with trio.open_nursery() as n:
                    n.start_soon(self._reader, sock)
                    n.start_soon(self._writer, sock)
                    n.start_soon(self._misc)
                    n.start_soon(self._flusher)
                    n.start_soon(self._refresher)
            finally:
                self._session_scope = None
        if self.state == "connected":
            # Cancelled from outside (router stopping) or the reader found EOF without a
            # callback: drop the connection so the next run starts clean.
            self.state = "disconnected"

    async def _reader(self, sock: Any) -> None:
        c = self._client
        while True:
            if not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                if c.socket() is None or sock.fileno() < 0:
                    self._end("connection lost")
                    return
                await trio.lowlevel.wait_readable(sock)
            if c.loop_read(max_packets=64) or c.socket() is None:
                self._end("connection lost")
                return
            if self.state == "leaving":
                self._disconnect_when_acked()
            if c.want_write():
                self._kick_writer()

    async def _writer(self, sock: Any) -> None:
        c = self._client
        while True:
            await self._wake_writer.wait()
            self._wake_writer = trio.Event()
            while c.want_write():
                if c.socket() is None or sock.fileno() < 0:
                    # paho closed it in a callback (the reader saw the end) while this task
                    # was waking up: waiting on a closed descriptor would raise.
                    self._end("connection lost")
                    return
                await trio.lowlevel.wait_writable(sock)
                if c.loop_write() or c.socket() is None:
                    self._end("write failed")
                    return

    async def _misc(self) -> None:
        c = self._client
        # A broker that accepts TCP but never answers CONNECT: paho's keepalive does not
        # cover the handshake, so the session gives up itself and the backoff takes over.
        connack_by = trio.current_time() + CONNACK_TIMEOUT
        while True:
            await trio.sleep(min(1.0, CONNACK_TIMEOUT))
            if self.connack_overdue(connack_by, trio.current_time()):
                self.last_error = f"no CONNACK within {CONNACK_TIMEOUT:g}s"
                log.warning("bridge: %s", self.last_error)
                self._end(self.last_error)
                return
            if c.loop_misc():
                self._end("keepalive timeout")
                return
            if c.want_write():
                self._kick_writer()

    def connack_overdue(self, connack_by: float, now: float) -> bool:
        """Still waiting for the CONNACK past its deadline. Only while connecting: a session
        that is leaving (not "connected" either) must live until its DISCONNECT is written,
        or its Last Will goes out after all."""
        return self.state == "connecting" and now >= connack_by

    async def _flusher(self) -> None:
        while True:
            await self._fed_dirty.wait()
            # A burst of joins (a cluster starting) makes one record per group, not one each.
            await trio.sleep(FLUSH_DELAY)
            self._fed_dirty = trio.Event()
            if self.state == "connected":
                self._publish_records(self.federation.flush())

    async def _refresher(self) -> None:
        # Presence and records are retained with an expiry (federation.PRESENCE_TTL,
        # RECORD_TTL): republished well before it, and the others' presences checked.
        every = PRESENCE_TTL / 3
        records_every = max(1, round(RECORD_TTL / 3 / every))
        n = 0
        while True:
            await trio.sleep(every)
            n += 1
            if self.state != "connected":
                continue
            self._publish_presence()
            if n % records_every == 0:
                self._publish_records(self.federation.records())
            self.federation.expire(trio.current_time())

    def _mark_dirty(self) -> None:
        self._fed_dirty.set()

    def _kick_writer(self) -> None:
        self._wake_writer.set()

    def _end(self, why: str) -> None:
        if self.state == "connected":
            log.warning("bridge lost the broker: %s", why)
            self.last_error = why
        self.state = "disconnected"
        if self._session_scope is not None:
            self._session_scope.cancel()
