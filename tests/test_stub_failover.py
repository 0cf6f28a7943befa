"""RouterStub with several routers and with routers that die: failover, backoff, half-open.

Routers run in-process (restartable on the same port); the half-open case goes
through a small TCP proxy on 127.0.0.1 that can stop forwarding without
closing anything, like a hung router or a silently dropped network path.
"""

from __future__ import annotations

from typing import Any

import trio

from gossiprouter import ConnectionState, RouterStub
from gossiprouter.stub import StubEvent
from tests.test_stub import FAST, InProcessRouter, connected, drain, eventually


def state_of(stub: RouterStub, router: tuple[str, int]) -> ConnectionState:
    return next(s.state for s in stub.status() if s.router == router)


async def receive_payloads(ch: Any, n: int, timeout: float = 3.0) -> set[bytes]:
    got: set[bytes] = set()
    with trio.fail_after(timeout):
        while len(got) < n:
            got.add((await ch.receive()).payload)
    return got


# ------------------------------------------------------------------------------------------- 4


async def test_two_routers_failover_and_rejoin(nursery: trio.Nursery) -> None:
    """Both stubs register with both routers; with one router stopped, sends go through the
    other and are all delivered; when it comes back the stubs re-join it by themselves."""
    r1 = await InProcessRouter(nursery).start()
    r2 = await InProcessRouter(nursery).start()
    routers = [r1.address, r2.address]
    async with RouterStub(routers, policy="round-robin", **FAST) as s1, \
            RouterStub(routers, **FAST) as s2:
        a = await s1.connect("g", b"A", name="A")
        b = await s2.connect("g", b"B", name="B")
        assert r1.members("g") == r2.members("g") == {b"A", b"B"}
        # members() is the union over both routers, each address once.
        assert sorted(m.addr for m in await a.members()) == [b"A", b"B"]

        for i in range(10):
            await a.send(b"both-%d" % i)
        assert await receive_payloads(b, 10) == {b"both-%d" % i for i in range(10)}
        # Round-robin spread the messages over both routers; each arrived once.
        assert r1.server is not None and r2.server is not None
        r1.server.hub.sync()  # what the compiled fast path relayed
        r2.server.hub.sync()
        assert r1.server.hub.counters.routed == 5 and r2.server.hub.counters.routed == 5
        assert await drain(b, 0.1) == []

        await r1.stop()
        await eventually(lambda: state_of(s1, r1.address) is not ConnectionState.CONNECTED
                         and state_of(s2, r1.address) is not ConnectionState.CONNECTED)
        r2.server.hub.sync()
        routed_before = r2.server.hub.counters.routed
        for i in range(10):
            await a.send(b"r2-%d" % i)
            await b.send(b"back-%d" % i, dest=b"A")
        assert await receive_payloads(b, 10) == {b"r2-%d" % i for i in range(10)}
        assert await receive_payloads(a, 10) == {b"back-%d" % i for i in range(10)}
        r2.server.hub.sync()
        assert r2.server.hub.counters.routed == routed_before + 20

        await r1.start()  # same port
        await eventually(lambda: connected(s1, r1.address) and connected(s2, r1.address))
        assert r1.members("g") == {b"A", b"B"}

        await r2.stop()
        await eventually(lambda: state_of(s1, r2.address) is not ConnectionState.CONNECTED)
        for i in range(5):
            await a.send(b"r1-%d" % i)
        assert await receive_payloads(b, 5) == {b"r1-%d" % i for i in range(5)}
        assert r1.server is not None
        r1.server.hub.sync()
        assert r1.server.hub.counters.routed == 5


async def test_a_write_error_fails_over_to_the_next_router(nursery: trio.Nursery) -> None:
    """The connection a send picked turns out dead only when written to (white-box: its
    write fails): the same send goes through the other router; nothing surfaces."""
    r1 = await InProcessRouter(nursery).start()
    r2 = await InProcessRouter(nursery).start()
    routers = [r1.address, r2.address]
    async with RouterStub(routers, policy="round-robin", **FAST) as s1, \
            RouterStub(routers, **FAST) as s2:
        a = await s1.connect("g", b"A")
        b = await s2.connect("g", b"B")
        await eventually(lambda: len([lk for lk in s1._links.live() if lk.ready]) == 2)
        victim = s1._links.live()[0]  # only the first router's connection breaks
        real_write = victim.write

        async def broken(data: bytes) -> None:
            victim.kill("write failed: simulated")
            await real_write(data)  # raises: the link is dead

        victim.write = broken  # type: ignore[method-assign]
        for i in range(4):
            await a.send(b"m%d" % i)
        assert await receive_payloads(b, 4) == {b"m0", b"m1", b"m2", b"m3"}
        assert victim.dead and victim.error == "write failed: simulated"  # it was tried
        assert r1.server is not None and r2.server is not None
        r1.server.hub.sync()
        r2.server.hub.sync()
        assert r1.server.hub.counters.routed + r2.server.hub.counters.routed == 4
        await eventually(lambda: connected(s1, r1.address) and connected(s1, r2.address))


async def test_suspect_and_leave_are_merged_over_routers(nursery: trio.Nursery) -> None:
    """A member that crashes is reported by both routers; the application hears it once."""
    r1 = await InProcessRouter(nursery).start()
    r2 = await InProcessRouter(nursery).start()
    routers = [r1.address, r2.address]
    async with RouterStub(routers, **FAST) as s1:
        a = await s1.connect("g", b"A")
        watch = await s1.watch("g")
        with trio.CancelScope() as crash:
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


async def test_backoff_bounds_attempts_while_a_router_is_down(nursery: trio.Nursery) -> None:
    """A router down for 5 s: attempts are spaced by a growing, jittered backoff (capped at
    reconnect_max), never a tight loop; then the stub reconnects."""
    r = await InProcessRouter(nursery).start()
    opts = {**FAST, "reconnect_initial": 0.1, "reconnect_max": 1.0}
    async with RouterStub([r.address], **opts) as stub:
        await stub.connect("g", b"A")
        events = stub.state_changes()
        await r.stop()
        await trio.sleep(5.0)
        down = await drain(events, 0)
        attempts = [e for e in down if e.state is ConnectionState.CONNECTING]
        waits = [e for e in down if e.state is ConnectionState.RECONNECTING]
        # Expected about a dozen attempts in 5 s (mean waits 0.05, 0.1, 0.2, 0.4, then 0.5 s);
        # a spinning reconnector would make thousands.
        assert 4 <= len(attempts) <= 30, len(attempts)
        for n, ev in enumerate(waits):
            assert ev.delay is not None
            assert 0 <= ev.delay <= min(1.0, 0.1 * 2**n) + 1e-9
        assert all(ev.error for ev in waits)
        assert stub.status()[0].attempts == 1 + len(attempts)
        await r.start()
        with trio.fail_after(3):
            await stub.wait_connected()
        await eventually(lambda: r.members("g") == {b"A"})


# ------------------------------------------------------------------------------------------- 6


class FreezableProxy:
    """A TCP proxy to ``target``; :meth:`freeze` makes every current connection stop
    forwarding in both directions while staying open (new connections work normally)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.frozen: list[trio.Event] = []
        self.accepted = 0
        self.port = 0

    async def serve(self, *, task_status: trio.TaskStatus[int]) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._handle, listeners)

    def freeze(self) -> None:
        for ev in self.frozen:
            ev.set()

    async def _handle(self, client: trio.SocketStream) -> None:
        self.accepted += 1
        frozen = trio.Event()
        self.frozen.append(frozen)
        async with client, await trio.open_tcp_stream(*self.target) as upstream:

            async def pump(src: trio.SocketStream, dst: trio.SocketStream) -> None:
                try:
                    while data := await src.receive_some(65536):
                        await dst.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                n.cancel_scope.cancel()  # one side closed: close the other

            async with trio.open_nursery() as n:
                n.start_soon(pump, client, upstream)
                n.start_soon(pump, upstream, client)
                await frozen.wait()
                n.cancel_scope.cancel()  # frozen: stop forwarding, even what is in flight
            if frozen.is_set():
                await trio.sleep_forever()  # ... and keep both sockets open, silently


async def test_hung_router_is_detected_by_heartbeat_timeout(nursery: trio.Nursery) -> None:
    r = await InProcessRouter(nursery).start()
    proxy = FreezableProxy(r.address)
    port = await nursery.start(proxy.serve)
    via = ("127.0.0.1", port)
    opts = {**FAST, "heartbeat_interval": 0.2, "heartbeat_timeout": 0.8}
    async with RouterStub([via], **opts) as s1, RouterStub([r.address], **FAST) as s2:
        a = await s1.connect("g", b"A")
        b = await s2.connect("g", b"B")
        await trio.sleep(0.5)  # a few heartbeats go through the live proxy: no false alarm
        assert s1.status()[0].connections == 1
        events = s1.state_changes()
        frozen_at = trio.current_time()
        proxy.freeze()
        lost: StubEvent | None = None
        with trio.fail_after(3):
            async for ev in events:
                if ev.state is ConnectionState.RECONNECTING:
                    lost = ev
                    break
        detected = trio.current_time() - frozen_at
        assert lost is not None and "heartbeat timeout" in (lost.error or "")
        assert detected <= 0.8 + 0.4, detected
        with trio.fail_after(3):
            await s1.wait_connected()
        assert proxy.accepted == 2 and s1.status()[0].connections == 2
        await b.send(b"after the hang", dest=b"A")
        with trio.fail_after(3):
            assert (await a.receive()).payload == b"after the hang"
        await a.send(b"and back")
        with trio.fail_after(3):
            assert (await b.receive()).payload == b"and back"


async def test_pings_keep_a_short_router_idle_timeout_happy(nursery: trio.Nursery) -> None:
    """The router announces idle_timeout_ms 400 (and heartbeat_ms 10 s): the stub pings at
    least twice per idle timeout, so its connection is never closed as idle."""
    r = await InProcessRouter(nursery, idle_timeout=0.4).start()
    async with RouterStub([r.address], **{**FAST, "heartbeat_interval": 5.0,
                                          "heartbeat_timeout": 15.0}) as stub:
        await stub.connect("g", b"A")
        await trio.sleep(1.5)
        assert stub.status()[0].connections == 1 and connected(stub)


async def test_router_that_never_answers_hello_is_not_waited_on_forever(
        nursery: trio.Nursery) -> None:
    """A listener that accepts but never speaks: each attempt ends after connect_timeout."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    held: list[trio.SocketStream] = []

    async def mute(stream: trio.SocketStream) -> None:
        held.append(stream)
        await trio.sleep_forever()

    nursery.start_soon(trio.serve_listeners, mute, listeners)
    async with RouterStub([("127.0.0.1", port)], **{**FAST, "connect_timeout": 0.3}) as stub:
        await eventually(lambda: stub.status()[0].attempts >= 2, timeout=3)
        assert stub.status()[0].last_error == "timed out"
        assert not connected(stub)
