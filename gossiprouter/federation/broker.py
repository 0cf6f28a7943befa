"""The federation bridge's connection to the MQTT 5 broker: the paho client's life cycle, the
reconnects, and the subscriptions to the union of the local patterns.

* **Subscriptions**: the broker is subscribed to the union of the local
  patterns, reference-counted by the routing table (``on_patterns``): a filter
  is subscribed when the first local member takes the pattern and
  unsubscribed when the last one drops it (leave, expiry, UNSUBSCRIBE).
* **Failures**: the bridge reconnects with full-jitter exponential backoff (0.5 s doubling up
  to ``bridge_reconnect_max``) and re-subscribes the whole union on every new connection
  (clean start). While the broker reads slowly, at most :data:`MAX_UNWRITTEN` packets and
  ``bridge_queue_bytes`` bytes of traffic wait in paho (:meth:`BrokerSession._writable`;
  beyond, routed frames and publications are dropped and counted, so a stalled broker cannot
  grow the router); beyond the broker's Maximum Packet Size nothing is sent
  (:meth:`BrokerSession._fits`).

paho-mqtt is driven from trio through its external-socket API: the bridge
waits on the socket with ``trio.lowlevel.wait_readable`` / ``wait_writable``
and calls ``loop_read`` / ``loop_write`` / ``loop_misc``. paho's ``connect`` is
blocking (TCP connect and TLS handshake), so that one call runs in trio's worker
thread; the session itself runs in the router's trio thread, with no thread
per connection and no lock around the routing table.

:class:`BrokerSession` is the base of :class:`gossiprouter.federation.bridge.Bridge`; what it
carries is the layers' above: the topic publications
(:mod:`gossiprouter.federation.publications`) and the federation traffic
(:mod:`gossiprouter.federation.peers`), which add to a broker session through
:meth:`BrokerSession._connected` and :meth:`BrokerSession._session_tasks`.
"""

from __future__ import annotations

import logging
import random
import ssl
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from gossiprouter.core.addresses import format_hostport
from gossiprouter.core.cadence import HOUSEKEEPING, until_beat
from gossiprouter.core.cli_errors import needs_extra
from gossiprouter.core.config import Config, ConfigError
from gossiprouter.core.options import parse_bridge_url
from gossiprouter.core.ratelog import RateLimitedLog
from gossiprouter.core.topics import TopicId
from gossiprouter.federation.link import Link
from gossiprouter.federation.mqtt_topics import mqtt_filter
from gossiprouter.federation.session_link import SessionLink

if TYPE_CHECKING:
    from paho.mqtt.client import Client, ConnectFlags, DisconnectFlags
    from paho.mqtt.properties import Properties
    from paho.mqtt.reasoncodes import ReasonCode

    from gossiprouter.sessions.base import Hub

log = logging.getLogger("gossiprouter.federation.bridge")

CONNECT_TIMEOUT = 5.0
CONNACK_TIMEOUT = 10.0
# Publications queued in paho but not yet written while the broker reads slowly. paho bounds
# only QoS>0 messages; beyond this the bridge counts QoS 0 ones as not forwarded instead of
# letting memory grow without bound.
MAX_UNWRITTEN = 10_000
# A broker that cannot be reached (dead, mistyped URL, refusing): the first failure of each
# kind (endpoint and cause) is one WARNING at once; its repeats, one line per this interval
# that says how many there were (docs/operations.md, "Logs").
FAILURE_LOG_INTERVAL = 60.0
# Packets handled per wake-up of the reader, from one read, before the other tasks run.
READ_PACKETS = 64


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
    too_large: int = 0  # publications from the broker beyond max_frame: never delivered
    failovers: int = 0  # moves to the next broker endpoint (several --bridge URLs)
    queue_full: int = 0  # routed messages and publications dropped: bridge_queue_bytes reached


def _federation_id(config: Config) -> str:
    """The configured federation id: ``federation_id``, else ``bridge_username`` ("" for
    neither); ValueError if the user name cannot be one."""
    from gossiprouter.core.options import check_federation_id

    if config.federation_id:
        try:
            check_federation_id(config.federation_id)
        except ValueError as e:
            raise ValueError(f"federation_id = {config.federation_id!r}: {e}") from None
        if config.bridge_username and config.bridge_username != config.federation_id:
            log.warning("bridge: federation_id %r is not the MQTT user name %r: a broker ACL "
                        "with %%u cannot confine this router to its own topics",
                        config.federation_id, config.bridge_username)
        return config.federation_id
    try:
        return check_federation_id(config.bridge_username)
    except ValueError as e:
        raise ValueError(f"bridge_username = {config.bridge_username!r} cannot be the "
                         f"federation id ({e}): set federation_id") from None


class BrokerSession:
    """One router's connection to the federation broker (see the module docstring)."""

    def __init__(self, hub: Hub, config: Config) -> None:
        try:
            from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

            from gossiprouter.federation.paho_fast import BufferedClient, install
        except ImportError:  # paho-mqtt is the bridge extra
            raise ConfigError(needs_extra("the bridge", "paho-mqtt", "bridge")) from None
        install()  # paho's properties of received PUBLISH packets, read cheaply
        self.hub = hub
        self.table = hub.table
        # Every broker endpoint (one MQTT cluster, or bridged brokers): the session uses
        # one, and moves to the next when it cannot connect or loses it (_failover).
        self.endpoints: list[tuple[str, str, int]] = []
        for url in config.bridge:
            try:
                self.endpoints.append(parse_bridge_url(url))
            except ValueError as e:
                raise ConfigError(f"bridge = {url!r}: {e}") from None
        if not self.endpoints:
            raise ConfigError("bridge: no broker URL")
        if len({e[0] for e in self.endpoints}) > 1:
            raise ConfigError(f"bridge = {list(config.bridge)!r}: mixes mqtt:// and mqtts:// "
                              "(one connection's TLS settings serve every endpoint)")
        self._endpoint = 0
        self.scheme, self.host, self.port = self.endpoints[0]
        if config.bridge_qos not in (0, 1):
            raise ConfigError(f"bridge_qos = {config.bridge_qos!r}: expected 0 or 1")
        self.qos = config.bridge_qos
        if config.bridge_keepalive > 65535:  # MQTT's keep alive is 16 bits
            raise ConfigError(f"bridge_keepalive = {config.bridge_keepalive}: at most 65535")
        self.prefix = config.bridge_prefix
        self.reconnect_max = config.bridge_reconnect_max
        # What may wait in paho for the broker, in bytes (routed frames and publications;
        # presence and records are small and always queued). An upper estimate between
        # measures: each publication adds its size, the writer's progress marks it stale.
        self.queue_limit = config.bridge_queue_bytes
        self._queued = 0
        self._queued_stale = False
        # The relay thread's broker link (federation/link.py), when the server runs the fast
        # path: a plain TCP session's writes go through it, and its reads (attach_link).
        self._sl = SessionLink()
        self.keepalive = config.bridge_keepalive
        # The router's federation identity (docs/federation.md, "Identity"): configured, and
        # by default its MQTT user name, so the broker's ACL can confine it to its subtree.
        try:
            fed_id = _federation_id(config)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.origin = fed_id or f"{config.name}#{uuid.uuid4().hex[:12]}"
        if not fed_id:
            log.warning("bridge: no federation_id and no bridge_username: a random federation "
                        "id %r, new at each start, which no broker ACL can confine",
                        self.origin)
        self.state = "disconnected"
        self.last_error: str | None = None
        self.stats = BridgeStats()
        self.filters: set[str] = set()
        self._client: BufferedClient = BufferedClient(
            CallbackAPIVersion.VERSION2,
            client_id=f"gossiprouter-{fed_id}" if fed_id else f"gossiprouter-{uuid.uuid4().hex}",
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
        c.on_subscribe = self._on_subscribe
        self._lost_at: float | None = None
        self._cut = trio.Event()  # set when a broker session ends
        # The federation's own SUBSCRIBE (peers.py): its SUBACK is not counted here.
        self._fed_mid: int | None = None
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
        self._failure_log = RateLimitedLog(log, FAILURE_LOG_INTERVAL)
        self._wake_writer = trio.Event()

    @property
    def url(self) -> str:
        """The broker endpoint in use, as ``--bridge`` takes it."""
        return f"{self.scheme}://{format_hostport(self.host, self.port)}"

    def _failed(self, what: str, cause: str) -> None:
        """The broker endpoint in use failed (``what``: "cannot connect to", "lost the
        broker"): a WARNING naming it and the cause at once, then rate-limited while the
        same failure repeats (every retry of a dead broker is one, and is counted)."""
        self._failure_log.warning("bridge: %s %s: %s (retrying, backoff up to %gs)", what,
                                  self.url, cause, self.reconnect_max,
                                  key=f"{what} {self.url}: {cause}")

    def _writable(self, size: int = 0) -> bool:
        """Connected, with no more than MAX_UNWRITTEN packets waiting in paho and room for
        ``size`` more bytes within bridge_queue_bytes: a publication is handed to the client
        (then :meth:`_queued_more`), else counted as not forwarded by the caller."""
        if self.state != "connected" or self._unwritten() > MAX_UNWRITTEN:
            return False
        if self.queued_bytes() + size > self.queue_limit:
            self.stats.queue_full += 1
            return False
        return True

    def queued_bytes(self) -> int:
        """Bytes waiting in paho for the broker (measured again after the writer's progress;
        paho keeps what is left of each packet in ``to_process``), and in the relay thread's
        link while it writes the socket."""
        if self._queued_stale:
            self._queued_stale = False
            q = getattr(self._client, "_out_packet", ())
            self._queued = sum(p.get("to_process", 0) for p in q)
        link = self._client.link
        return self._queued if link is None else self._queued + link.pending()

    @property
    def _link(self) -> Link | None:
        return self._sl.link

    def attach_link(self, link: Link) -> None:
        """The server runs the fast path: broker sessions on plain TCP write through ``link``
        (federation/link.py), and it reads them."""
        self._sl.link = link

    def _queued_more(self, size: int) -> None:
        """A publication of ``size`` bytes was handed to paho."""
        self._queued += size

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

    @staticmethod
    def packet_bound(topic: str, *user_props: str) -> int:
        """An upper bound of a PUBLISH's size beyond its payload: fixed header 5, topic,
        packet id 2, properties (length 4, expiry 5, the user properties' values with their
        keys, at most 40 bytes each)."""
        return len(topic.encode()) + 20 + sum(40 + len(v.encode()) for v in user_props)

    def _fits(self, topic: str, payload: bytes, *user_props: str) -> bool:
        """Whether a PUBLISH of ``payload`` to ``topic`` is within the broker's Maximum Packet
        Size (counted and logged when not; :meth:`packet_bound`)."""
        if self.max_packet is None:
            return True
        return self._fits_bound(topic, len(payload), self.packet_bound(topic, *user_props))

    def _fits_bound(self, topic: str, size: int, bound: int) -> bool:
        """:meth:`_fits` of a payload of ``size`` bytes whose :meth:`packet_bound` is
        ``bound`` (known already: a route topic's, peers.py)."""
        limit = self.max_packet
        if limit is None or size + bound <= limit:
            return True
        self.stats.oversized += 1
        self._oversized_log.warning(
            "bridge: not sent: a message of %d bytes on %s is beyond the broker's maximum "
            "packet size (%d)", size, topic, limit)
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
            self._failed("cannot connect to", self.last_error)
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
        self._queued_stale = True  # paho dropped the last session's packets
        limit = getattr(properties, "MaximumPacketSize", None)
        self.max_packet = limit if isinstance(limit, int) else None
        self.stats.connects += 1
        log.info("bridge connected to %s as %s (%d subscriptions)", self.url, self.origin,
                 len(self.filters))
        if self.filters:
            opts = SubscribeOptions(qos=self.qos, noLocal=True)
            client.subscribe([(f, opts) for f in sorted(self.filters)])
        self._connected(client)

    def _connected(self, client: Client) -> None:
        """A broker session began (CONNACK success, the filters subscribed again): what the
        layers above announce on it. Nothing here."""

    def _on_disconnect(self, client: Client, userdata: Any, flags: DisconnectFlags,
                       reason: ReasonCode, properties: Properties | None) -> None:
        if self.state == "connected":
            self.last_error = f"disconnected: {reason}"
            self._failed("lost the broker", str(reason))
        # (Otherwise the CONNACK refusal, already in last_error, says more.)
        if self.state == "leaving":
            log.info("bridge: left the federation")
            self.left.set()
        self.state = "disconnected"
        self._link_off()
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

    # ------------------------------------------------------------------ the connection

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
                    self._failed("cannot connect to", self.last_error.removeprefix(
                        "cannot connect: "))
                else:
                    await self._session()
                    if self._leaving:
                        return  # (the finally below sets ``left``)
                    self._lost_at = trio.current_time()
                    self._cut.set()
                    if trio.current_time() - started > 30.0:
                        n = 0
                        # A session that lasted: the next outage is logged at once (a
                        # broker that drops every session at once stays rate-limited).
                        self._failure_log.reset()
                    self.stats.failures += 1
                self.state = "disconnected"
                if self._failover():
                    continue  # straight to the next endpoint, once per round
                delay = random.uniform(0.0, min(self.reconnect_max, 0.5 * 2.0 ** min(n, 30)))
                n += 1
                await trio.sleep(delay)
        finally:
            self.state = "stopped"
            self.left.set()  # whatever was not written by now never will be
            sock = self._client.socket()
            if sock is not None:
                sock.close()

    def _failover(self) -> bool:
        """The endpoint in use failed: move to the next one. True when there is another one
        to try at once; False when a round of every endpoint ends here (then the backoff)."""
        if len(self.endpoints) == 1:
            return False
        self._endpoint = (self._endpoint + 1) % len(self.endpoints)
        self.scheme, self.host, self.port = self.endpoints[self._endpoint]
        self.stats.failovers += 1
        self._failure_log.warning("bridge: failing over to %s", self.url,
                                  key=f"failover {self.url}")
        return self._endpoint != 0

    def _connect_blocking(self) -> None:
        self._client.drop_buffer()
        self._client.connect(self.host, self.port, keepalive=self.keepalive, clean_start=True)

    async def _session(self) -> None:
        c = self._client
        sock = c.socket()
        if sock is None:
            return
        self._sl.open(c, sock)
        try:
            await self._session_run(c, sock)
        finally:
            self._sl.close(c)

    async def _session_run(self, c: Any, sock: Any) -> None:
        with trio.CancelScope() as scope:
            self._session_scope = scope
            try:
                async with trio.open_nursery() as n:
                    n.start_soon(self._reader, sock)
                    n.start_soon(self._writer, sock)
                    n.start_soon(self._misc)
                    self._session_tasks(n)
            finally:
                self._session_scope = None
        if self.state == "connected":
            # Cancelled from outside (router stopping) or the reader found EOF without a
            # callback: drop the connection so the next run starts clean.
            self.state = "disconnected"

    def _session_tasks(self, nursery: trio.Nursery) -> None:
        """Start the tasks of the layers above that live as long as one broker session (in
        ``nursery``, after the reader, the writer and the keepalive). None here."""

    async def _reader(self, sock: Any) -> None:
        c = self._client
        while True:
            if c.buffered() or (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                await trio.lowlevel.checkpoint()  # the packets of one read, then the others
            else:
                if c.socket() is None or sock.fileno() < 0:
                    self._end("connection lost")
                    return
                if c.fed is None:
                    await trio.lowlevel.wait_readable(sock)
                else:  # the relay thread reads it: what it hands up
                    await self._sl.wait(c)
            # paho handles one packet a loop_read (at QoS 0): every whole packet of the read
            # before waiting again (paho_fast.BufferedClient reads them in one recv).
            for _ in range(READ_PACKETS):
                if c.loop_read() or c.socket() is None:
                    self._end("connection lost")
                    return
                if not c.buffered():
                    break
            if self.state == "leaving":
                self._disconnect_when_acked()
            if c.want_write():
                self._kick_writer()

    async def _writer(self, sock: Any) -> None:
        c = self._client
        while True:
            await self._wake_writer.wait()
            self._wake_writer = trio.Event()
            self._queued_stale = True  # publish() may have written inline meanwhile
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
                self._queued_stale = True

    async def _misc(self) -> None:
        c = self._client
        # A broker that accepts TCP but never answers CONNECT: paho's keepalive does not
        # cover the handshake, so the session gives up itself and the backoff takes over.
        connack_by = trio.current_time() + CONNACK_TIMEOUT
        while True:
            # On the housekeeping grid, with the router's other chores (core/cadence.py).
            await trio.sleep(until_beat(min(HOUSEKEEPING, CONNACK_TIMEOUT)))
            if self.connack_overdue(connack_by, trio.current_time()):
                self.last_error = f"no CONNACK within {CONNACK_TIMEOUT:g}s"
                self._failed("cannot connect to", self.last_error)
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

    def _link_off(self) -> None:
        self._sl.off()

    def _kick_writer(self) -> None:
        self._wake_writer.set()

    def _end(self, why: str) -> None:
        if self.state == "connected":
            self.last_error = why
            self._failed("lost the broker", why)
        self.state = "disconnected"
        self._link_off()
        if self._session_scope is not None:
            self._session_scope.cancel()
