"""Prometheus metrics, computed at scrape time from the router's own state.

Nothing here runs per frame: a scrape reads the hub's counters (which the
core already keeps as plain integers), takes a snapshot of the connections and
of the routing table (:meth:`RouterCollector.refresh`, through the server's
:class:`~gossiprouter.server.snapshot.RouterView` and :mod:`gossiprouter.server.snapshot`, which
yield to the loop every few thousand items, so a table of 100,000s of groups never holds
the routing loop), and renders the text format with prometheus-client. Labels take
only values from small fixed sets (protocols, frame types, reasons, kinds):
never an address, a group or a peer, so the series count stays bounded
whatever the traffic.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from gossiprouter._version import __version__
from gossiprouter.ops.access import PROTOCOLS
from gossiprouter.protocol.errors import ERROR_CODES
from gossiprouter.server import fastpath, snapshot

if TYPE_CHECKING:
    from gossiprouter.core.config import Config
    from gossiprouter.federation.bridge import Bridge
    from gossiprouter.ops.admin import AdminServer
    from gossiprouter.ops.auth import Authenticator
    from gossiprouter.ops.stats import OpsStats
    from gossiprouter.ops.tls import ServerTLS
    from gossiprouter.routing.entries import Stats
    from gossiprouter.server.snapshot import RouterView

# The label values of closes and refusals (Counters.closed / refused map anything else to
# "other"): every one is always exported, so rate() works from the first scrape.
CODE_LABELS = (*sorted(ERROR_CODES), "other")

_SNAKE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _frame_label(name: str) -> str:
    """Counter key -> label value: ``GetMembers`` -> ``get_members``, ``CONNECT`` -> ``connect``."""
    return _SNAKE.sub("_", name).lower()


class OpsView(Protocol):
    """What the metrics read of the operations layer: its counters and those of its TLS,
    tokens and admin endpoint (None: off). :class:`gossiprouter.ops.runtime.Operations` is
    one; named here so that the metrics need not import the hooks that build them."""

    @property
    def stats(self) -> OpsStats: ...

    @property
    def tls(self) -> ServerTLS | None: ...

    @property
    def auth(self) -> Authenticator | None: ...

    @property
    def admin(self) -> AdminServer | None: ...


class RouterCollector(Collector):
    """Reads one router's state when Prometheus scrapes."""

    def __init__(self, view: RouterView, ops: OpsView) -> None:
        self.view = view
        self.ops = ops
        self.connections = snapshot.ConnectionCensus({}, 0, 0)
        self.membership = snapshot.Membership(0, {}, 0, 0, 0, 0)

    async def refresh(self) -> None:
        """Take the snapshots :meth:`collect` reads (they yield to the loop as they go)."""
        self.view.hub.sync()  # what the compiled fast path relayed, into the counters
        self.connections = await self.view.census()
        self.membership = await snapshot.membership(self.view.hub.table)

    def collect(self) -> Iterator[Metric]:
        ops = self.ops
        hub = self.view.hub
        c = hub.counters
        table = hub.table
        conns, members = self.connections, self.membership

        info = GaugeMetricFamily("gossiprouter_info", "Router version and name.",
                                 labels=["version", "router_id"])
        info.add_metric([__version__, hub.config.name], 1)
        yield info
        yield _settings(hub.config)

        # --- connections (the scrape's snapshot, see refresh)
        by_proto = dict.fromkeys((*PROTOCOLS, "handshake"), 0) | dict(conns.by_protocol)
        g = GaugeMetricFamily("gossiprouter_connections",
                              "Open client connections by protocol ('handshake': not yet known).",
                              labels=["protocol"])
        for proto, n in sorted(by_proto.items()):
            g.add_metric([proto], n)
        yield g
        cm = CounterMetricFamily("gossiprouter_connections_accepted",
                                 "Connections admitted, by protocol.", labels=["protocol"])
        for proto in PROTOCOLS:
            cm.add_metric([proto], ops.stats.accepted.get(proto, 0))
        yield cm
        cm = CounterMetricFamily(
            "gossiprouter_connections_refused",
            "Connections refused by the access policy, by protocol ('any' at accept) and reason "
            "(network: not in the allow-list; disabled: jgroups = false).",
            labels=["protocol", "reason"])
        for (proto, reason), n in sorted(ops.stats.refused.items()):
            cm.add_metric([proto, reason], n)
        yield cm
        yield _counter("gossiprouter_tls_handshake_failures",
                       "TLS handshakes that failed (plain-text clients, bad or missing client "
                       "certificates).", 0 if ops.tls is None else ops.tls.handshake_failures)
        cm = CounterMetricFamily("gossiprouter_auth_failures",
                                 "Native requests refused by authentication: unauthorized (HELLO "
                                 "without a known token), forbidden (group not granted).",
                                 labels=["reason"])
        failures = {} if ops.auth is None else ops.auth.failures
        for reason in ("unauthorized", "forbidden"):
            cm.add_metric([reason], failures.get(reason, 0))
        yield cm
        cm = CounterMetricFamily("gossiprouter_reloads",
                                 "SIGHUP reloads of TLS certificates and the tokens file.",
                                 labels=["what", "result"])
        for (what, result), n in sorted(ops.stats.reloads.items()):
            cm.add_metric([what, result], n)
        yield cm

        # --- membership (the scrape's snapshot, see refresh)
        g = GaugeMetricFamily("gossiprouter_members",
                              "Registered members (routing entries), by kind.", labels=["kind"])
        for kind, n in members.kinds.items():
            g.add_metric([kind], n)
        yield g
        yield GaugeMetricFamily("gossiprouter_groups", "Groups with a member or a watcher.",
                                value=members.groups)
        yield GaugeMetricFamily("gossiprouter_watchers", "WATCH registrations.",
                                value=members.watchers)
        yield GaugeMetricFamily("gossiprouter_grace_entries",
                                "Members in reconnect grace (connection lost, traffic held).",
                                value=members.graced)
        yield GaugeMetricFamily("gossiprouter_grace_held_bytes",
                                "Bytes of traffic held for members in reconnect grace.",
                                value=members.held_bytes)
        yield _counter("gossiprouter_grace_delivered_frames",
                       "Held frames delivered when a member came back within its grace.",
                       table.stats.grace_delivered)
        yield _counter("gossiprouter_expired_members",
                       "Members removed because their registration expired.",
                       table.stats.expired)

        # --- traffic (the core's counters)
        cm = CounterMetricFamily(
            "gossiprouter_frames_in",
            "Frames received, by type (route: ROUTE frames accepted for routing).",
            labels=["type"])
        cm.add_metric(["route"], c.routed)
        for name, n in sorted(c.frames_in.items()):
            if _frame_label(name) != "route":  # a ROUTE seen by the slow path is in c.routed
                cm.add_metric([_frame_label(name)], n)
        yield cm
        cm = CounterMetricFamily(
            "gossiprouter_frames_out",
            "Frames queued for clients, by type (route: copies of routed frames handed to "
            "receivers' queues; event: join/leave/suspect EVENTs, one per receiving "
            "connection).",
            labels=["type"])
        cm.add_metric(["route"], c.delivered)
        cm.add_metric(["event"], c.events_out)
        yield cm
        yield _counter("gossiprouter_fast_path_relayed_frames",
                       "Routed frames (frames_in{type=route}) relayed by the compiled fast "
                       "path's thread without Python; 0 when the fast path is off.",
                       c.fast_relayed)
        yield _counter("gossiprouter_socket_writes",
                       "Writes to client sockets (each carries one or more frames of any type; "
                       "bytes_out / socket_writes shows how well writes are batched).",
                       c.writes)
        yield _counter("gossiprouter_bytes_in", "Bytes received from clients (after TLS).",
                       c.bytes_in)
        yield _counter("gossiprouter_bytes_out", "Bytes written to clients (before TLS).",
                       c.bytes_out)
        drops = dict(c.drops)
        drops["grace_buffer"] = drops.get("grace_buffer", 0) + table.stats.grace_dropped
        for reason in ("slow_consumer", "unknown_destination"):
            drops.setdefault(reason, 0)
        cm = CounterMetricFamily("gossiprouter_drops", "Frames dropped, by reason.",
                                 labels=["reason"])
        for reason, n in sorted(drops.items()):
            cm.add_metric([reason], n)
        yield cm
        dropped_bytes = dict(c.dropped_bytes)
        for reason in ("slow_consumer", "write_timeout"):
            dropped_bytes.setdefault(reason, 0)
        cm = CounterMetricFamily("gossiprouter_dropped_bytes", "Bytes of the frames dropped "
                                 "from receivers' queues, by reason.", labels=["reason"])
        for reason, n in sorted(dropped_bytes.items()):
            cm.add_metric([reason], n)
        yield cm
        yield _counter("gossiprouter_slow_consumer_disconnects",
                       "Connections closed because their outbound queue overflowed.",
                       c.slow_consumer_disconnects)
        yield _counter("gossiprouter_protocol_errors",
                       "Connections closed for a protocol violation.", c.protocol_errors)
        yield _counter("gossiprouter_internal_errors",
                       "Unexpected exceptions (router bugs) contained: each closed the one "
                       "connection it happened on, or was logged by the task it happened in.",
                       c.internal_errors)
        yield _by_code(
            "gossiprouter_connections_closed",
            "Connections the router closed, by reason: the ERROR code it closed with "
            "(handshake_timeout, idle_timeout, slow_consumer, rate_limited, protocol, ...), "
            "'other' for any other reason. Closes by the peer are not counted.",
            "reason", c.closes)
        yield _by_code(
            "gossiprouter_refusals",
            "Requests refused with the connection kept open, by code: native ERRORs "
            "(too_long, limit, forbidden, not_member, ...), JGroups registrations refused.",
            "code", c.refusals)
        # --- hostile clients (issue 12): fairness, budgets, deadlines
        yield _counter("gossiprouter_turns_cut",
                       "Times a connection's reader let others run before finishing what it "
                       "had received (its share of a turn of the loop was used up).",
                       c.turns_cut)
        yield _counter("gossiprouter_throttled_turns",
                       "Times a connection's input was held back because its control budget "
                       "(control_rate, control_burst) was spent.", c.throttled_turns)
        yield _counter("gossiprouter_rate_limited_disconnects",
                       "Connections closed for staying over their control budget "
                       "(ERROR rate_limited).", c.rate_limited)
        yield _counter("gossiprouter_write_timeouts",
                       "Receivers whose socket took nothing for write_timeout with data "
                       "queued (then their slow_consumer_policy applied).", c.write_timeouts)
        yield _counter("gossiprouter_auth_delayed",
                       "Native HELLOs held back after failed authentications from the same "
                       "address.", ops.stats.auth_delayed)
        yield _counter("gossiprouter_admin_unauthorized",
                       "Requests to this endpoint refused for a missing or wrong bearer token.",
                       0 if ops.admin is None else ops.admin.unauthorized)
        yield GaugeMetricFamily("gossiprouter_outbound_queued_bytes",
                                "Bytes queued for all connections (the fast path's included).",
                                value=conns.queued_bytes + c.fast_pending_bytes)
        yield GaugeMetricFamily("gossiprouter_outbound_queued_bytes_max",
                                "Bytes queued for the most backed-up connection.",
                                value=conns.queued_max)
        yield GaugeMetricFamily("gossiprouter_fast_path_threads",
                                "Busy connections the compiled fast path reads on a thread of "
                                "their own now (fast_path_threads at most; 0 when off).",
                                value=c.fast_threads)
        yield GaugeMetricFamily("gossiprouter_partial_frame_bytes",
                                "Bytes reserved by incomplete frames, router-wide (bounded by "
                                "partial_frames_budget beyond preauth_max_frame each; the fast "
                                "path's included).",
                                value=c.partial_bytes + c.fast_partial_bytes)
        yield from topic_metrics(table.stats, members, self.view.bridge)


# (BridgeStats attribute, help): counted as gossiprouter_bridge_<attribute>.
_BRIDGE_COUNTERS: Final = (
    ("forwarded", "Global publications handed to the broker."),
    ("not_forwarded", "Global publications not forwarded: the broker was not connected."),
    ("received", "Publications from the broker delivered locally."),
    ("echo_dropped", "Own publications the broker returned despite No Local (dropped)."),
    ("duplicates_dropped",
     "Extra copies the broker sent for overlapping subscriptions (dropped)."),
    ("malformed", "Broker messages under the prefix that were not publications."),
    ("connects", "Successful broker connections."),
    ("too_large", "Publications from the broker beyond max_frame: never delivered."),
    ("failovers", "Moves to the next broker endpoint (several bridge URLs)."),
    ("queue_full", "Routed messages and publications dropped: bridge_queue_bytes were "
     "waiting for the broker."),
    ("oversized", "Publications, routed messages and records not sent: beyond the broker's "
     "Maximum Packet Size."),
)
# (FederationStats attribute, help): counted as gossiprouter_federation_<attribute>.
_FEDERATION_COUNTERS: Final = (
    ("routers_lost",
     "Routers dropped: Last Will, resync, or this router cut off from the broker."),
    ("routers_left", "Routers that shut down cleanly (their members left, unsuspected)."),
    ("routers_graced",
     "Routers out of reach (Last Will, resync, this router cut off) held in federation_grace."),
    ("routers_revived", "Routers back within their grace (their members never left)."),
    ("resyncs", "Reconciles after a (re)connect to the broker."),
    ("ghosts_removed", "Remote members a resync found gone."),
    ("conflicts", "Remote registrations a local rule refused (e.g. an in-process address)."),
    ("malformed", "Federation messages that could not be read."),
    ("unauthenticated", "Federation messages refused by the federation key (unsigned, badly "
     "signed, or replayed)."),
)


BRIDGE_STATES = ("connected", "connecting", "disconnected", "leaving", "stopped")


def topic_metrics(st: Stats, members: snapshot.Membership,
                  bridge: Bridge | None) -> Iterator[Metric]:
    """Topic multicast and federation bridge metrics (docs/topics.md)."""
    pub = CounterMetricFamily("gossiprouter_topic_publications",
                              "Topic publications received, by origin (client scope, or the "
                              "federation).", labels=["kind"])
    pub.add_metric(["local"], st.published_local)
    pub.add_metric(["global"], st.published_global)
    pub.add_metric(["federation"], st.federated_in)
    yield pub
    yield _counter("gossiprouter_topic_deliveries",
                   "Topic publication copies queued for connections (one per connection).",
                   st.topic_deliveries)
    yield GaugeMetricFamily("gossiprouter_topic_subscriptions",
                            "Topic subscriptions (member, pattern) held.",
                            value=members.subscriptions)
    if bridge is None:
        return
    state = GaugeMetricFamily("gossiprouter_bridge_state",
                              "1 for the bridge's current broker connection state.",
                              labels=["kind"])
    for name in BRIDGE_STATES:
        state.add_metric([name], 1 if bridge.state == name else 0)
    yield state
    b = bridge.stats
    for attr, doc in _BRIDGE_COUNTERS:
        yield _counter(f"gossiprouter_bridge_{attr}", doc, getattr(b, attr))
    yield GaugeMetricFamily("gossiprouter_bridge_queued_bytes",
                            "Bytes waiting for the broker (bounded by bridge_queue_bytes).",
                            value=bridge.queued_bytes())
    yield GaugeMetricFamily("gossiprouter_bridge_subscriptions",
                            "MQTT topic filters subscribed (the union of local patterns).",
                            value=len(bridge.filters))
    yield from federation_metrics(bridge)


def federation_metrics(bridge: Bridge) -> Iterator[Metric]:
    """Federated membership and routing (docs/federation.md)."""
    f = bridge.federation
    s = f.stats
    yield GaugeMetricFamily("gossiprouter_federation_routers",
                            "Other routers of the federation known alive.",
                            value=f.live_routers())
    yield GaugeMetricFamily("gossiprouter_federation_routers_in_grace",
                            "Other routers out of reach whose members are held in grace.",
                            value=f.graced_routers())
    yield GaugeMetricFamily("gossiprouter_federation_remote_members",
                            "Registrations held on other routers, as known here.",
                            value=f.remote_members())
    frames = CounterMetricFamily("gossiprouter_federation_frames",
                                 "Routed frames across routers: sent to other routers, "
                                 "received from them, lost because the broker was not "
                                 "connected or too slow (not_forwarded), received for a "
                                 "member no longer here (undeliverable), or refused: not "
                                 "whole frames of the group's protocol within max_frame, or "
                                 "from a sender the sending router does not carry; handed "
                                 "on to the router a member moved to (handed_on), and "
                                 "handed on here but already delivered (duplicate: "
                                 "dropped).",
                                 labels=["kind"])
    for kind, value in (("out", s.routed_out), ("in", s.routed_in),
                        ("not_forwarded", s.not_forwarded),
                        ("undeliverable", s.undeliverable), ("refused", s.refused),
                        ("handed_on", s.handed_on), ("duplicate", s.duplicates)):
        frames.add_metric([kind], value)
    yield frames
    yield GaugeMetricFamily("gossiprouter_federation_held_frames",
                            "Routed frames held for members that left this router for no "
                            "router known yet (handed on when one is, within 5 s).",
                            value=f.moves.held_frames())
    yield _counter("gossiprouter_federation_deliveries",
                   "Copies of frames from other routers queued for local connections.",
                   s.delivered_in)
    records = CounterMetricFamily("gossiprouter_federation_records",
                                  "Membership records published and applied.", labels=["kind"])
    records.add_metric(["out"], s.records_out)
    records.add_metric(["in"], s.records_in)
    yield records
    for attr, doc in _FEDERATION_COUNTERS:
        yield _counter(f"gossiprouter_federation_{attr}", doc, getattr(s, attr))
    yield from peer_metrics(bridge)


def peer_metrics(bridge: Bridge) -> Iterator[Metric]:
    """Per other router, by origin: reachable, last heard, round trip, and the routed
    messages sent, lost and expired (docs/federation.md, "Partitions between brokers")."""
    f = bridge.federation
    links = [p for o, p in sorted(bridge.liveness.links.items()) if o in f.routers]
    up = GaugeMetricFamily("gossiprouter_federation_peer_up",
                           "1 while the other router is heard from (heartbeats on the "
                           "traffic's path), 0 once silent for federation_peer_timeout.",
                           labels=["peer"])
    heard = GaugeMetricFamily("gossiprouter_federation_peer_last_heard_seconds",
                              "Wall-clock time the other router was last heard from.",
                              labels=["peer"])
    rtt = GaugeMetricFamily("gossiprouter_federation_peer_rtt_seconds",
                            "Round trip to the other router through the brokers (last "
                            "heartbeat echoed).", labels=["peer"])
    msgs = CounterMetricFamily("gossiprouter_federation_peer_messages",
                               "Routed traffic per other router: sent (broker messages, "
                               "each a batch of what one tick routed to it), lost (runs of "
                               "frames: broker not connected or queue full), expired (from "
                               "it, older than federation_frame_age: dropped).",
                               labels=["peer", "kind"])
    for p in links:
        up.add_metric([p.origin], 1 if p.up else 0)
        heard.add_metric([p.origin], p.last_heard_wall)
        if p.rtt is not None:
            rtt.add_metric([p.origin], p.rtt)
        for kind, value in (("sent", p.sent), ("lost", p.lost), ("expired", p.expired)):
            msgs.add_metric([p.origin, kind], value)
    yield from (up, heard, rtt, msgs)

# The settings that change how the router performs: a load test's report shows them
# beside its latency (gossiprouter.loadtest.resources scrapes them).
_SETTINGS: Final = ("dispatcher", "direct_send", "coalesce_writes", "slow_consumer_policy",
                    "jgroups_slow_consumer_policy", "outbound_queue_bytes", "write_timeout",
                    "fast_path_threads", "fast_path_sched")


def _settings(config: Config) -> GaugeMetricFamily:
    def show(v: object) -> str:
        return ("on" if v else "off") if isinstance(v, bool) else f"{v:g}" \
            if isinstance(v, float) else str(v)

    # The fast path as it runs (the option, the environment and the build decide it).
    fast_path = "on" if fastpath.status(config)[0] else "off"
    g = GaugeMetricFamily("gossiprouter_settings_info",
                          "The router's performance settings as it runs (fast_path: whether "
                          "the compiled relay thread is in use).",
                          labels=["fast_path", *_SETTINGS])
    g.add_metric([fast_path, *(show(getattr(config, k)) for k in _SETTINGS)], 1)
    return g


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _by_code(name: str, doc: str, label: str, counts: dict[str, int]) -> CounterMetricFamily:
    """A counter family with one series per ERROR code (CODE_LABELS, a fixed set: a client
    cannot create label values), zero where nothing was counted yet."""
    family = CounterMetricFamily(name, doc, labels=[label])
    for code in CODE_LABELS:
        family.add_metric([code], counts.get(code, 0))
    return family


class Metrics:
    """A registry holding the router collector and the process metrics."""

    def __init__(self, view: RouterView, ops: OpsView) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = RouterCollector(view, ops)
        self.registry.register(self.collector)
        # process_cpu_seconds, resident memory, open fds (Linux; nothing elsewhere).
        ProcessCollector(registry=self.registry)

    async def render(self) -> bytes:
        await self.collector.refresh()
        return generate_latest(self.registry)
