"""The federation bridge's traffic between routers: presence (and its Last Will), membership
records, routed frames and the resync marker (docs/federation.md).

* **Membership and routing** (:mod:`gossiprouter.federation.state` holds the state): in each
  router's own subtree ``%fed/{prefix}/<router>/`` (beside the topic publications' tree), a
  retained presence whose Last Will deletes it, a retained record per group, a route topic
  per destination router for forwarded frames, and a sync marker that ends the resync after
  each (re)connect. Topic names: :mod:`gossiprouter.federation.mqtt_topics`; payloads:
  :mod:`gossiprouter.federation.codec`.
* **Life cycle**: on every broker session the presence, the snapshot of the records and the
  sync marker are published (:meth:`Peers._connected`); a clean shutdown withdraws the
  records and the presence before a DISCONNECT (:meth:`Peers.leave`), so the others see this
  router's members leave instead of being suspected; a router cut off from the broker for 1.5
  keepalives drops the others' members, as they drop its own (:meth:`Peers._watch_cut_off`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import time
import uuid
from typing import TYPE_CHECKING, NamedTuple

import trio

from gossiprouter.core.cadence import until_beat
from gossiprouter.core.config import Config, ConfigError
from gossiprouter.federation.batch import BATCH_PROPERTY, FORMAT, Batches, decode_batch
from gossiprouter.federation.broker import BrokerSession
from gossiprouter.federation.link import Link
from gossiprouter.federation.link_side import (
    BEAT_PROPERTY,
    FROM_PROPERTY,
    SENT_PROPERTY,
    LinkSide,
)
from gossiprouter.federation.liveness import Liveness
from gossiprouter.federation.mqtt_topics import (
    escape_level,
    fed_root,
    members_topic,
    parse_fed_topic,
    presence_topic,
    route_topic,
    sync_topic,
)
from gossiprouter.federation.remote import PRESENCE_TTL, RECORD_TTL
from gossiprouter.federation.signing import (
    MAC_PROPERTY,
    KeyFileError,
    Signer,
    Verifier,
    read_key,
)
from gossiprouter.federation.state import Federation

if TYPE_CHECKING:
    from paho.mqtt.client import Client
    from paho.mqtt.properties import Properties

    from gossiprouter.sessions.base import Hub

log = logging.getLogger("gossiprouter.federation.bridge")

# On the presence deletion a router publishes when it shuts down cleanly: its members leave
# the others' views instead of being suspected (docs/federation.md, "Life cycle").
LEFT_PROPERTY = "gossiprouter-left"
# Membership records of a burst of changes are published together this long after the first.
FLUSH_DELAY = 0.005
# The ticker's pause when a tick leaves a deadline due (a guard against a busy loop: a test
# that disables the holds' expiry; seconds). Else it sleeps until Federation.next_due.
TICK = 0.5
# The user properties on the route topic (a heartbeat's, a routed message's origin and send
# time) are named in link_side.py, which the relay thread's link shares.
# Route topics kept built (_Route), one per other router; cleared when this many.
ROUTES_CACHE = 1024


class _Route(NamedTuple):
    """Another router's route topic as a routed message uses it (Peers._route)."""

    topic: str
    raw: bytes  # encoded, for the PUBLISH
    bound: int  # BrokerSession.packet_bound of a routed message on it
    extra: int  # what a routed message adds to the bytes queued in paho (estimate)


def _expiring(seconds: int) -> Properties:
    """PUBLISH properties with an MQTT 5 Message Expiry Interval."""
    props = _properties()
    props.MessageExpiryInterval = seconds
    return props


def _no_delay(client: Client) -> None:
    sock = client.socket()
    with contextlib.suppress(OSError, AttributeError):  # not TCP (WebSockets): as it is
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # type: ignore[union-attr]


def _properties(will: bool = False) -> Properties:
    from paho.mqtt.packettypes import PacketTypes

    from gossiprouter.federation.paho_fast import FastProperties

    return FastProperties(PacketTypes.WILLMESSAGE if will else PacketTypes.PUBLISH)


class Peers(BrokerSession):
    """What a bridge tells the other routers of the federation and hears from them (see the
    module docstring)."""

    def __init__(self, hub: Hub, config: Config) -> None:
        super().__init__(hub, config)
        c = self._client
        # The optional federation key (signing.py): everything under %fed/ signed and checked.
        self._signer: Signer | None = None
        self._verifier: Verifier | None = None
        if config.federation_key_file:
            try:
                key = read_key(config.federation_key_file)
            except KeyFileError as e:
                raise ConfigError(str(e)) from None
            self._signer = Signer(key, uuid.uuid4().hex[:16])
            self._verifier = Verifier(key)
        elif not config.bridge_username and not config.bridge_tls_cert:
            log.warning("bridge: federating with no broker credentials and no "
                        "federation_key_file: anyone who can reach the broker can take over "
                        "the federation (docs/federation.md, 'Threat model')")
        # Deleted (empty and retained) by the broker when this router dies or is cut off, so
        # the others drop its members (docs/federation.md, "Life cycle").
        will = presence_topic(self.prefix, self.origin)
        c.will_set(will, b"", qos=1, retain=True,
                   properties=self._signed(will, b"", "presence", _properties(will=True)))
        self._fed_root = fed_root(self.prefix)
        self._sync_topic = sync_topic(self.prefix, self.origin)
        self._fed_dirty = trio.Event()
        self.federation = Federation(hub, self.origin, config.name, self._send_route,
                                     self._mark_dirty)
        self.federation.publish = self._publish_group
        self._tick_due = trio.Event()
        self.federation.wake = lambda: self._tick_due.set()  # (the current event)
        self.federation.clock = trio.current_time
        self.federation.grace = config.federation_grace
        self.heartbeat = config.federation_heartbeat
        self.liveness = Liveness(config.federation_peer_timeout, config.federation_frame_age)
        self._resync_after = 0.0
        self.wall = time.time  # the wall clock of routed frames' ages (a test may set it)
        # Routed messages wait here for the end of the scheduler tick, then leave as one
        # broker message per destination router (batch.py; _flush_routes).
        self.batches = Batches()
        self._batch_due = trio.Event()
        self.federation.flush_routes = self._flush_routes
        self.route_wakeups = 0  # of the end-of-tick task (tests, profiles)
        self._routes: dict[str, _Route] = {}
        self.link_side = LinkSide(self)  # (for the relay thread's link: attach_link)
        self._link_said = False  # (its start, logged once)

    def _route(self, origin: str) -> _Route:
        """Router ``origin``'s route topic, built once per router (was twice a message)."""
        r = self._routes.get(origin)
        if r is None:
            if len(self._routes) >= ROUTES_CACHE:
                self._routes.clear()
            topic = route_topic(self.prefix, self.origin, origin)
            # A routed message's properties: this router's origin, its send time in ms (13
            # digits) and the batch mark (the envelope's bound, and so a single payload's).
            r = self._routes[origin] = _Route(
                topic, topic.encode(), self.packet_bound(topic, self.origin, "0" * 13, FORMAT),
                len(topic) + len(self.origin) + 64)
        return r

    def _send_route(self, origin: str, payload: bytes) -> bool:
        """A routed message for router ``origin``: batched until the end of the tick (False:
        not connected, the bridge's queue full, or beyond the broker's Maximum Packet Size
        even alone; counted lost). The one check of a payload's size: a message of one
        payload is not checked again at the flush."""
        r = self._route(origin)
        if not (self._writable(self.batches.bytes + len(payload))
                and self._fits_bound(r.topic, len(payload), r.bound)):
            self.liveness.link(origin).lost += 1
            return False
        self.batches.add(origin, payload)
        if not self.federation.holding:  # (else flushed by the fast path's upcalls)
            self._batch_due.set()
        return True

    def _flush_routes(self) -> None:
        """What this tick routed to each other router, as one broker message per router
        (several if beyond the broker's limit): ``peer_messages{sent}`` counts them, and
        ``{lost}`` the routed messages (runs) a publication failed for."""
        if not self.batches:
            return
        if self.state != "connected":
            self._lost(self.batches.clear())
            return
        sent = str(round(self.wall() * 1000))
        c = self._client
        queued = 0
        # One send for every router's message (paho_fast.BufferedClient.corked): a send
        # per message was the largest cost of a tick.
        with c.corked():
            for origin, message, items in self.batches.take():
                link = self.liveness.link(origin)
                r = self._route(origin)
                # (A single payload was checked when batched, an envelope is checked here.)
                if (items == 1 or self._fits_bound(r.topic, len(message), r.bound)) and \
                        self._publish_route(origin, message, SENT_PROPERTY, sent,
                                            batch=items > 1, corked=True):
                    link.sent += 1
                    queued += len(message) + r.extra
                else:
                    link.lost += items
        if c.uncorked_rc:
            self._kick_writer()  # the writer meets the failure and ends the session
        elif c.want_write():  # not all written (paho writes what the socket takes)
            self._queued_more(queued)
            self._kick_writer()
        else:
            self._queued_stale = True

    def _lost(self, dropped: dict[str, int]) -> None:
        for origin, n in dropped.items():
            self.liveness.link(origin).lost += n

    async def _route_flusher(self) -> None:
        # Woken by the first routed message of a tick; by the time it runs, every task that
        # was runnable with it (each connection's whole read) has added its messages.
        while True:
            await self._batch_due.wait()
            self._batch_due = trio.Event()
            self.route_wakeups += 1
            self._flush_routes()

    def _publish_route(self, origin: str, payload: bytes, key: str, value: str,
                       batch: bool = False, corked: bool = False) -> bool:
        """A message on ``origin``'s route topic (routed frames, or a heartbeat), with this
        router's origin and ``key``: ``value`` as user properties (and the batch mark when
        ``payload`` is an envelope of several routed messages, batch.py). ``corked``: paho
        writes nothing now, the caller writes and counts what is queued. The caller has
        checked the size against the broker's Maximum Packet Size."""
        if not self._writable(len(payload)):
            return False
        r = self._route(origin)
        topic = r.topic
        users = [(FROM_PROPERTY, self.origin), (key, value),
                 *(((BATCH_PROPERTY, FORMAT),) if batch else ())]
        c = self._client
        if self.qos == 0:  # (paho's publish, built directly: paho_fast.py)
            if c.publish_qos0(r.raw, self._sign(users, topic, payload, "route"),
                              payload):
                return False
        else:
            props = _properties()
            props.UserProperty = users
            info = c.publish(topic, payload, self.qos,
                             properties=self._signed(topic, payload, "route", props))
            if info.rc:
                return False
        if corked:
            return True
        if c.want_write():  # not all written inline (paho writes at once when it can)
            self._queued_more(len(payload) + r.extra)
            self._kick_writer()
        else:  # nothing waits: no writer to wake, and nothing queued to count
            self._queued_stale = True
        return True

    def _signed(self, topic: str, payload: bytes, kind: str,
                props: Properties | None = None) -> Properties | None:
        """``props`` with this router's signature of the message (only with a key)."""
        if self._signer is None:
            return props
        if props is None:
            props = _properties()
        props.UserProperty = self._sign(list(getattr(props, "UserProperty", None) or ()),
                                        topic, payload, kind)
        return props

    def _sign(self, users: list[tuple[str, str]], topic: str, payload: bytes,
              kind: str) -> list[tuple[str, str]]:
        """``users`` with this router's signature of the message appended (with a key)."""
        if self._signer is not None:
            users.append((MAC_PROPERTY, self._signer.sign(topic, payload, kind)))
        return users

    def _publish_presence(self) -> None:
        topic, payload = presence_topic(self.prefix, self.origin), self.federation.presence()
        self._client.publish(topic, payload, qos=1, retain=True,
                             properties=self._signed(topic, payload, "presence",
                                                     _expiring(PRESENCE_TTL)))
        self._kick_writer()

    def _publish_records(self, records: list[tuple[str, str, bytes]]) -> None:
        for group, tag, payload in records:
            topic = members_topic(self.prefix, self.origin, group, tag)
            if not self._fits(topic, payload):
                # The others keep this group's previous record of this router (or none):
                # better than a broker that cuts the router off at every reconnect.
                continue
            # A deletion (empty payload) must not expire: it is the absence of a record.
            self._client.publish(topic, payload, qos=1, retain=True,
                                 properties=self._signed(topic, payload, "members",
                                                         _expiring(RECORD_TTL)
                                                         if payload else None))
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
        self._link_off()
        self._publish_records(records)
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.UserProperty = [(LEFT_PROPERTY, "1")]
        # After the records on the one connection, so every router has applied them (leave)
        # before it drops this router.
        topic = presence_topic(self.prefix, self.origin)
        self._client.publish(topic, b"", qos=1, retain=True,
                             properties=self._signed(topic, b"", "presence", props))
        self._kick_writer()
        self._disconnect_when_acked()
        log.info("bridge: leaving the federation (%d records withdrawn)", len(records))

    def _publish_group(self, group: str) -> None:
        # Before a routed message of that group (Federation.send); while not connected the
        # change stays dirty, and the snapshot after the reconnect carries it.
        if self.state == "connected":
            self._publish_records(self.federation.flush_group(group))

    def _connected(self, client: Client) -> None:
        super()._connected(client)
        # Routed messages are small and go out one tick after another: without TCP_NODELAY
        # the second of two waits for the broker's (delayed) ACK of the first, up to 40 ms.
        _no_delay(client)
        from paho.mqtt.subscribeoptions import SubscribeOptions

        # Membership: presences before records (one SUBSCRIBE, served in order), then the
        # snapshot, then the marker that comes back after every retained message.
        fed = self.federation
        # Routed messages of the last session are gone with it (counted lost there).
        self._lost(self.batches.clear())
        self.batches.set_limit(self.max_packet, self.queue_limit)
        if self.max_packet is not None:
            # Every chunk and delta within the broker's Maximum Packet Size (its CONNACK),
            # with room for the topic and the properties (a signature among them).
            fed.max_record = max(self.max_packet - 1024, 1024)
        fed.begin_sync()
        self.liveness.restart(trio.current_time())
        root = self._fed_root
        state = SubscribeOptions(qos=1, noLocal=True)
        _, self._fed_mid = client.subscribe([
            (root + "+/presence", state), (root + "+/members/#", state),
            (f"{root}+/route/{escape_level(self.origin)}",
             SubscribeOptions(qos=self.qos, noLocal=True)),
            (self._sync_topic, SubscribeOptions(qos=1))])
        self._publish_presence()
        self._publish_records(fed.snapshot())
        client.publish(self._sync_topic, b"", qos=1,
                       properties=self._signed(self._sync_topic, b"", "sync"))
        link = self._link
        if link is not None and self._client.link is not None and self.qos == 0:
            # The relay thread publishes the remote share of the routes it learns from now
            # (server/broker_link.py): after everything above, on the same stream.
            link.enable(self.link_side)
            if not self._link_said:
                self._link_said = True
                log.info("bridge: routed messages of native groups are published and read by "
                         "the compiled fast path's thread")

    # ------------------------------------------------------------------ the relay thread's link

    def attach_link(self, link: Link) -> None:
        super().attach_link(link)
        moves = self.federation.moves
        link.seed(moves.seq)
        moves.take = link.fanout  # one sequence of fan-out numbers with the thread's
        self.federation.routing_changed = link.invalidate
        self.federation.learned_in = link.learn_in
        if self._verifier is not None:
            self._verifier.link = link


    def _on_federation(self, topic: str, payload: bytes, props: object) -> None:
        # (props: paho's Properties, or bridge._Users: only what getattr finds is read)
        fed = self.federation
        try:
            # Who wrote it is the subtree it is in (which the broker's ACL confines each
            # router to): a message about router R is only ever read from R's subtree.
            writer, kind, arg, tag = parse_fed_topic(self.prefix, topic)
            user = getattr(props, "UserProperty", None) or ()
            users = dict(user)  # (one look-up each below; the signature's: the first one)
            left = LEFT_PROPERTY in users
            if self._verifier is not None:
                why = self._verifier.check(
                    topic, payload, next((v for k, v in user if k == MAC_PROPERTY), None),
                    writer=writer, kind=kind, last_will=not payload and not left)
                if why is not None:
                    fed.stats.unauthenticated += 1
                    log.debug("bridge: refusing %r: %s", topic, why)
                    return
                if kind == "presence" and not payload:
                    self._verifier.forget(writer)
            if kind == "route" and arg == self.origin:
                if self._on_path(writer, payload, users):
                    st = self.batches.stats
                    st.messages_in += 1
                    if BATCH_PROPERTY in users:
                        items = decode_batch(payload)
                        st.payloads_in += len(items)
                        for item in items:  # each checked as if it had come alone
                            fed.on_route(item, writer)
                    else:
                        st.payloads_in += 1
                        fed.on_route(payload, writer)
            elif kind == "sync" and writer == self.origin:
                fed.end_sync(trio.current_time())
            elif kind == "presence":
                expiry = getattr(props, "MessageExpiryInterval", None)
                fed.on_presence(writer, payload, trio.current_time(),
                                left=left, expiry=expiry if isinstance(expiry, int) else None)
            elif kind == "members" and arg is not None:
                fed.on_record(writer, arg, payload, tag)
            else:
                raise ValueError("not a federation topic this router subscribed to")
        except ValueError as e:
            fed.stats.malformed += 1
            log.debug("bridge: dropping %r: %s", topic, e)
        except Exception:
            # Last resort: raised here, it would leave paho's callback and end the bridge's
            # task, and with it the router. The decoders count what they cannot read; this
            # is for what they missed (a bug), logged with its traceback.
            fed.stats.malformed += 1
            log.exception("bridge: federation message on %r could not be handled", topic)

    def _session_tasks(self, nursery: trio.Nursery) -> None:
        super()._session_tasks(nursery)
        nursery.start_soon(self._flusher)
        nursery.start_soon(self._route_flusher)
        nursery.start_soon(self._refresher)
        if self.heartbeat > 0:
            nursery.start_soon(self._heartbeats)

    def _on_path(self, writer: str, payload: bytes, user: dict[str, str]) -> bool:
        """What came on the route topic from router ``writer`` (the subtree it was read
        from, never a property the message names), with its user properties ``user``, before
        the routed frames are parsed: a heartbeat (handled here), or routed frames with their
        age (False: too old, dropped and counted). A message without those properties (an
        older router) passes."""
        origin = writer
        if origin == self.origin or not (FROM_PROPERTY in user or BEAT_PROPERTY in user):
            return BEAT_PROPERTY not in user
        now, wall = trio.current_time(), self.wall()
        live = self.liveness
        if BEAT_PROPERTY in user:
            try:
                back = live.beat_in(origin, payload, now, wall)
            except ValueError:
                self.federation.stats.malformed += 1
                return False
        else:
            back = live.heard(origin, now, wall)
        if back:
            self._reachable(origin, now)
        sent = user.get(SENT_PROPERTY)
        if sent is None or not (sent.isascii() and sent.isdigit() and len(sent) < 20):
            return BEAT_PROPERTY not in user
        return not live.too_old(origin, int(sent), wall, 1)

    def _reachable(self, origin: str, now: float) -> None:
        """``origin`` is heard from again: revived if it is held in grace; if it was dropped
        meanwhile, the retained state is read again (at most once per peer timeout)."""
        if self.federation.reachable(origin, now):
            return
        if now >= self._resync_after and self.state == "connected":
            self._resync_after = now + max(self.liveness.timeout, 1.0)
            self._resync()

    def _resync(self) -> None:
        """Read every retained presence and record again without a reconnect: subscribe to
        them again (the broker sends the retained messages anew), then the sync marker."""
        from paho.mqtt.subscribeoptions import SubscribeOptions

        log.info("bridge: a router came back after it was dropped: resyncing")
        self.federation.begin_sync()
        state = SubscribeOptions(qos=1, noLocal=True)
        _, self._fed_mid = self._client.subscribe([
            (self._fed_root + "+/presence", state), (self._fed_root + "+/members/#", state)])
        self._client.publish(self._sync_topic, b"", qos=1,
                             properties=self._signed(self._sync_topic, b"", "sync"))
        self._kick_writer()

    async def _heartbeats(self) -> None:
        # A heartbeat to every other router on its route topic (the traffic's path), then the
        # peers silent for the timeout are declared unreachable (held in grace).
        live = self.liveness
        while True:
            # On the wall clock's grid (core/cadence.py): with this router's other chores, and
            # with the other routers' heartbeats, which then come while this one is awake.
            await trio.sleep(until_beat(self.heartbeat))
            now, wall = trio.current_time(), self.wall()
            routers = self.federation.routers
            for origin in list(routers):
                beat = live.beat_out(origin, now, wall)
                if self._fits(self._route(origin).topic, beat, self.origin, self.origin):
                    self._publish_route(origin, beat, BEAT_PROPERTY, self.origin)
            for origin in live.check(now):
                if origin not in routers:
                    continue  # already gone (Last Will, clean leave or dropped): said then
                log.warning("bridge: router %s not heard from for %gs: unreachable",
                            routers[origin].label, live.timeout)
                self.federation.unreachable(origin, now)
            for origin in [o for o, p in live.links.items() if o not in routers
                           and now - p.last_heard > 3 * live.timeout + 60]:
                live.forget(origin)

    async def _watch_cut_off(self) -> None:
        # The others declare this router dead 1.5 keepalives after it lost the broker (its
        # Last Will); it drops them after as long, so both sides see the same partition.
        # With a grace, the others are held in grace from the loss instead, as they hold
        # this router's members: an outage shorter than the grace changes nothing.
        while True:
            await self._cut.wait()
            self._cut = trio.Event()
            if self.federation.grace > 0:
                if (lost := self._lost_at) is not None and self.state != "connected":
                    self.federation.cut_off(lost)
                continue
            while (lost := self._lost_at) is not None and self.state != "connected":
                deadline = lost + 1.5 * self.keepalive
                if trio.current_time() < deadline:
                    await trio.sleep_until(deadline)
                    continue
                self._lost_at = None
                if self.federation.routers:
                    log.warning("bridge: no broker for %.1fs: dropping the other routers' "
                                "members", 1.5 * self.keepalive)
                    self.federation.cut_off(trio.current_time())

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
            await trio.sleep(until_beat(every))
            n += 1
            if self.state != "connected":
                continue
            self._publish_presence()
            if n % records_every == 0:
                self._publish_records(self.federation.records())
            self.federation.expire(trio.current_time())

    async def _ticker(self) -> None:
        # Graces, ghost checks and moves' holds (Federation.tick), connected or not: only
        # when one is due (next_due); a deadline set meanwhile wakes it (federation.wake).
        fed = self.federation
        while True:
            due = fed.next_due()
            with trio.move_on_at(math.inf if due is None else due) as until:
                await self._tick_due.wait()
            self._tick_due = trio.Event()
            if not until.cancelled_caught:
                continue  # a new deadline: sleep until the first one
            now = trio.current_time()
            fed.tick(now)
            if (due := fed.next_due()) is not None and due <= now:
                await trio.sleep(TICK)  # not cleared by the tick: never a busy loop

    def _mark_dirty(self) -> None:
        self._fed_dirty.set()
