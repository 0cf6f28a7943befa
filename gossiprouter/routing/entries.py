"""What the routing table stores: plain data, no trio, no sockets.

An :class:`Entry` is one member, one per (group, addr), of a :class:`Kind`; a :class:`Group`
holds the entries of one group, with its fan-out targets cached. A *carrier* is whatever the
caller uses for a connection (a connection's session, an in-process member, another router of
the federation): anything that implements :class:`Carrier`. The table's operations refuse
with :class:`RoutingError` and return :class:`Notice` objects saying who must be told what;
:class:`Limits` and :class:`Stats` are the table's bounds and counters. The table and its
rules are in :mod:`gossiprouter.routing.table`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, ClassVar, Protocol

from gossiprouter.core.topics import TopicIndex

Physical = tuple[tuple[str, int], ...]

# Group-name prefixes of the JGroups protocol families. Their payloads are
# not interchangeable, so each family routes only inside its own namespace.
RESERVED_PREFIXES = ("jgroups2:", "jgroups5:")


class Kind(IntEnum):
    """Entry kinds, in order of precedence (a higher kind is never taken over)."""

    CONNECTION = 1
    PROVISIONED = 2
    IN_PROCESS = 3

    @property
    def label(self) -> str:
        return {1: "connection", 2: "provisioned", 3: "in-process"}[self.value]


class Queue(Protocol):
    """A carrier's outbound queue, as the hot loops see it."""

    def push(self, data: bytes) -> bool:
        """Queue ``data`` (whole frames) as it is; False when it does not fit, and then the
        carrier's own :meth:`Carrier.push` decides (slow-consumer policy)."""
        ...


class Carrier(Protocol):
    """What the routing table, the hub and the sessions need of whatever carries an
    entry's traffic: a connection's session (sessions/base.py) or an in-process member
    (router.py). The table only hashes it; a Protocol costs nothing at run time."""

    #: The protocol's name, for logs and the admin API ("native", "jgroups5", "in-process").
    protocol: ClassVar[str]
    #: How membership events reach this carrier: False = as frames, encoded once per
    #: class by :meth:`event_frame` for every receiver of that class and queued with
    #: :meth:`push`; True = one :meth:`notify` call per event (no wire form to share).
    events_by_call: ClassVar[bool]

    @property
    def peer(self) -> str:
        """Who is at the other end, for logs and the admin API."""
        ...

    @property
    def outbox(self) -> Queue:
        """The fast path of :meth:`push`, used by the per-run routing loops."""
        ...

    def push(self, data: bytes, count: int = 1) -> None:
        """Deliver ``count`` routed frames (``data``, in this carrier's wire form)."""
        ...

    @classmethod
    def event_frame(cls, kind: str, entry: Entry) -> bytes | None:
        """The wire form of "``entry`` joined / left / is suspected", or None."""
        ...

    def notify(self, kind: str, entry: Entry) -> None:
        """Tell this carrier that ``entry`` joined / left / is suspected."""
        ...


class RemoteCarrier:
    """Base of the carriers that stand for another router of the federation
    (``gossiprouter.federation.remote.RemoteMember``), so the table can order them and count them
    per router in the fan-out without importing the federation.

    ``fanout`` is the carrier that counts as this one's target in :attr:`Group.load` (one per
    remote router and group, so a multicast goes once to each router); ``live`` is False
    while the member is held there only in reconnect grace; ``router`` is that router's id;
    ``newcomer``: the member connected there while another router carried it (a move's new
    router, docs/federation.md "Lossless moves"). An entry's remote carriers come before its
    local ones, the preferred last: live first, then not a newcomer, then the smallest
    router id (:func:`carrier_rank`).
    """

    __slots__ = ()
    fanout: Carrier
    live: bool
    router: str
    newcomer: bool = False


def fanout_of(c: Carrier) -> Carrier:
    """The carrier that counts as ``c``'s target in :attr:`Group.load`."""
    return c.fanout if isinstance(c, RemoteCarrier) else c


def carrier_rank(c: Carrier) -> tuple[bool, bool, _Desc]:
    """The order of an entry's remote carriers (:class:`RemoteCarrier`), the preferred last."""
    assert isinstance(c, RemoteCarrier)
    return (c.live, not c.newcomer, _Desc(c.router))


class _Desc(str):
    """A string that sorts backwards: the smallest router id is the greatest rank."""

    __slots__ = ()

    def __lt__(self, other: str) -> bool:
        return str.__gt__(self, other)


class RoutingError(Exception):
    """A refused operation; ``code`` is the native ERROR code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(eq=False, slots=True)
class Entry:
    """One routing entry: one per (group, addr)."""

    group: str
    addr: bytes
    name: str | None
    physical: Physical
    kind: Kind
    sticky: bool = False
    expires_at: float | None = None
    carriers: list[Carrier] = field(default_factory=list)
    identity: str | None = None
    # Reconnect grace: set while the entry has lost its last carrier but is kept.
    grace_until: float | None = None
    held: list[bytes] = field(default_factory=list)
    held_bytes: int = 0
    # Protocol-specific data (e.g. the exact JGroups address encoding) kept
    # so member lists can be answered in the registering protocol's terms.
    wire: Any = None

    @property
    def carrier(self) -> Carrier | None:
        """The connection that carries this entry's traffic now (the newest live one)."""
        return self.carriers[-1] if self.carriers else None


@dataclass(frozen=True, slots=True)
class Notice:
    """``entry`` joined / left / is suspected in ``group``.

    Who must be told (every connection carrying a member for a suspect, every
    watcher for a join or leave) is read when the notice is delivered
    (``Hub.flush_notices``), not stored: a burst of removals would otherwise keep
    one tuple of every member per removal, N² memory for N members dropping at once.
    """

    kind: str
    entry: Entry
    group: Group


@dataclass
class Group:
    """The entries of one group, with the fan-out targets cached."""

    name: str
    entries: dict[bytes, Entry] = field(default_factory=dict)
    watchers: list[Carrier] = field(default_factory=list)
    # carrier -> how many entries of this group it currently carries
    load: dict[Carrier, int] = field(default_factory=dict)
    graced: list[Entry] = field(default_factory=list)
    # Topic subscriptions of this group's entries (None until the first SUBSCRIBE).
    topics: TopicIndex[Entry] | None = None
    _targets: tuple[Carrier, ...] | None = None
    _targets_without: dict[Carrier, tuple[Carrier, ...]] = field(default_factory=dict)
    # Bumped by every change of an entry's carriers or of the entries: what is computed from
    # them (the federation's receivers of a router's multicast) is cached against it.
    rev: int = 0

    def invalidate(self) -> None:
        self._targets = None
        self._targets_without.clear()

    def targets(self) -> tuple[Carrier, ...]:
        """Every connection that carries at least one member: one copy each."""
        t = self._targets
        if t is None:
            t = self._targets = tuple(self.load)
        return t

    def targets_without(self, carrier: Carrier) -> tuple[Carrier, ...]:
        """Fan-out targets for a multicast from a member carried by ``carrier``.

        ``carrier`` is left out only when the sender is the only member it
        carries in this group: a connection shared by several local channels
        of the group (shared transport) still needs its copy.
        """
        t = self._targets_without.get(carrier)
        if t is None:
            if self.load.get(carrier) == 1:
                t = tuple(c for c in self.load if c is not carrier)
            else:
                t = self.targets()
            self._targets_without[carrier] = t
        return t


@dataclass
class Limits:
    """Registration limits (0 = unlimited): per connection, and router-wide on groups."""

    addresses_per_connection: int = 0
    groups_per_connection: int = 0
    watches_per_connection: int = 0
    # Groups in the table (with a member or a watcher); entries of other kinds than
    # CONNECTION (provisioned, in-process) are not refused.
    max_groups: int = 0
    subscriptions_per_member: int = 0


@dataclass
class Stats:
    """Counters the table keeps for metrics."""

    grace_delivered: int = 0
    grace_dropped: int = 0
    expired: int = 0
    # Topic multicast: publications received from clients (by scope) and from the
    # federation, and the copies queued for subscribers' connections.
    published_local: int = 0
    published_global: int = 0
    federated_in: int = 0
    topic_deliveries: int = 0


def is_reserved(group: str) -> bool:
    """True for the JGroups namespaces, which native clients may only list and watch."""
    return group.startswith(RESERVED_PREFIXES)
