"""In-process routers federated through a real mosquitto on 127.0.0.1, and raw native members
on them, for the federation's socket tests (tests/test_federation_sockets.py and the
test_federation_*.py modules that use a broker): :func:`federation` starts and joins them,
:func:`member` connects a member, :func:`everywhere` waits until every router lists the
same members."""

from __future__ import annotations

from typing import Any

import trio

from gossiprouter.protocol import native as wire
from tests.nclient import NativeClient
from tests.test_bridge import Mosquitto, bridge_of
from tests.test_stub import InProcessRouter, eventually

G = "fed"
# No federation grace: these tests show what happens once a lost router's members go
# (tests/test_federation_outages.py shows the grace).
FED: dict[str, Any] = {"bridge_reconnect_max": 0.3, "bridge_keepalive": 1,
                       "federation_grace": 0}


def table_members(r: InProcessRouter, group: str = G) -> set[bytes]:
    assert r.server is not None
    return {e.addr for e in r.server.hub.table.members(group)}


async def federation(nursery: trio.Nursery, broker: Mosquitto, n: int,
                     **options: Any) -> list[InProcessRouter]:
    opts = {**FED, **options}
    routers = [await InProcessRouter(nursery, bridge=broker.url, router_id=f"r{i}",
                                     **opts).start() for i in range(n)]
    # Each has resynced, and sees the others' presence.
    await eventually(lambda: all(bridge_of(r).federation.synced
                                 and bridge_of(r).federation.live_routers() == n - 1
                                 for r in routers), what="federation up")
    return routers


async def member(r: InProcessRouter, addr: bytes, group: str = G) -> NativeClient:
    assert r.server is not None
    c = await NativeClient.to(r.server)
    assert isinstance(await c.connect(group, addr, addr.decode(), (("10.0.0.1", 7800),)),
                      wire.Ok)
    return c


async def everywhere(routers: list[InProcessRouter], addrs: set[bytes],
                     group: str = G) -> None:
    await eventually(lambda: all(table_members(r, group) == addrs for r in routers),
                     what=f"members {addrs} on every router")


async def events(c: NativeClient, n: int) -> list[tuple[str, bytes]]:
    """The first ``n`` membership events ``c`` receives (suspects are sent after a short
    deferral, so this reads until they are there)."""
    out: list[tuple[str, bytes]] = []
    with trio.fail_after(5):
        while len(out) < n:
            f = await c.recv()
            if isinstance(f, wire.Event):
                out.append((f.kind, f.addr))
    return out


def carriers(r: InProcessRouter, addr: bytes, group: str = G) -> list[str]:
    """The kinds of carrier of ``addr``'s entry on ``r``, in the table's order."""
    assert r.server is not None
    e = r.server.hub.table.entry(group, addr)
    return [] if e is None else [type(c).__name__ for c in e.carriers]


async def routes(c: NativeClient) -> list[wire.Route]:
    """The ROUTE frames ``c`` received before a PING's PONG."""
    return [f for f in await c.round_trip() if isinstance(f, wire.Route)]
