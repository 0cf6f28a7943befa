"""The multi-broker deployment in small (issue 22, acceptance 3): two mosquitto brokers on
free ports of 127.0.0.1 joined by a mosquitto bridge (a ``connection`` section carrying the
federation's prefix both ways, ``gossiprouter.loadtest.processes.mosquitto_config``), and
each router bridged to its own broker. What crosses from one router to the other goes
router -> broker A -> bridge -> broker B -> router, and must arrive exactly as through one
broker: once, with its sender, nothing looped back."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from gossiprouter.federation.bridge import Bridge
from gossiprouter.loadtest.processes import MOSQUITTO
from gossiprouter.stub import Publication, RouterStub
from tests.procs import BrokerProcess, RouterProcess, wait_bridged
from tests.test_stub import FAST, InProcessRouter, drain, eventually

TOPIC = ("vehicle-17", "position", ["eu", "de"])


@pytest.fixture(scope="module")
def bridged_brokers(tmp_path_factory: pytest.TempPathFactory
                    ) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    """Broker A, and broker B bridged to A; yielded once the bridge carries both ways. One
    pair for the module (the bridge takes seconds to come up); each test has its own group,
    and the routers of earlier tests are gone, their retained records inert."""
    if not shutil.which(MOSQUITTO):
        pytest.fail("mosquitto is not installed (scripts/setup installs it)")
    tmp = tmp_path_factory.mktemp("brokers")
    with BrokerProcess(tmp) as a, BrokerProcess(tmp, bridge_to=a.port) as b:
        wait_bridged(a, b)
        yield a, b


def bridge_of(r: InProcessRouter) -> Bridge:
    """``r``'s bridge, its counters up to date with what the relay thread published for it
    (Hub.sync, as the operations layer reads them)."""
    assert r.server is not None and r.server.bridge is not None
    r.server.hub.sync()
    return r.server.bridge


async def routers_on(nursery: trio.Nursery, *brokers: BrokerProcess) -> list[InProcessRouter]:
    """One in-process router bridged to each broker, once every bridge is connected."""
    routers = [await InProcessRouter(nursery, bridge=b.url, bridge_reconnect_max=0.3,
                                     federation_grace=0).start()
               for b in brokers]
    await eventually(lambda: all(bridge_of(r).state == "connected" for r in routers),
                     what="bridges connected")
    return routers


async def test_topic_federation_crosses_the_broker_bridge_once_each_way(
        nursery: trio.Nursery, bridged_brokers: tuple[BrokerProcess, BrokerProcess]) -> None:
    ra, rb = await routers_on(nursery, *bridged_brokers)
    async with RouterStub([ra.address], **FAST) as sa, RouterStub([rb.address], **FAST) as sb:
        on_a, on_b = await sa.connect("fleet", b"A"), await sb.connect("fleet", b"B")
        await on_a.subscribe("vehicle-17", "position", ["eu", "*"])
        await on_b.subscribe("vehicle-17", "+", ["eu", "+"])
        # Each router's SUBSCRIBE goes to its own broker, then over the bridge: wait until
        # a publication from the other side arrives, rather than for the SUBACKs only.
        await eventually(lambda: bridge_of(ra).stats.subacks > 0
                         and bridge_of(rb).stats.subacks > 0, what="SUBACK")
        with trio.fail_after(10):
            while True:
                await on_a.publish(TOPIC, b"warm-up", scope="global")
                with trio.move_on_after(0.2):
                    await on_b.receive()
                    break
        await drain(on_b, 0.3)
        base_a, base_b = bridge_of(ra).stats.forwarded, bridge_of(rb).stats.received

        await on_a.publish(TOPIC, b"a->b", scope="global")
        await on_b.publish(TOPIC, b"b->a", scope="global")
        with trio.fail_after(5):
            got_b = await on_b.receive()
            got_a = await on_a.receive()
        assert isinstance(got_b, Publication) and isinstance(got_a, Publication)
        assert (got_b.payload, got_b.sender, got_b.scope) == (b"a->b", b"A", "global")
        assert (got_a.payload, got_a.sender, got_a.scope) == (b"b->a", b"B", "global")
        # Once: nothing more within the brokers' round trip, and nothing looped back over
        # the bridge to its origin (the echo counter would say so).
        assert await drain(on_a, 0.5) == [] and await drain(on_b, 0) == []
        a, b = bridge_of(ra), bridge_of(rb)
        assert (a.stats.forwarded - base_a, b.stats.received - base_b) == (1, 1)
        assert (a.stats.echo_dropped, b.stats.echo_dropped) == (0, 0)
        assert (a.stats.duplicates_dropped, b.stats.duplicates_dropped) == (0, 0)


async def test_a_native_group_spans_routers_on_two_bridged_brokers(
        nursery: trio.Nursery, bridged_brokers: tuple[BrokerProcess, BrokerProcess]) -> None:
    """Members on router A (broker A) and router B (broker B) form one group: each router
    lists both, a unicast and a multicast each way arrive once, and a leave on B reaches A.
    The membership (retained records) and the traffic both cross the mosquitto bridge."""
    ra, rb = await routers_on(nursery, *bridged_brokers)
    async with RouterStub([ra.address], **FAST) as sa, RouterStub([rb.address], **FAST) as sb:
        a = await sa.connect("native", b"a", name="A")
        b = await sb.connect("native", b"b", name="B")
        b2 = await sb.connect("native", b"b2", name="B2")
        want = {b"a", b"b", b"b2"}
        with trio.fail_after(10):
            while not ({m.addr for m in await sa.members("native")} == want
                       and {m.addr for m in await sb.members("native")} == want):
                await trio.sleep(0.02)
        assert {m.addr: m.name for m in await sa.members("native")}[b"b"] == "B"

        await a.send(b"a->b", dest=b"b")
        await b.send(b"b->a", dest=b"a")
        await a.send(b"a->all")
        await b.send(b"b->all")
        with trio.fail_after(5):
            got_b = [(await b.receive()).payload for _ in range(2)]
            got_b2 = [(await b2.receive()).payload for _ in range(2)]
            got_a = [(await a.receive()).payload for _ in range(2)]
        assert sorted(got_b) == [b"a->all", b"a->b"]
        assert sorted(got_b2) == [b"a->all", b"b->all"]
        assert sorted(got_a) == [b"b->a", b"b->all"]
        # Exactly once: nothing more arrives within the brokers' round trip.
        assert await drain(a, 0.5) == [] and await drain(b, 0) == [] \
            and await drain(b2, 0) == []

        await b2.disconnect()
        with trio.fail_after(10):
            while {m.addr for m in await sa.members("native")} != {b"a", b"b"}:
                await trio.sleep(0.02)


async def test_a_late_router_learns_and_a_killed_router_is_dropped_across_the_bridge(
        nursery: trio.Nursery, tmp_path: Path,
        bridged_brokers: tuple[BrokerProcess, BrokerProcess]) -> None:
    """Router A (a process, on broker A) holds member a before router B starts on broker B:
    B learns a from the retained records the bridge carried. Then A is killed with SIGKILL:
    broker A publishes its Last Will, the bridge carries it, and B suspects and drops a."""
    broker_a, broker_b = bridged_brokers
    with RouterProcess(None, "--bridge", broker_a.url, "--router-id", "ra",
                       "--bridge-keepalive", "1", "--federation-grace", "0",
                       log=tmp_path / "ra.log") as ra:
        async with RouterStub([("127.0.0.1", ra.port)], **FAST) as sa:
            await sa.connect("late", b"a", name="A")
            [rb] = await routers_on(nursery, broker_b)
            async with RouterStub([rb.address], **FAST) as sb:
                b = await sb.connect("late", b"b", name="B")
                with trio.fail_after(10):
                    while {m.addr for m in await sb.members("late")} != {b"a", b"b"}:
                        await trio.sleep(0.02)
                assert ra.proc is not None
                ra.proc.kill()
                with trio.fail_after(10):
                    event = await b.events().receive()
                assert (event.kind, event.member.addr if event.member else None) == (
                    "suspect", b"a")
                assert {m.addr for m in await sb.members("late")} == {b"b"}
