"""The remote share of the compiled fast path's frames (issue 30): a federated group's local
copies stay on the relay thread, and Python sends only what goes to other routers.

:meth:`gossiprouter.server.fastpath.FastPath.learn_native` teaches the thread a native route
whose receivers include other routers' carriers (:func:`split`) with its local receivers and a
*remote* mark; the thread relays each such frame to them and hands it up as a REMOTE upcall,
which :func:`send_remote` sends on through the federation (batched per router there).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gossiprouter.federation.remote import RemoteGroup, RemoteMember
from gossiprouter.protocol.native_scan import RUN, NativeScanner

if TYPE_CHECKING:
    from gossiprouter.routing.entries import Carrier
    from gossiprouter.sessions.base import Hub


def split(targets: Sequence[Carrier]) -> tuple[list[Carrier], bool]:
    """(the local receivers of ``targets``, whether any is on another router)."""
    local = [t for t in targets if not isinstance(t, (RemoteGroup, RemoteMember))]
    return local, len(local) < len(targets)


def send_remote(hub: Hub, scanner: NativeScanner, data: bytes) -> int:
    """Native ROUTE frames the thread relayed to their local receivers (cut by ``scanner``,
    the caller's, so that its header cache lasts): sent on to the other routers, per run, to
    whom the table resolves now (as Python's own routing of them would,
    :meth:`Session.forward`), and counted delivered as Python counts them (the thread counted
    them routed). The number of frames."""
    n = 0
    table = hub.table
    for kind, start, stop, k, head in scanner.scan(data):
        if kind != RUN:  # the thread hands up whole frames of learned headers only
            continue
        assert isinstance(head, tuple)
        group, dest, _sender = head
        targets: list[RemoteGroup | RemoteMember]
        if dest is None:  # the sender is local: no remote target is its own carrier
            targets = [t for t in table.resolve_multicast(group, None)
                       if isinstance(t, RemoteGroup)]
        else:
            e = table.resolve_unicast(group, dest)
            c = None if e is None else e.carrier
            targets = [c] if isinstance(c, RemoteMember) else []
        frames = data[start:stop]
        for t in targets:
            t.push(frames, k)
        hub.counters.delivered += k * len(targets)
        n += k
    return n
