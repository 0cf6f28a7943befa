"""The federation on its bad days (issue 29, "Availability"): a real mosquitto stopped and
started again on the same port, with members on two in-process routers. Each test is bound by
what the routers count and what the members receive, never by how long anything took."""

from __future__ import annotations

from typing import Any

import trio

from gossiprouter.protocol import native as wire
from tests.nclient import NativeClient
from tests.test_bridge import Mosquitto, bridge_of
from tests.test_bridge import broker as broker  # the fixture: mosquitto on a free port
from tests.test_federation_sockets import G, everywhere, federation, member, table_members
from tests.test_stub import InProcessRouter, eventually

# The default grace (tens of seconds): far longer than any outage below.
GRACED: dict[str, Any] = {"federation_grace": 30.0}


def events_in(frames: list[wire.Frame]) -> list[tuple[str, bytes]]:
    return [(f.kind, f.addr) for f in frames if isinstance(f, wire.Event)]


async def traffic_flows(src: NativeClient, src_addr: bytes, dst: InProcessRouter,
                        payload: bytes) -> None:
    """Unicasts from ``src`` to member b on ``dst`` until one crosses (the first ones after a
    reconnect may reach a broker before the other router subscribed again)."""
    fed = bridge_of(dst).federation
    with trio.fail_after(15):
        while True:
            before = fed.stats.routed_in
            await src.send(wire.Route(G, b"b", src_addr, payload))
            with trio.move_on_after(0.3):
                await eventually(lambda b=before: fed.stats.routed_in > b)  # type: ignore[misc]
                return


async def test_a_short_broker_restart_makes_no_member_leave_or_suspected(
        nursery: trio.Nursery, broker: Mosquitto) -> None:
    """Acceptance 4: a 2 s broker restart (SIGTERM: mosquitto publishes every Last Will as it
    stops, then starts again empty). Within the grace, no watcher on either router sees a
    leave, a join or a suspect, the remote members never leave the tables, and a unicast
    crosses again once both routers are back."""
    ra, rb = await federation(nursery, broker, 2, **GRACED)
    a, b = await member(ra, b"a"), await member(rb, b"b")
    wa, wb = await member(ra, b"wa"), await member(rb, b"wb")
    for w in (wa, wb):
        assert isinstance(await w.request(wire.Watch(w.req(), G)), wire.Ok)
    everyone = {b"a", b"b", b"wa", b"wb"}
    await everywhere([ra, rb], everyone)
    for c in (a, b, wa, wb):
        await c.round_trip()  # the joins so far: read and forgotten
    fa, fb = bridge_of(ra).federation, bridge_of(rb).federation
    resyncs = (fa.stats.resyncs, fb.stats.resyncs)

    broker.stop()
    await eventually(lambda: bridge_of(ra).state != "connected"
                     and bridge_of(rb).state != "connected", what="both cut off")
    await trio.sleep(2.0)  # the outage itself (nothing is asserted on how long anything took)
    assert table_members(ra) == table_members(rb) == everyone
    broker.start()
    await eventually(lambda: fa.stats.resyncs > resyncs[0] and fb.stats.resyncs > resyncs[1]
                     and fa.graced_routers() == fb.graced_routers() == 0
                     and fa.live_routers() == fb.live_routers() == 1,
                     timeout=15, what="both back, nobody in grace")
    await traffic_flows(a, b"a", rb, b"after")
    got = [f for f in await b.round_trip() if isinstance(f, wire.Route)]
    assert [r.payload for r in got][-1:] == [b"after"]

    assert table_members(ra) == table_members(rb) == everyone
    for c in (a, b, wa, wb):
        assert events_in(await c.round_trip()) == []
    assert fa.stats.routers_lost == fb.stats.routers_lost == 0
    assert fa.stats.routers_revived >= 1 and fb.stats.routers_revived >= 1
