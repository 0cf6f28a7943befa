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

from tests.test_bridge import MOSQUITTO, Mosquitto

from .conftest import GOSSIPROUTER_ONLY
from .exchange import assert_ring_traffic_exact, send_ring_traffic, wait_ring_traffic
from .harness import (
    ROUTER_GOSSIPROUTER,
    NodeFactory,
    Router,
    free_port,
    wait_for_view,
)

pytestmark = [pytest.mark.interop, pytest.mark.slow, getattr(pytest.mark, GOSSIPROUTER_ONLY)]

JOIN_TIMEOUT = 45.0
COUNT = 50


@pytest.fixture
def federated(tmp_path: Path) -> Iterator[tuple[Router, Router]]:
    if not shutil.which(MOSQUITTO):
        pytest.fail("mosquitto is not installed (scripts/setup installs it)")
    broker = Mosquitto(tmp_path)
    broker.start()
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
        broker.stop()


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
