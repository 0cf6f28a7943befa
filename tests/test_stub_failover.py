"""RouterStub with several routers and with routers that die: failover, backoff, half-open.

Routers run on threads (restartable on the same port; tests/stubkit.py); the half-open case
goes through a small TCP proxy on 127.0.0.1 that can stop forwarding without closing
anything, like a hung router or a silently dropped network path. On asyncio and trio.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import trio
from anyio.abc import SocketAttribute, SocketStream, TaskStatus

from gossiprouter import ConnectionState, RouterStub
from gossiprouter.protocol import native as wire
from gossiprouter.stub import StubEvent
from tests.stubkit import (
    FAST,
    FakeLink,
    FakeRouter,
    RouterThread,
    RouterThreads,
    anyio_backend,
    connected,
    drain,
    eventually,
    fake_router,
    router,
    start_router,
)
from tests.test_stub_protocol_state import WELCOME

__all__ = ["anyio_backend", "fake_router", "router", "start_router"]

pytestmark = pytest.mark.anyio


@pytest.fixture
def two(start_router: RouterThreads) -> Iterator[tuple[RouterThread, RouterThread]]:
    yield start_router(), start_router()


def state_of(stub: RouterStub, router: tuple[str, int]) -> ConnectionState:
    return next(s.state for s in stub.status() if s.router == router)


async def receive_payloads(ch: Any, n: int, timeout: float = 3.0) -> set[bytes]:
    got: set[bytes] = set()
    with anyio.fail_after(timeout):
        while len(got) < n:
            got.add((await ch.receive()).payload)
    return got


# ------------------------------------------------------------------------------------------- 4


async def test_two_routers_failover_and_rejoin(two: tuple[RouterThread, RouterThread]) -> None:
    """Both stubs register with both routers; with one router stopped, sends go through the
    other and are all delivered; when it comes back the stubs re-join it by themselves."""
    r1, r2 = two
    routers = [r1.address, r2.address]
    async with RouterStub(routers, policy="round-robin", **FAST) as s1, \
            RouterStub(routers, **FAST) as s2:
        # Both routers up first: connect() returns once the connected ones answered.
        await s1.wait_connected(all_routers=True)
        await s2.wait_connected(all_routers=True)
        a = await s1.connect("g", b"A", name="A")
        b = await s2.connect("g", b"B", name="B")
        assert r1.members("g") == r2.members("g") == {b"A", b"B"}
        # members() is the union over both routers, each address once.
        assert sorted(m.addr for m in await a.members()) == [b"A", b"B"]

        for i in range(10):
            await a.send(b"both-%d" % i)
        assert await receive_payloads(b, 10) == {b"both-%d" % i for i in range(10)}
        # Round-robin spread the messages over both routers; each arrived once.
        assert r1.routed() == 5 and r2.routed() == 5
        assert await drain(b, 0.1) == []

        await r1.astop()
        await eventually(lambda: state_of(s1, r1.address) is not ConnectionState.CONNECTED
                         and state_of(s2, r1.address) is not ConnectionState.CONNECTED)
        routed_before = r2.routed()
        for i in range(10):
            await a.send(b"r2-%d" % i)
            await b.send(b"back-%d" % i, dest=b"A")
        assert await receive_payloads(b, 10) == {b"r2-%d" % i for i in range(10)}
        assert await receive_payloads(a, 10) == {b"back-%d" % i for i in range(10)}
        assert r2.routed() == routed_before + 20

        await r1.astart()  # same port
        await eventually(lambda: connected(s1, r1.address) and connected(s2, r1.address))
        assert r1.members("g") == {b"A", b"B"}

        await r2.astop()
        await eventually(lambda: state_of(s1, r2.address) is not ConnectionState.CONNECTED)
        for i in range(5):
            await a.send(b"r1-%d" % i)
        assert await receive_payloads(b, 5) == {b"r1-%d" % i for i in range(5)}
        assert r1.routed() == 5


async def test_a_write_error_fails_over_to_the_next_router(
        two: tuple[RouterThread, RouterThread]) -> None:
    """The connection a send picked turns out dead only when written to (white-box: its
    write fails): the same send goes through the other router; nothing surfaces."""
    r1, r2 = two
    routers = [r1.address, r2.address]
    async with RouterStub(routers, policy="round-robin", **FAST) as s1, \
            RouterStub(routers, **FAST) as s2:
        a = await s1.connect("g", b"A")
        b = await s2.connect("g", b"B")
        await eventually(lambda: len([lk for lk in s1._links.live() if lk.ready]) == 2)
        # connect() returns once one router answered: B is on both before anything is sent
        # (a send through a router that has not registered B yet would reach nobody).
        await eventually(lambda: r1.members("g") == r2.members("g") == {b"A", b"B"})
        victim = s1._links.live()[0]  # only the first router's connection breaks
        real_write = victim.write

        async def broken(data: bytes, *, bounded: bool = False) -> None:
            victim.kill("write failed: simulated")
            await real_write(data, bounded=bounded)  # raises: the link is dead

        victim.write = broken  # type: ignore[method-assign]
        for i in range(4):
            await a.send(b"m%d" % i)
        assert await receive_payloads(b, 4) == {b"m0", b"m1", b"m2", b"m3"}
        assert victim.dead and victim.error == "write failed: simulated"  # it was tried
        assert r1.routed() + r2.routed() == 4
        await eventually(lambda: connected(s1, r1.address) and connected(s1, r2.address))


async def test_suspect_and_leave_are_merged_over_routers(
        two: tuple[RouterThread, RouterThread]) -> None:
    """A member that crashes is reported by both routers; the application hears it once."""
    r1, r2 = two
    routers = [r1.address, r2.address]
    async with RouterStub(routers, **FAST) as s1:
        a = await s1.connect("g", b"A")
        watch = await s1.watch("g")
        with anyio.CancelScope() as crash:
            async with RouterStub(routers, **FAST) as s3:
                await s3.connect("g", b"X", name="x")
                await eventually(lambda: r1.members("g") == r2.members("g") == {b"A", b"X"})
                crash.cancel()  # leaves the block cancelled: no DISCONNECT, like a crash
        await eventually(lambda: r1.members("g") == r2.members("g") == {b"A"})
        kinds = [(e.kind, e.member.addr) for e in await drain(watch, 0.2)]
        assert kinds == [("join", b"X"), ("leave", b"X")]
        suspects = [e for e in await drain(a.events(), 0) if e.kind == "suspect"]
        assert [e.member.addr for e in suspects] == [b"X"]
        assert s1.stats.events_merged >= 2  # the second join/leave and the second suspect


# ------------------------------------------------------------------------------------------- 5


async def test_backoff_bounds_attempts_while_a_router_is_down(router: RouterThread) -> None:
    """A router down for 3 s: attempts are spaced by a growing, jittered backoff (capped at
    reconnect_max), never a tight loop; then the stub reconnects."""
    r = router
    opts = {**FAST, "reconnect_initial": 0.1, "reconnect_max": 1.0}
    async with RouterStub([r.address], **opts) as stub:
        await stub.connect("g", b"A")
        events = stub.state_changes()
        await r.astop()
        await anyio.sleep(3.0)
        down = await drain(events, 0)
        attempts = [e for e in down if e.state is ConnectionState.CONNECTING]
        waits = [e for e in down if e.state is ConnectionState.RECONNECTING]
        # About 8 attempts in 3 s (mean waits 0.05, 0.1, 0.2, 0.4, then 0.5 s), at least 4
        # (the longest waits, 0.1 + 0.2 + 0.4 + 0.8 s, end by 1.5 s); a spinning reconnector
        # would make thousands.
        assert 4 <= len(attempts) <= 30, len(attempts)
        for n, ev in enumerate(waits):
            assert ev.delay is not None
            assert 0 <= ev.delay <= min(1.0, 0.1 * 2**n) + 1e-9
        assert all(ev.error for ev in waits)
        assert stub.status()[0].attempts == 1 + len(attempts)
        await r.astart()
        with anyio.fail_after(3):
            await stub.wait_connected()
        await eventually(lambda: r.members("g") == {b"A"})


# ------------------------------------------------------------------------------------------- 6


class FreezableProxy:
    """A TCP proxy to ``target``; :meth:`freeze` makes every current connection stop
    forwarding in both directions while staying open (new connections work normally)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.frozen: list[anyio.Event] = []
        self.accepted = 0
        self.port = 0

    async def serve(self, *, task_status: TaskStatus[int]) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.port = listener.extra(SocketAttribute.local_port)
        task_status.started(self.port)
        await listener.serve(self._handle)

    def freeze(self) -> None:
        for ev in self.frozen:
            ev.set()

    async def _handle(self, client: SocketStream) -> None:
        self.accepted += 1
        frozen = anyio.Event()
        self.frozen.append(frozen)
        async with client, await anyio.connect_tcp(*self.target) as upstream:

            async def pump(src: SocketStream, dst: SocketStream) -> None:
                try:
                    while True:
                        await dst.send(await src.receive(65536))
                except (anyio.EndOfStream, anyio.BrokenResourceError,
                        anyio.ClosedResourceError):
                    pass
                n.cancel_scope.cancel()  # one side closed: close the other

            async with anyio.create_task_group() as n:
                n.start_soon(pump, client, upstream)
                n.start_soon(pump, upstream, client)
                await frozen.wait()
                n.cancel_scope.cancel()  # frozen: stop forwarding, even what is in flight
            if frozen.is_set():
                await anyio.sleep_forever()  # ... and keep both sockets open, silently


async def test_hung_router_is_detected_by_heartbeat_timeout(router: RouterThread) -> None:
    r = router
    proxy = FreezableProxy(r.address)
    opts = {**FAST, "heartbeat_interval": 0.2, "heartbeat_timeout": 0.8}
    async with anyio.create_task_group() as tasks:
        port = await tasks.start(proxy.serve)
        await hung_router(proxy, ("127.0.0.1", port), r.address, opts)
        tasks.cancel_scope.cancel()


async def hung_router(proxy: FreezableProxy, via: tuple[str, int], direct: tuple[str, int],
                      opts: dict[str, Any]) -> None:
    async with RouterStub([via], **opts) as s1, RouterStub([direct], **FAST) as s2:
        a = await s1.connect("g", b"A")
        b = await s2.connect("g", b"B")
        await anyio.sleep(0.5)  # a few heartbeats go through the live proxy: no false alarm
        assert s1.status()[0].connections == 1
        events = s1.state_changes()
        frozen_at = anyio.current_time()
        proxy.freeze()
        lost: StubEvent | None = None
        with anyio.fail_after(3):
            async for ev in events:
                if ev.state is ConnectionState.RECONNECTING:
                    lost = ev
                    break
        detected = anyio.current_time() - frozen_at
        assert lost is not None and "heartbeat timeout" in (lost.error or "")
        assert detected <= 0.8 + 0.4, detected
        with anyio.fail_after(3):
            await s1.wait_connected()
        assert proxy.accepted == 2 and s1.status()[0].connections == 2
        await b.send(b"after the hang", dest=b"A")
        with anyio.fail_after(3):
            assert (await a.receive()).payload == b"after the hang"
        await a.send(b"and back")
        with anyio.fail_after(3):
            assert (await b.receive()).payload == b"and back"


async def test_pings_keep_a_short_router_idle_timeout_happy(
        start_router: RouterThreads) -> None:
    """The router announces idle_timeout_ms 400 (and heartbeat_ms 10 s): the stub pings at
    least twice per idle timeout, so its connection is never closed as idle."""
    r = start_router(idle_timeout=0.4)
    async with RouterStub([r.address], **{**FAST, "heartbeat_interval": 5.0,
                                          "heartbeat_timeout": 15.0}) as stub:
        await stub.connect("g", b"A")
        await anyio.sleep(1.5)
        assert stub.status()[0].connections == 1 and connected(stub)


async def test_router_that_never_answers_hello_is_not_waited_on_forever() -> None:
    """A listener that accepts but never speaks: each attempt ends after connect_timeout."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(SocketAttribute.local_port)
    held: list[SocketStream] = []

    async def mute(stream: SocketStream) -> None:
        held.append(stream)
        await anyio.sleep_forever()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(listener.serve, mute)
        async with RouterStub([("127.0.0.1", port)],
                              **{**FAST, "connect_timeout": 0.3}) as stub:
            await eventually(lambda: stub.status()[0].attempts >= 2, timeout=3)
            assert stub.status()[0].last_error == "timed out"
            assert not connected(stub)
        tasks.cancel_scope.cancel()


async def test_a_router_that_stops_reading_ends_a_blocked_write(
        fake_router: FakeRouter) -> None:
    """The router stops reading but keeps sending (it looks alive): a send that fills the
    socket buffers is ended after write_timeout (the heartbeat timeout), the connection is
    dropped and the stub reconnects; the send goes out on the new connection."""

    async def script(link: FakeLink) -> None:
        assert isinstance(await link.recv(), wire.Hello)
        await link.send(WELCOME)
        connect = await link.recv()
        assert isinstance(connect, wire.Connect)
        await link.send(wire.Ok(connect.req))
        while True:  # never reads again
            await link.send(wire.Pong(0))
            await trio.sleep(0.05)

    addr = fake_router(script)
    seen: list[StubEvent] = []
    opts = {**FAST, "heartbeat_interval": 0.1, "heartbeat_timeout": 0.5}
    async with RouterStub([addr], on_state=seen.append, **opts) as stub:
        chan = await stub.connect("g", b"A")
        with anyio.fail_after(15):
            for _ in range(10_000):  # bounded: socket buffers hold a few hundred of these
                await chan.send(b"x" * 60_000)
                if any(ev.state is ConnectionState.RECONNECTING for ev in seen):
                    break
        lost = [ev.error for ev in seen if ev.state is ConnectionState.RECONNECTING]
        assert lost == ["write blocked for 0.5s"]
        assert stub.status()[0].connections == 2  # the send went out on the new one
