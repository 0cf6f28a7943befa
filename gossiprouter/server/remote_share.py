"""The remote share of the compiled fast path's frames (issue 30): a federated group's local
copies stay on the relay thread, and Python sends only what goes to other routers.

:meth:`gossiprouter.server.fastpath.FastPath.learn_native` (and ``learn_jgroups``) teaches the
thread a route whose receivers include other routers' carriers (:func:`split`) with its local
receivers and a *remote* mark; the thread relays each such frame to them and hands it up as
received, as a REMOTE upcall (REMOTE_J5 for a 5.x connection's, REMOTE_J2 for a 2.12
connection's), which :class:`RemoteShare` sends on through the federation (batched per router
there; 2.12 frames re-wrapped first, as every receiver gets them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gossiprouter.federation.remote import RemoteGroup, RemoteMember, Sender
from gossiprouter.protocol.jgroups2_scan import Route as J2Route
from gossiprouter.protocol.jgroups2_scan import Scanner as J2Scanner
from gossiprouter.protocol.jgroups5_scan import Route as J5Route
from gossiprouter.protocol.jgroups5_scan import Scanner as J5Scanner
from gossiprouter.protocol.native_scan import RUN, NativeScanner
from gossiprouter.sessions.jgroups2 import JGroups2Session
from gossiprouter.sessions.jgroups5 import JGroups5Session

if TYPE_CHECKING:
    from gossiprouter.routing.entries import Carrier
    from gossiprouter.routing.table import RoutingTable
    from gossiprouter.sessions.base import Hub


def remote_targets(table: RoutingTable, group: str, dest: bytes | None
                   ) -> list[RemoteGroup | RemoteMember]:
    """The other routers a frame of the relay thread's to ``dest`` of ``group`` (None: the
    group, from a local sender) goes to now, as Python's own routing of it would send it
    (:meth:`Session.forward`): the routers carrying members of the group, or the router
    carrying the member (none when a local connection carries it)."""
    if dest is None:  # the sender is local: no remote target is its own carrier
        return [t for t in table.resolve_multicast(group, None) if isinstance(t, RemoteGroup)]
    e = table.resolve_unicast(group, dest)
    c = None if e is None else e.carrier
    return [c] if isinstance(c, RemoteMember) else []


def split(targets: Sequence[Carrier]) -> tuple[list[Carrier], bool]:
    """(the local receivers of ``targets``, whether any is on another router)."""
    local = [t for t in targets if not isinstance(t, (RemoteGroup, RemoteMember))]
    return local, len(local) < len(targets)


class RemoteShare:
    """The compiled fast path's REMOTE upcalls (one per FastPath): :meth:`send` for each,
    then :meth:`flush` once the batch of upcalls is handled."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.frames = 0  # frames whose remote share was sent on (tests, profiles)
        self.flushes = 0  # batches of upcalls whose remote share was sent at their end
        # The scanners that cut them (one each, so that their header caches last).
        self._scanner: NativeScanner | None = None
        self._jgroups: dict[str, J5Scanner | J2Scanner] = {}  # by group prefix
        # The federations on hold since the last flush (empty: nothing to flush).
        self.held: set[Sender] = set()

    def send(self, data: bytes) -> int:
        """Native ROUTE frames the thread relayed to their local receivers (REMOTE): sent on
        to the other routers, per run, to whom the table resolves now (as Python's own routing
        of them would, :meth:`Session.forward`), and counted delivered as Python counts them
        (the thread counted them routed). The number of frames.

        Each federation sent through is put on hold: what it batched leaves at
        :meth:`flush`, once the caller has handled all the thread's upcalls, instead of
        waking the federation's end-of-tick task for it (one wake-up less per tick)."""
        max_frame = self.hub.config.max_frame
        sc = self._scanner
        if sc is None or sc.max_frame != max_frame:
            sc = self._scanner = NativeScanner(max_frame, relay=True)
        n = 0
        for kind, start, stop, k, head in sc.scan(data):
            if kind != RUN:  # the thread hands up whole frames of learned headers only
                continue
            assert isinstance(head, tuple)
            n += self._push(head[0], head[1], data[start:stop], k)
        self.frames += n
        return n

    def send_j5(self, data: bytes) -> int:
        """The same for MESSAGE frames of a JGroups 5.x connection (REMOTE_J5), as received:
        the other routers get them as :meth:`JGroupsSession.route` sends them there."""
        return self._send_runs(self._scanner_of(J5Scanner, JGroups5Session.prefix), data)

    def send_j2(self, data: bytes) -> int:
        """The same for MESSAGEs of a JGroups 2.12 connection (REMOTE_J2), as received: cut
        and re-wrapped by the 2.12 scanner, as the session re-wraps them for every receiver."""
        return self._send_runs(self._scanner_of(J2Scanner, JGroups2Session.prefix), data)

    def _scanner_of(self, cls: type[J5Scanner] | type[J2Scanner], prefix: str
                    ) -> J5Scanner | J2Scanner:
        """The scanner of a JGroups family (one each, so that its header cache lasts), within
        the larger bound of a frame: the frames passed their connection's own."""
        config = self.hub.config
        max_frame = max(config.max_frame, config.jgroups_max_frame)
        sc = self._jgroups.get(prefix)
        if sc is None or sc.max_frame != max_frame:
            sc = self._jgroups[prefix] = cls(prefix, max_frame)
        return sc

    def _send_runs(self, sc: J5Scanner | J2Scanner, data: bytes) -> int:
        n = 0

        def run(head: J5Route | J2Route, frames: bytes, count: int) -> bool:
            nonlocal n
            n += self._push(head[1], head[2], frames, count)
            return False

        for _item in sc.scan(data, run):  # the thread hands up whole MESSAGE runs only
            pass
        self.frames += n
        return n

    def _push(self, group: str, dest: bytes | None, frames: bytes, k: int) -> int:
        targets = remote_targets(self.hub.table, group, dest)
        held = self.held
        for t in targets:
            fed = t.fed
            if not fed.holding:
                fed.holding = True
                held.add(fed)
            t.push(frames, k)
        self.hub.counters.delivered += k * len(targets)
        return k

    def flush(self) -> None:
        """Send what the federations on hold batched (one broker message per destination
        router), and take them off hold."""
        held = self.held
        self.flushes += bool(held)
        while held:
            fed = held.pop()
            fed.holding = False
            fed.flush_routes()
