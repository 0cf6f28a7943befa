"""The routing table and the routing-entry rules: pure data, no trio, no sockets.

Three views of one set of entries, after the JGroups 2.8 GossipRouter design:

* **Membership**: group -> the entries registered in it (:meth:`RoutingTable.members`).
* **ConnectionTable**: (group, addr) -> the live connections ("carriers") that
  registered it, newest last (:attr:`Entry.carriers`); and carrier -> every
  (group, addr) it holds (:meth:`RoutingTable.registrations`).
* **AddressMappings**: (group, addr) -> logical name and physical addresses
  (:attr:`Entry.name`, :attr:`Entry.physical`), for TCPGOSSIP-style discovery.

A *carrier* (:class:`~gossiprouter.routing.entries.Carrier`) is whatever the caller uses
for a connection (a connection's session, an in-process member): the table itself only hashes
and compares it; the hub and the sessions deliver through it. Time comes in as ``now``
(seconds, any monotonic clock), so every rule can be tested without waiting. Operations return
:class:`~gossiprouter.routing.entries.Notice` objects saying which carriers must be told what
(join / leave / suspect); the caller encodes and sends them. What the table stores (entries,
groups, carriers, notices) is in :mod:`gossiprouter.routing.entries`.

The rules, each with its reason and its test, are in ``docs/routing.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gossiprouter.core.topics import TopicId, TopicIndex
from gossiprouter.routing.entries import (
    Carrier,
    Entry,
    Group,
    Kind,
    Limits,
    Notice,
    Physical,
    RemoteCarrier,
    RoutingError,
    Stats,
    carrier_rank,
    fanout_of,
)


class RoutingTable:
    """Membership, ConnectionTable and AddressMappings, with the routing-entry rules.

    Args:
        suspect_events: emit ``suspect`` notices when a member is removed
            without DISCONNECT (JGroups' ``emit_suspect_events``).
        grace: seconds to keep an entry whose last connection closed without
            DISCONNECT (0 = remove at once). Traffic to it is held meanwhile.
        grace_buffer_bytes: bound on the traffic held per entry during grace.
        limits: per-connection registration limits.
    """

    def __init__(
        self,
        *,
        suspect_events: bool = True,
        grace: float = 0.0,
        grace_buffer_bytes: int = 1 << 20,
        limits: Limits | None = None,
    ) -> None:
        self.suspect_events = suspect_events
        self.grace = grace
        self.grace_buffer_bytes = grace_buffer_bytes
        self.limits = limits or Limits()
        self.groups: dict[str, Group] = {}
        self._regs: dict[Carrier, dict[tuple[str, bytes], Entry]] = {}
        self._watching: dict[Carrier, set[str]] = {}
        # carrier -> group -> how many of its registrations are in that group, kept by
        # _link/_unlink so groups_per_connection costs O(1) per CONNECT (rebuilding the set
        # from the registrations made 100,000 CONNECTs on one connection quadratic).
        self._group_regs: dict[Carrier, dict[str, int]] = {}
        # Entries that may have an expiry or a grace end: the reaper looks at these only,
        # not at every entry (with 100,000s of groups a full walk every second stalls routing).
        self._timed: dict[Entry, None] = {}
        self.stats = Stats()
        # Set by the owner (the hub): called with (group, addr, name, physical, wire) before
        # a non-provisioned registration changes anything; raises RoutingError to refuse a
        # value that is too long or that some protocol could not write back.
        self.check: Callable[[str, bytes, str | None, Physical, Any], None] | None = None
        # Told (group, patterns, added) when patterns appear in a group or the last member
        # holding them goes: the federation bridge subscribes upstream to the union.
        self.on_patterns: Callable[[str, list[TopicId], bool], None] | None = None
        # Given (group, sender, id, payload) for every global publication of a local
        # client, after local delivery: the bridge forwards it to the federation.
        self.on_global: Callable[[str, bytes, TopicId, bytes], None] | None = None
        # Called with the group's name before every change of who receives what in it (an
        # entry linked to or unlinked from a connection, removed, put in or taken out of
        # grace): the compiled fast path forgets the routing decisions it repeats for that
        # group (gossiprouter.server.fastpath). Every decision depends on one group only.
        self.changed: Callable[[str], None] = _unchanged
        # Told (group, None) when the entries this router carries itself in ``group`` may have
        # changed, and (group, addr) when such an entry was removed as suspected: the
        # federation republishes the group's local members (gossiprouter.federation.state).
        self.on_local: Callable[[str, bytes | None], None] | None = None
        # Names the federation (broker and prefix) when bridged; announced in WELCOME so a
        # client on several routers of one federation takes global publications from one.
        self.federation: str | None = None

    # ----------------------------------------------------------------- queries

    def group(self, name: str) -> Group | None:
        return self.groups.get(name)

    def entry(self, group: str, addr: bytes) -> Entry | None:
        g = self.groups.get(group)
        return None if g is None else g.entries.get(addr)

    def members(self, group: str) -> list[Entry]:
        """The entries of ``group`` in registration order (empty if unknown)."""
        g = self.groups.get(group)
        return [] if g is None else list(g.entries.values())

    @property
    def watching(self) -> dict[Carrier, set[str]]:
        """carrier -> the groups it watches. Do not mutate."""
        return self._watching

    def registrations(self, carrier: Carrier) -> dict[tuple[str, bytes], Entry]:
        """What ``carrier`` holds: (group, addr) -> entry. Do not mutate."""
        return self._regs.get(carrier, _EMPTY)

    def holds(self, carrier: Carrier, group: str, addr: bytes) -> bool:
        regs = self._regs.get(carrier)
        return regs is not None and (group, addr) in regs

    def resolve_unicast(self, group: str, dest: bytes) -> Entry | None:
        """The entry for ``dest`` in ``group``, or None. Its ``carrier`` may be
        None while it is in reconnect grace: then :meth:`hold` the frame."""
        g = self.groups.get(group)
        return None if g is None else g.entries.get(dest)

    def resolve_multicast(
        self, group: str, sender_carrier: Carrier | None, *, include_sender: bool = False
    ) -> tuple[Carrier, ...]:
        """One target per connection carrying a member of ``group``.

        With ``include_sender`` false the sender's connection is left out when
        the sender is the only member it carries (native semantics); JGroups
        clients expect their own multicasts back (``include_sender=True``).
        """
        g = self.groups.get(group)
        if g is None:
            return ()
        if include_sender or sender_carrier is None:
            return g.targets()
        return g.targets_without(sender_carrier)

    def groups_of(self, carrier: Carrier) -> set[str]:
        """The groups in which ``carrier`` holds at least one registration."""
        return set(self._group_regs.get(carrier, ()))

    # ----------------------------------------------------------------- changes

    def connect(
        self,
        carrier: Carrier | None,
        group: str,
        addr: bytes,
        name: str | None = None,
        physical: Physical = (),
        *,
        kind: Kind = Kind.CONNECTION,
        identity: str | None = None,
        sticky: bool = False,
        expires_at: float | None = None,
        wire: Any = None,
        remote: bool = False,
    ) -> tuple[Entry, list[Notice], list[bytes]]:
        """Register ``addr`` in ``group`` through ``carrier``.

        Returns the entry, the notices to send, and the frames held for the
        entry during reconnect grace, which the caller must now deliver to
        ``carrier`` in order. Raises :class:`RoutingError` (``forbidden``,
        ``address_in_use``, ``limit``, or whatever :attr:`check` raises) when a
        rule refuses it; nothing has changed then.

        With ``remote`` the registration is one another router of the federation made and
        ``carrier`` a :class:`RemoteCarrier`: that router applied the checks, the identity
        rule and the limits already, so only the kinds' precedence applies here.
        """
        if self.check is not None and kind != Kind.PROVISIONED and not remote:
            self.check(group, addr, name, physical, wire)
        g = self.groups.get(group)
        e = None if g is None else g.entries.get(addr)
        regs = None if carrier is None else self._regs.get(carrier)
        if e is not None:
            if e.sticky and kind < e.kind:
                raise RoutingError(
                    "forbidden", f"address is a provisioned (sticky) member of {group!r}"
                )
            if e.kind > kind:
                raise RoutingError(
                    "address_in_use",
                    f"address is registered in {group!r} by a {e.kind.label} member",
                )
            # An entry in reconnect grace has no carriers but still belongs
            # to its identity: another one must not take it (and its held traffic).
            owned = bool(e.carriers) or e.grace_until is not None
            if e.identity != identity and owned and kind == e.kind and not remote:
                raise RoutingError(
                    "address_in_use", f"address is registered in {group!r} by another identity"
                )
        if carrier is not None and not remote and (regs is None or (group, addr) not in regs):
            self._check_limits(carrier, group)
        if g is None and kind == Kind.CONNECTION and not remote:
            self._check_new_group()

        notices: list[Notice] = []
        held: list[bytes] = []
        if g is None:
            g = self.groups[group] = Group(group)
        if e is None or e.kind < kind:
            if e is not None:
                # A higher kind takes the address over: the old carriers lose it.
                for c in list(e.carriers):
                    self._unlink(g, e, c)
                g.entries.pop(addr)
                self._drop_topics(g, e)
            first = e is None
            e = Entry(
                group, addr, name, physical, kind, sticky=sticky, expires_at=expires_at,
                identity=identity, wire=wire,
            )
            g.entries[addr] = e
            if first and g.watchers:
                notices.append(Notice("join", e, g))
        else:
            # Registering again: newest data wins; expiry later wins; sticky if either is.
            if remote and any(not isinstance(c, RemoteCarrier) for c in e.carriers):
                # A router's own registration describes the member; another router's copy
                # of it does not overwrite it (both converge through the records).
                name, physical, identity, wire = e.name, e.physical, e.identity, None
            e.name, e.physical, e.identity = name, physical, identity
            if wire is not None:
                e.wire = wire
            e.sticky = e.sticky or sticky
            if e.expires_at is not None:
                e.expires_at = None if expires_at is None else max(e.expires_at, expires_at)
            if e.grace_until is not None:
                e.grace_until = None
                g.graced.remove(e)
                held, e.held, e.held_bytes = e.held, [], 0
                self.stats.grace_delivered += len(held)
        if carrier is not None and kind != Kind.PROVISIONED:
            self._link(g, e, carrier)
        if e.expires_at is not None:
            self._timed[e] = None
        return e, notices, held

    def disconnect(self, carrier: Carrier, group: str, addr: bytes) -> list[Notice]:
        """A clean leave: the entry goes at once, whichever connection asks.

        Raises ``not_member`` when ``carrier`` did not register it, and
        ``forbidden`` for a sticky (provisioned) entry.
        """
        e = self.entry(group, addr)
        if e is not None and e.sticky:
            raise RoutingError("forbidden", f"address is a provisioned member of {group!r}")
        if e is None or carrier not in e.carriers:
            raise RoutingError("not_member", f"this connection did not register it in {group!r}")
        if isinstance(e.carriers[0], RemoteCarrier):  # remote carriers come first
            # It leaves this router; its connections to other routers are theirs to end (a
            # stub on several routers sends DISCONNECT to each), so the member stays, quietly.
            for c in [c for c in e.carriers if not isinstance(c, RemoteCarrier)]:
                self._unlink(self.groups[group], e, c)
            return []
        return self._remove(e, suspect=False)

    def remove(self, group: str, addr: bytes, *, suspect: bool = False) -> list[Notice]:
        """Remove an entry whatever its kind (embedding API and config reload)."""
        e = self.entry(group, addr)
        return [] if e is None else self._remove(e, suspect=suspect)

    def unlink_remote(self, carrier: RemoteCarrier, group: str, addr: bytes, *,
                      suspect: bool) -> list[Notice]:
        """Another router no longer carries ``addr`` (``carrier`` stands for it there).

        The entry stays while something else carries it (a local connection, a third
        router: rule R5 federation-wide); otherwise it is removed at once, with ``suspect``
        when that router removed it as suspected or died. No grace here: the member's own
        router applied its grace already, and a dead router was awaited for its keepalive.
        """
        c: Carrier = carrier  # type: ignore[assignment]  # every RemoteCarrier is a Carrier
        g = self.groups.get(group)
        e = None if g is None else g.entries.get(addr)
        self._regs.pop(c, None)
        self._group_regs.pop(c, None)
        if g is None or e is None or c not in e.carriers:
            return []
        self._unlink(g, e, c)
        if e.carriers or e.grace_until is not None or e.kind == Kind.PROVISIONED:
            return []
        return self._remove(e, suspect=suspect)

    def drop_carrier(self, carrier: Carrier, now: float) -> list[Notice]:
        """``carrier`` is gone (closed, abruptly or not, without DISCONNECT).

        Every entry it held loses it. An entry that still has another live
        connection stays, unsuspected; one that lost its last connection goes
        into reconnect grace, or is removed with ``suspect`` + ``leave``.
        """
        for grp in self._watching.pop(carrier, ()):
            g = self.groups.get(grp)
            if g is not None:
                g.watchers.remove(carrier)
                self._gc(g)
        regs = self._regs.get(carrier)
        if not regs:
            self._regs.pop(carrier, None)
            self._group_regs.pop(carrier, None)
            return []
        notices: list[Notice] = []
        held = list(regs.values())
        # Unlink everything first, so the dying connection is never told about
        # its own addresses.
        for e in held:
            self._unlink(self.groups[e.group], e, carrier)
        for e in held:
            g = self.groups[e.group]
            if e.carriers or e.kind != Kind.CONNECTION:
                continue
            if self.grace > 0:
                e.grace_until = now + self.grace
                g.graced.append(e)
                self._timed[e] = None
            else:
                notices += self._remove(e, suspect=True)
        self._regs.pop(carrier, None)
        self._group_regs.pop(carrier, None)
        return notices

    def hold(self, e: Entry, frame: bytes) -> bool:
        """Keep ``frame`` for an entry in reconnect grace; False if it was dropped."""
        if e.held_bytes + len(frame) > self.grace_buffer_bytes:
            self.stats.grace_dropped += 1
            return False
        e.held.append(frame)
        e.held_bytes += len(frame)
        return True

    def expire(self, now: float) -> list[Notice]:
        """The reaper: remove non-sticky entries whose expiry or grace has passed."""
        notices: list[Notice] = []
        for e in list(self._timed):
            if not self._is_timed(e):
                continue
            if e.sticky:
                continue
            if e.grace_until is not None and e.grace_until <= now:
                self.stats.grace_dropped += len(e.held)
                notices += self._remove(e, suspect=True)
            elif e.expires_at is not None and e.expires_at <= now:
                self.stats.expired += 1
                notices += self._remove(e, suspect=True)
        return notices

    def next_deadline(self) -> float | None:
        """The earliest expiry or grace end, so the reaper can sleep until then."""
        best: float | None = None
        for e in list(self._timed):
            if not self._is_timed(e):
                continue
            for t in (e.grace_until, None if e.sticky else e.expires_at):
                if t is not None and (best is None or t < best):
                    best = t
        return best

    def _is_timed(self, e: Entry) -> bool:
        """Is ``e`` still in the table with a deadline? If not, it leaves :attr:`_timed`."""
        g = self.groups.get(e.group)
        if (g is not None and g.entries.get(e.addr) is e
                and (e.grace_until is not None or e.expires_at is not None)):
            return True
        del self._timed[e]
        return False

    def watch(self, carrier: Carrier, group: str) -> None:
        """Send ``carrier`` the join/leave notices of ``group``. Raises RoutingError
        ``limit`` beyond watches_per_connection or max_groups; nothing has changed then."""
        g = self.groups.get(group)
        watched = self._watching.get(carrier)
        if g is not None and carrier in g.watchers:
            return
        lim = self.limits.watches_per_connection
        if lim and watched is not None and len(watched) >= lim:
            raise RoutingError("limit", f"at most {lim} watched groups per connection")
        if g is None:
            self._check_new_group()
            g = self.groups[group] = Group(group)
        if carrier not in g.watchers:
            g.watchers.append(carrier)
            self._watching.setdefault(carrier, set()).add(group)

    def unwatch(self, carrier: Carrier, group: str) -> None:
        g = self.groups.get(group)
        if g is not None and carrier in g.watchers:
            g.watchers.remove(carrier)
            self._watching[carrier].discard(group)
            self._gc(g)

    # ----------------------------------------------------------------- topics

    def subscribe(self, carrier: Carrier, group: str, addr: bytes, pat: TopicId) -> bool:
        """Subscribe the entry ``addr`` (registered by ``carrier``) to ``pat``.

        The subscription belongs to the entry: it survives a reconnect within
        the grace, and goes when the entry is removed (leave, expiry, end of
        grace). False if the entry held the pattern already. Raises
        ``not_member`` or ``limit``.
        """
        e = self._own(carrier, group, addr)
        g = self.groups[group]
        idx = g.topics
        if idx is None:
            idx = g.topics = TopicIndex()
        lim = self.limits.subscriptions_per_member
        if lim and pat not in idx.patterns_of(e) and len(idx.patterns_of(e)) >= lim:
            raise RoutingError("limit", f"at most {lim} subscriptions per member")
        if not idx.subscribe(e, pat):
            return False
        if idx.counts[pat] == 1 and self.on_patterns is not None:
            self.on_patterns(group, [pat], True)
        return True

    def unsubscribe(self, carrier: Carrier, group: str, addr: bytes, pat: TopicId) -> bool:
        """Remove ``pat`` from the entry's subscriptions; False if it did not hold it."""
        e = self._own(carrier, group, addr)
        idx = self.groups[group].topics
        if idx is None or not idx.unsubscribe(e, pat):
            return False
        if pat not in idx.counts and self.on_patterns is not None:
            self.on_patterns(group, [pat], False)
        return True

    def topic_targets(self, group: str, tid: TopicId) -> set[Entry]:
        """The entries of ``group`` with a pattern matching ``tid``, once each."""
        g = self.groups.get(group)
        if g is None or g.topics is None:
            return set()
        return g.topics.match(tid)

    def patterns(self) -> dict[str, list[TopicId]]:
        """group -> every pattern some entry holds (the union the bridge subscribes to)."""
        return {name: list(g.topics.counts) for name, g in self.groups.items()
                if g.topics is not None and g.topics.counts}

    def _own(self, carrier: Carrier, group: str, addr: bytes) -> Entry:
        regs = self._regs.get(carrier)
        e = None if regs is None else regs.get((group, addr))
        if e is None:
            raise RoutingError("not_member", f"this connection did not register it in {group!r}")
        return e

    def _drop_topics(self, g: Group, e: Entry) -> None:
        idx = g.topics
        if idx is None:
            return
        gone = idx.remove_member(e)
        if not idx:
            g.topics = None
        if gone and self.on_patterns is not None:
            self.on_patterns(g.name, gone, False)

    # ----------------------------------------------------------------- internals

    def _check_limits(self, carrier: Carrier, group: str) -> None:
        lim = self.limits
        regs = self._regs.get(carrier)
        if not regs:
            return
        if lim.addresses_per_connection and len(regs) >= lim.addresses_per_connection:
            raise RoutingError(
                "limit", f"at most {lim.addresses_per_connection} addresses per connection"
            )
        if lim.groups_per_connection:
            groups = self._group_regs.get(carrier, _NO_GROUPS)
            if group not in groups and len(groups) >= lim.groups_per_connection:
                raise RoutingError(
                    "limit", f"at most {lim.groups_per_connection} groups per connection"
                )

    def _check_new_group(self) -> None:
        cap = self.limits.max_groups
        if cap and len(self.groups) >= cap:
            raise RoutingError("limit", f"at most {cap} groups in the router (max_groups)")

    def _link(self, g: Group, e: Entry, carrier: Carrier) -> None:
        self.changed(g.name)
        g.rev += 1
        old = e.carrier
        carriers = e.carriers
        if carrier in carriers:
            carriers.remove(carrier)
        if isinstance(carrier, RemoteCarrier):
            # Remote routers go before every local connection (a local one always carries
            # the traffic when there is one), ordered by rank so the preferred is the last.
            n = sum(1 for c in carriers if isinstance(c, RemoteCarrier))
            carriers.insert(n, carrier)
            carriers[: n + 1] = sorted(carriers[: n + 1], key=carrier_rank)
        else:
            carriers.append(carrier)
            if self.on_local is not None:
                self.on_local(g.name, None)
        regs = self._regs.setdefault(carrier, {})
        key = (g.name, e.addr)
        if key not in regs:
            counts = self._group_regs.setdefault(carrier, {})
            counts[g.name] = counts.get(g.name, 0) + 1
        regs[key] = e
        self._carrier_changed(g, old, e.carrier)

    def _carrier_changed(self, g: Group, old: Carrier | None, new: Carrier | None) -> None:
        if old is new:
            return
        if old is not None:
            self._unload(g, fanout_of(old))
        if new is not None:
            f = fanout_of(new)
            g.load[f] = g.load.get(f, 0) + 1
        g.invalidate()

    def _unlink(self, g: Group, e: Entry, carrier: Carrier) -> None:
        if carrier not in e.carriers:
            return
        self.changed(g.name)
        g.rev += 1
        old = e.carrier
        e.carriers.remove(carrier)
        regs = self._regs.get(carrier)
        if regs is not None and regs.pop((g.name, e.addr), None) is not None:
            counts = self._group_regs[carrier]
            n = counts[g.name] - 1
            if n:
                counts[g.name] = n
            else:
                del counts[g.name]
        if self.on_local is not None and not isinstance(carrier, RemoteCarrier):
            self.on_local(g.name, None)
        self._carrier_changed(g, old, e.carrier)

    @staticmethod
    def _unload(g: Group, carrier: Carrier) -> None:
        n = g.load[carrier] - 1
        if n:
            g.load[carrier] = n
        else:
            del g.load[carrier]

    def _remove(self, e: Entry, *, suspect: bool) -> list[Notice]:
        self.changed(e.group)
        g = self.groups[e.group]
        g.rev += 1
        for c in list(e.carriers):
            self._unlink(g, e, c)
        if e.grace_until is not None:
            e.grace_until = None
            g.graced.remove(e)
            e.held, e.held_bytes = [], 0
        del g.entries[e.addr]
        self._drop_topics(g, e)
        if self.on_local is not None:
            self.on_local(g.name, e.addr if suspect else None)
        notices: list[Notice] = []
        if suspect and self.suspect_events and g.load:
            notices.append(Notice("suspect", e, g))
        if g.watchers:
            notices.append(Notice("leave", e, g))
        self._gc(g)
        return notices

    def _gc(self, g: Group) -> None:
        if not g.entries and not g.watchers:
            self.groups.pop(g.name, None)


def _unchanged(group: str) -> None:
    pass


_EMPTY: dict[tuple[str, bytes], Entry] = {}
_NO_GROUPS: dict[str, int] = {}
