"""A real JGroups 2.12 cluster (Debian's jar) whose members use two federated routers
(docs/federation.md): member A registers with router ra only, member B with rb only, and the
routers are federated through a mosquitto on 127.0.0.1. With TUNNEL every message crosses the
broker; with TCPGOSSIP only discovery does (GOSSIP_GET answers list the other router's
members with their physical addresses) and the members then talk over TCP.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from tests.test_bridge import MOSQUITTO, Mosquitto

from .conftest import GOSSIPROUTER_ONLY
from .exchange import assert_ring_traffic_exact, send_ring_traffic, wait_ring_traffic
from .harness import (
    ROUTER_GOSSIPROUTER,
    NodeFactory,
    Router,
    describe_views,
    free_port,
    wait_for_view,
)

pytestmark = [pytest.mark.interop, pytest.mark.slow, getattr(pytest.mark, GOSSIPROUTER_ONLY)]

JOIN_TIMEOUT = 45.0
COUNT = 50


OUTAGE = 10.0  # seconds the broker is down: the scenario, never asserted on


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    """A real mosquitto on a free 127.0.0.1 port (stopped after the test)."""
    if not shutil.which(MOSQUITTO):
        pytest.fail("mosquitto is not installed (scripts/setup installs it)")
    b = Mosquitto(tmp_path)
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def federated(tmp_path: Path, broker: Mosquitto) -> Iterator[tuple[Router, Router]]:
    routers = [Router(ROUTER_GOSSIPROUTER, free_port(), tmp_path,
                      ["--bridge", broker.url, "--bridge-keepalive", "1", "--router-id", name],
                      name=name) for name in ("ra", "rb")]
    try:
        for r in routers:
            r.start()
        yield routers[0], routers[1]
    finally:
        for r in routers:
            r.stop()


@pytest.mark.parametrize("stack", ["tunnel", "tcpgossip"])
async def test_one_view_across_two_federated_routers(
        java_classes: Path, federated: tuple[Router, Router], tmp_path: Path, stack: str) -> None:
    ra, rb = federated
    nodes = NodeFactory(ra, tmp_path)
    try:
        members = (nodes.start(["A"], f"fed-{stack}", stack, routers=[ra])
                   + nodes.start(["B"], f"fed-{stack}", stack, routers=[rb]))
        await wait_for_view(members, ["A", "B"], JOIN_TIMEOUT, ra)
        a, b = members
        # Each multicasts, and unicasts to the other (its successor round a ring of two).
        send_ring_traffic(members, COUNT)
        await wait_ring_traffic(members, COUNT, 40, "messages: ")
        assert_ring_traffic_exact(members, COUNT)
        assert a.errors() == b.errors() == []
    finally:
        nodes.close()


async def test_one_view_across_a_10s_broker_outage(
        java_classes: Path, federated: tuple[Router, Router], broker: Mosquitto,
        tmp_path: Path) -> None:
    """A on ra, B on rb, TUNNEL (every message crosses the broker), FD_ALL suspecting after
    30 s: the broker process is stopped for 10 s and started again on the same port. Both
    routers hold the other's member in grace (default federation_grace), so no member is
    told of a SUSPECT or a leave: neither member prints a new view, and afterwards traffic
    crosses again, every message exactly once (JGroups retransmits what the outage lost).
    With --federation-grace 0 the view splits and stays split (checked by hand)."""
    ra, rb = federated
    nodes = NodeFactory(ra, tmp_path)
    try:
        members = (nodes.start(["A"], "fed-outage", "tunnel-fd30", routers=[ra])
                   + nodes.start(["B"], "fed-outage", "tunnel-fd30", routers=[rb]))
        await wait_for_view(members, ["A", "B"], JOIN_TIMEOUT, ra)
        views = [m.views for m in members]
        broker.stop()
        await trio.sleep(OUTAGE)
        broker.start()  # the same port: the routers reconnect by themselves
        send_ring_traffic(members, COUNT)
        await wait_ring_traffic(members, COUNT, 60, "messages after the outage: ")
        assert_ring_traffic_exact(members, COUNT)
        assert [m.views for m in members] == views, describe_views(members)
        assert all(m.alive for m in members) and [m.errors() for m in members] == [[], []]
        for r in (ra, rb):  # the outage was seen, and ended within the grace
            assert "back within its grace" in r.logs(), r.logs()
    finally:
        nodes.close()
