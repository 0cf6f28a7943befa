"""The remote share of the compiled fast path's frames (issue 30): a federated group's local
copies stay on the relay thread, and Python sends only what goes to other routers.

:meth:`gossiprouter.server.fastpath.FastPath.learn_native` teaches the thread a native route
whose receivers include other routers' carriers (:func:`split`) with its local receivers and a
*remote* mark; the thread relays each such frame to them and hands it up as a REMOTE upcall,
which :class:`RemoteShare` sends on through the federation (batched per router there).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gossiprouter.federation.remote import RemoteGroup, RemoteMember, Sender
from gossiprouter.protocol.native_scan import RUN, NativeScanner

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
        # The scanner that cuts them (one, so that its ROUTE header cache lasts).
        self._scanner: NativeScanner | None = None
        # The federations on hold since the last flush (empty: nothing to flush).
        self.held: set[Sender] = set()

    def send(self, data: bytes) -> int:
        """Native ROUTE frames the thread relayed to their local receivers: sent on to the
        other routers, per run, to whom the table resolves now (as Python's own routing of
        them would, :meth:`Session.forward`), and counted delivered as Python counts them
        (the thread counted them routed). The number of frames.

        Each federation sent through is put on hold: what it batched leaves at
        :meth:`flush`, once the caller has handled all the thread's upcalls, instead of
        waking the federation's end-of-tick task for it (one wake-up less per tick)."""
        hub = self.hub
        sc, max_frame = self._scanner, hub.config.max_frame
        if sc is None or sc.max_frame != max_frame:
            sc = self._scanner = NativeScanner(max_frame, relay=True)
        n = 0
        table = hub.table
        held = self.held
        for kind, start, stop, k, head in sc.scan(data):
            if kind != RUN:  # the thread hands up whole frames of learned headers only
                continue
            assert isinstance(head, tuple)
            group, dest, _sender = head
            targets = remote_targets(table, group, dest)
            frames = data[start:stop]
            for t in targets:
                fed = t.fed
                if not fed.holding:
                    fed.holding = True
                    held.add(fed)
                t.push(frames, k)
            hub.counters.delivered += k * len(targets)
            n += k
        self.frames += n
        return n

    def flush(self) -> None:
        """Send what the federations on hold batched (one broker message per destination
        router), and take them off hold."""
        held = self.held
        self.flushes += bool(held)
        while held:
            fed = held.pop()
            fed.holding = False
            fed.flush_routes()
