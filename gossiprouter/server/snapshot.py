"""Read-only snapshots of a running router: what the operations layer (metrics, the admin
view) may know of the connections, their outboxes and the routing table.

Each function walks the live state :data:`BATCH` items at a time with a checkpoint between
batches, so that a snapshot of 100,000s of connections or groups never holds the routing loop
for more than a few milliseconds, and returns frozen dataclasses of plain values: the shape
ops reads is this module's, not the server's or the table's internals, which may change.
Items that change during a walk are counted as found.

:class:`RouterView` is what the server hands its hooks when it starts them
(:meth:`gossiprouter.server.hooks.ServerHooks.serve`): the hub (counters, table statistics,
config), a census of the connections, and the federation bridge.
"""

from __future__ import annotations

import heapq
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import trio

from gossiprouter.routing.entries import Kind, RemoteCarrier
from gossiprouter.routing.table import RoutingTable

if TYPE_CHECKING:
    from gossiprouter.federation.bridge import Bridge
    from gossiprouter.sessions.base import Hub, Session

# Items (connections, groups, members) looked at between two checkpoints of a walk.
BATCH = 2000


class Counted(Protocol):
    """What :func:`census` reads of a connection (the server's
    :class:`~gossiprouter.server.connection.Connection`): its session, None while the
    handshake has not made one."""

    @property
    def session(self) -> Session | None: ...


@dataclass(frozen=True)
class ConnectionCensus:
    """The open connections: how many per protocol (``handshake``: not known yet) and the
    bytes queued for them, in all and for the most backed-up one."""

    by_protocol: Mapping[str, int]
    queued_bytes: int
    queued_max: int


@dataclass(frozen=True)
class Membership:
    """The routing table in numbers."""

    groups: int
    # Registered members (routing entries) by kind label, every kind listed.
    kinds: Mapping[str, int]
    watchers: int
    # Members in reconnect grace, and the bytes held for them.
    graced: int
    held_bytes: int
    # Topic subscriptions (member, pattern) held.
    subscriptions: int


@dataclass(frozen=True)
class GroupSummary:
    name: str
    members: int
    watchers: int


@dataclass(frozen=True)
class GroupPage:
    """Groups by name after a cursor; ``next`` is the cursor of the following page (None:
    this is the last), ``total`` the number of groups."""

    groups: tuple[GroupSummary, ...]
    total: int
    next: str | None


@dataclass(frozen=True)
class CarrierInfo:
    """One connection (or in-process member) registering a member."""

    peer: str
    protocol: str
    # The one that carries the member's traffic now.
    active: bool


@dataclass(frozen=True)
class MemberInfo:
    addr: bytes
    name: str | None
    physical: tuple[tuple[str, int], ...]
    kind: str
    sticky: bool
    identity: str | None
    # Registration order.
    connections: tuple[CarrierInfo, ...]
    # Seconds from the snapshot's ``now``; None: no expiry, not in grace.
    expires_in: float | None
    grace_remaining: float | None
    held_bytes: int


@dataclass(frozen=True)
class MemberPage:
    """Members ``offset`` to ``offset + len(members)`` of a group, in registration order;
    ``next_offset`` is None on the last page."""

    name: str
    watchers: int
    total: int
    offset: int
    members: tuple[MemberInfo, ...]
    next_offset: int | None


@dataclass(frozen=True)
class RouterView:
    """What a running server shows the layer around it (ops' metrics and admin view)."""

    hub: Hub
    census: Callable[[], Awaitable[ConnectionCensus]]
    bridge: Bridge | None


async def census(connections: Collection[Counted]) -> ConnectionCensus:
    """Count ``connections`` (copied first, at C speed) by protocol, with their queues."""
    conns = list(connections)
    by_protocol: dict[str, int] = {}
    queued = queued_max = 0
    for i in range(0, len(conns), BATCH):
        for conn in conns[i : i + BATCH]:
            s = conn.session
            proto = "handshake" if s is None else s.protocol
            by_protocol[proto] = by_protocol.get(proto, 0) + 1
            if s is not None:
                n = s.outbox.nbytes
                queued += n
                queued_max = max(queued_max, n)
        await trio.lowlevel.checkpoint()
    return ConnectionCensus(by_protocol, queued, queued_max)


async def membership(table: RoutingTable) -> Membership:
    """Count the table's members by kind, its watchers, graces and topic subscriptions."""
    groups = list(table.groups.values())
    # "remote": carried only by other routers of the federation (a local carrier, when there
    # is one, is always the entry's last), so the routers' counts add up to the members.
    kinds = {k.label: 0 for k in Kind} | {"remote": 0}
    watchers = graced = held_bytes = subscriptions = 0
    for i in range(0, len(groups), BATCH):
        for g in groups[i : i + BATCH]:
            watchers += len(g.watchers)
            for e in g.entries.values():
                cs = e.carriers
                kinds["remote" if cs and isinstance(cs[-1], RemoteCarrier)
                      else e.kind.label] += 1
            for e in g.graced:
                graced += 1
                held_bytes += e.held_bytes
            if g.topics is not None:
                subscriptions += len(g.topics)
        await trio.lowlevel.checkpoint()
    return Membership(len(groups), kinds, watchers, graced, held_bytes, subscriptions)


async def group_page(table: RoutingTable, after: str, limit: int) -> GroupPage:
    """The first ``limit`` groups whose name sorts after ``after``.

    The names are copied (at C speed) and scanned BATCH at a time, keeping the ``limit``
    smallest, with a checkpoint between batches: the loop is never held for long, whatever
    the number of groups. Groups created or removed meanwhile may or may not be listed.
    """
    names = list(table.groups)
    best: list[str] = []
    beyond = 0  # names after the cursor: is there a next page?
    for i in range(0, len(names), BATCH):
        fresh = [n for n in names[i : i + BATCH] if n > after]
        beyond += len(fresh)
        if fresh:
            best = heapq.nsmallest(limit, best + fresh)
        await trio.lowlevel.checkpoint()
    out = []
    for n in best:
        g = table.groups.get(n)
        if g is not None:
            out.append(GroupSummary(n, len(g.entries), len(g.watchers)))
    return GroupPage(tuple(out), len(names),
                     best[-1] if beyond > limit and best else None)


async def member_page(table: RoutingTable, name: str, now: float, offset: int,
                      limit: int) -> MemberPage | None:
    """Members ``offset`` to ``offset + limit`` of group ``name``, or None for no such
    group; times (``expires_in``, ``grace_remaining``) are counted from ``now``."""
    g = table.group(name)
    if g is None:
        return None
    entries = list(g.entries.values())[offset : offset + limit]
    total = len(g.entries)
    members: list[MemberInfo] = []
    for i in range(0, len(entries), BATCH):
        for e in entries[i : i + BATCH]:
            active = e.carrier
            members.append(MemberInfo(
                addr=e.addr, name=e.name, physical=tuple(e.physical), kind=e.kind.label,
                sticky=e.sticky, identity=e.identity,
                connections=tuple(CarrierInfo(c.peer, c.protocol, c is active)
                                  for c in e.carriers),
                expires_in=None if e.expires_at is None else max(e.expires_at - now, 0.0),
                grace_remaining=(None if e.grace_until is None
                                 else max(e.grace_until - now, 0.0)),
                held_bytes=e.held_bytes))
        await trio.lowlevel.checkpoint()
    end = offset + len(entries)
    return MemberPage(g.name, len(g.watchers), total, offset, tuple(members),
                      end if end < total else None)
