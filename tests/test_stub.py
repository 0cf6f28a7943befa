"""RouterStub against a real router: shared transport, restart, errors, buffers; on asyncio
and on trio (tests/stubkit.py: the router runs on a thread of its own).

Every wait is bounded; the stubs use short backoff and heartbeat settings so
reconnects happen within a fraction of a second.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import trio

from gossiprouter import (
    ChannelClosedError,
    ConnectionState,
    ForbiddenError,
    GroupEvent,
    LimitError,
    Member,
    Message,
    ModeError,
    NotConnectedError,
    RouterError,
    RouterStub,
)
from gossiprouter.client.connection import WriteLock
from gossiprouter.core.config import Config
from gossiprouter.ops.runtime import Operations
from gossiprouter.server.listener import Server
from gossiprouter.stub import Channel, StubEvent

# The helpers live in tests/stubkit.py; other test modules import them from here too.
from tests.stubkit import (
    FAST,
    RouterThread,
    RouterThreads,
    anyio_backend,
    buffered,
    connected,
    drain,
    eventually,
    free_port,
    router,
    settle,
    start_router,
)

__all__ = ["FAST", "InProcessRouter", "anyio_backend", "buffered", "connected", "drain",
           "eventually", "free_port", "router", "settle", "start_router"]

pytestmark = pytest.mark.anyio


class InProcessRouter:
    """An in-process router that can be stopped and restarted on the same port."""

    def __init__(self, nursery: trio.Nursery, port: int = 0, **config: Any) -> None:
        self.nursery = nursery
        self.port = port
        self.config = config
        self.server: Server | None = None
        self.scope: trio.CancelScope | None = None

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    async def start(self) -> InProcessRouter:
        cfg = Config(host="127.0.0.1", port=self.port, **self.config)
        server = Server(cfg, hooks=Operations(cfg))
        scope = trio.CancelScope()

        async def run(*, task_status: trio.TaskStatus[tuple[str, int]]) -> None:
            with scope:
                await server.serve(task_status=task_status)

        addr: tuple[str, int] = await self.nursery.start(run)
        self.port = addr[1]
        self.server, self.scope = server, scope
        return self

    async def stop(self, graceful: bool = False) -> None:
        """Cancel the router (connections cut), or with ``graceful`` shut it down: clients
        get ERROR shutting_down, then the connections close."""
        assert self.server is not None and self.scope is not None
        if graceful:
            self.server.shutdown()
        else:
            self.scope.cancel()
        with anyio.fail_after(5):
            await self.server.wait_closed()
        self.server = self.scope = None

    def members(self, group: str) -> set[bytes]:
        assert self.server is not None
        return {e.addr for e in self.server.hub.table.members(group)}


# ------------------------------------------------------------------------------------------- 1


async def test_shared_transport_delivers_to_exactly_the_right_channels(
        router: RouterThread) -> None:
    """Two stubs, two channels in each of two groups per stub, one connection per stub:
    multicast reaches every other channel of the group (local ones included, never the
    sender), unicast reaches only the channel with that address in that group."""
    async with RouterStub([router.address], **FAST) as s1, \
            RouterStub([router.address], **FAST) as s2:
        a1 = await s1.connect("g1", b"a1", name="a1")
        a2 = await s1.connect("g1", b"a2", name="a2")
        a1g2 = await s1.connect("g2", b"a1", name="a1")  # same address, other group
        a3 = await s1.connect("g2", b"a3", name="a3")
        b1 = await s2.connect("g1", b"b1", name="b1")
        b2 = await s2.connect("g1", b"b2", name="b2")
        b1g2 = await s2.connect("g2", b"b1", name="b1")
        b3 = await s2.connect("g2", b"b3", name="b3")
        everyone = [a1, a2, a1g2, a3, b1, b2, b1g2, b3]
        # One TCP connection per stub carries all eight registrations.
        assert router.connections() == 2
        assert all(st.connections == 1 for st in s1.status() + s2.status())
        assert {m.addr for m in await a1.members()} == {b"a1", b"a2", b"b1", b"b2"}

        await a1.send(b"m1")  # multicast g1 from s1
        await b3.send(b"m2")  # multicast g2 from s2
        await b1g2.send(b"u1", dest=b"a1")  # unicast g2 -> s1's a1 in g2 (not g1's a1)
        await a1.send(b"u2", dest=b"a2")  # unicast to a channel of the same stub
        await b2.send(b"u3", dest=b"b1")  # unicast within s2, group g1

        await anyio.sleep(0.3)
        got = {ch: [(m.sender, m.dest, m.payload) for m in await drain(ch, 0)] for ch in everyone}
        assert got[a1] == []
        assert got[a2] == [(b"a1", None, b"m1"), (b"a1", b"a2", b"u2")]
        assert got[b1] == [(b"a1", None, b"m1"), (b"b2", b"b1", b"u3")]
        assert got[b2] == [(b"a1", None, b"m1")]
        assert got[a1g2] == [(b"b3", None, b"m2"), (b"b1", b"a1", b"u1")]
        assert got[a3] == [(b"b3", None, b"m2")]
        assert got[b1g2] == [(b"b3", None, b"m2")]
        assert got[b3] == []
        assert s1.stats.undeliverable == 0 and s2.stats.undeliverable == 0


async def test_members_union_and_discovery_without_joining(router: RouterThread) -> None:
    """members() of a group the stub has not joined (TCPGOSSIP-style), of an unknown group,
    and of a JGroups namespace (allowed for listing)."""
    async with RouterStub([router.address], **FAST) as s1, \
            RouterStub([router.address], **FAST) as s2:
        await s1.connect("demo", b"A", name="A", physical=[("10.0.0.5", 7800), "10.0.0.6:7801"])
        assert await s2.members("demo") == [
            Member(b"A", "A", (("10.0.0.5", 7800), ("10.0.0.6", 7801)))]
        assert await s2.members("nobody-here") == []
        assert await s2.members("jgroups5:cluster") == []


# ------------------------------------------------------------------------------------------- 2


async def test_router_restart_reregisters_every_channel(router: RouterThread) -> None:
    """The router restarts on the same port: each stub reconnects by itself, re-sends CONNECT
    for every channel (GET_MEMBERS lists them all again) and traffic flows again."""
    r = router
    async with RouterStub([r.address], **FAST) as s1, RouterStub([r.address], **FAST) as s2:
        states = s1.state_changes()
        chans = [await s1.connect("g", b"A1"), await s1.connect("g", b"A2"),
                 await s1.connect("h", b"A3"), await s2.connect("g", b"B1"),
                 await s2.connect("h", b"B2")]
        before = r.members("g") | r.members("h")
        assert before == {b"A1", b"A2", b"A3", b"B1", b"B2"}

        await r.astop()
        await eventually(lambda: not connected(s1) and not connected(s2))
        await r.astart()
        await eventually(lambda: connected(s1) and connected(s2))
        assert r.members("g") == {b"A1", b"A2", b"B1"}
        assert r.members("h") == {b"A3", b"B2"}
        # GET_MEMBERS from an unrelated client sees them too.
        async with RouterStub([r.address], **FAST) as s3:
            assert {m.addr for m in await s3.members("g")} == {b"A1", b"A2", b"B1"}

        await chans[3].send(b"after restart")  # B1 -> g
        for ch in chans[:2]:
            with anyio.fail_after(3):
                assert (await ch.receive()).payload == b"after restart"
        await chans[2].send(b"to B2", dest=b"B2")
        with anyio.fail_after(3):
            assert (await chans[4].receive()).payload == b"to B2"

        seen = [e.state for e in await drain(states, 0.01)]
        assert ConnectionState.RECONNECTING in seen
        assert seen[-1] is ConnectionState.CONNECTED
        assert s1.status()[0].connections == 2


# ------------------------------------------------------------------------------------------- 3


async def test_stubs_started_before_the_router_connect_when_it_starts() -> None:
    port = free_port()
    r = RouterThread(port)
    addr = ("127.0.0.1", port)
    async with RouterStub([addr], **FAST) as s1, \
            RouterStub([addr], **{**FAST, "send_timeout": 10.0}) as s2, \
            anyio.create_task_group() as tasks:
        a = await s1.connect("g", b"A", wait=False)  # registered whenever a router comes up
        got: list[Channel] = []

        async def join_b() -> None:  # waits (bounded) for a router, then returns the channel
            got.append(await s2.connect("g", b"B"))

        tasks.start_soon(join_b)
        await anyio.sleep(0.5)
        assert not connected(s1) and s1.status()[0].attempts >= 2
        assert "connection refused" in (s1.status()[0].last_error or "")
        await r.astart()
        try:
            await eventually(lambda: bool(got) and connected(s1))
            assert r.members("g") == {b"A", b"B"}
            await got[0].send(b"hello")
            with anyio.fail_after(3):
                assert (await a.receive()).payload == b"hello"
        finally:
            await r.astop()


# --------------------------------------------------------------------------- errors


async def test_error_replies_raise_typed_exceptions(start_router: RouterThreads) -> None:
    router = start_router(addresses_per_connection=2)
    async with RouterStub([router.address], **FAST) as stub:
        with pytest.raises(ForbiddenError) as fe:
            await stub.connect("jgroups5:cluster", b"A")
        assert fe.value.code == "forbidden" and "JGroups namespace" in fe.value.message
        assert fe.value.router == router.address
        assert stub.channels() == []  # the refused registration is withdrawn
        await stub.connect("g", b"A")
        await stub.connect("g", b"B")
        with pytest.raises(LimitError) as le:
            await stub.connect("g", b"C")
        assert isinstance(le.value, RouterError) and le.value.code == "limit"
        assert [c.addr for c in stub.channels()] == [b"A", b"B"]
        with pytest.raises(ValueError):
            await stub.connect("g", b"A")  # already a channel of this stub
        with pytest.raises(ValueError):
            await stub.connect("g", b"x" * 256)


async def test_send_while_every_router_is_down_raises_after_send_timeout() -> None:
    port = free_port()
    async with RouterStub([("127.0.0.1", port)], **{**FAST, "send_timeout": 0.5}) as stub:
        chan = await stub.connect("g", b"A", wait=False)
        with pytest.raises(NotConnectedError) as e:
            await chan.send(b"lost?")
        msg = str(e.value)
        assert f"127.0.0.1:{port}" in msg and "connection refused" in msg and "0.5s" in msg
        assert e.value.last_error == "connection refused"
        assert e.value.routers[0].state is not ConnectionState.CONNECTED
        with pytest.raises(NotConnectedError):
            await stub.connect("g", b"B")
        with pytest.raises(NotConnectedError):
            await stub.members("g")


async def test_send_waits_for_a_reconnect_within_send_timeout(
        start_router: RouterThreads) -> None:
    """A send while the router restarts is held, then delivered: never dropped silently.

    The receiver is a second channel of the same stub: it is re-registered in the same
    first pass, before the connection carries the held message."""
    r = start_router(shutdown_timeout=0.5)
    async with RouterStub([r.address], **FAST) as s1, anyio.create_task_group() as tasks:
        a = await s1.connect("g", b"A")
        b = await s1.connect("g", b"B")
        states = s1.state_changes()
        await r.astop(graceful=True)
        await eventually(lambda: not connected(s1))
        with anyio.fail_after(3):
            lost = await states.receive()
        # The router said why before closing (ERROR shutting_down, no req).
        assert lost.state is ConnectionState.RECONNECTING
        assert lost.error == ("router closed the connection: shutting_down: "
                              "router is shutting down")

        async def restart_soon() -> None:
            await anyio.sleep(0.5)
            await r.astart()

        tasks.start_soon(restart_soon)
        await a.send(b"held")  # waits for the reconnect (send_timeout 3 s)
        with anyio.fail_after(3):
            assert (await b.receive()).payload == b"held"


# --------------------------------------------------------------------------- events


async def test_suspect_join_and_leave_events(router: RouterThread) -> None:
    async with RouterStub([router.address], **FAST) as stub:
        chan = await stub.connect("g", b"A")
        watch = await stub.watch("g")
        with anyio.CancelScope() as vanish:  # a cancelled stub leaves without DISCONNECT:
            async with RouterStub([router.address], **FAST) as ghost:  # suspect + leave
                await ghost.connect("g", b"X", name="x", physical=[("10.0.0.9", 7800)])
                vanish.cancel()
                await anyio.sleep_forever()
        async with RouterStub([router.address], **FAST) as other:
            c = await other.connect("g", b"Y", name="y")
            await c.disconnect()  # clean leave: no suspect
        events = await drain(watch)
        assert [(e.kind, e.member.addr) for e in events] == [
            ("join", b"X"), ("leave", b"X"), ("join", b"Y"), ("leave", b"Y")]
        assert events[0].member == Member(b"X", "x", (("10.0.0.9", 7800),))
        await settle(stub)
        chan_events = [(e.kind, e.member.addr) for e in await drain(chan.events(), 0)]
        # The channel sees the watched group's join/leave and the suspect, in order.
        assert chan_events == [("join", b"X"), ("suspect", b"X"), ("leave", b"X"),
                               ("join", b"Y"), ("leave", b"Y")]
        assert all(isinstance(e, GroupEvent) and e.group == "g" for e in events)
        await watch.aclose()

        def unwatched() -> bool:
            g = router.call(lambda: router.hub.table.group("g"))
            return g is not None and not router.call(lambda: bool(g.watchers))

        await eventually(unwatched)


async def test_incoming_yields_messages_and_events_in_arrival_order(router: RouterThread) -> None:
    """Separate streams lose the relative order of a join, a message and a leave; the merged
    ``incoming()`` view keeps it."""
    async with RouterStub([router.address], **FAST) as s1, \
            RouterStub([router.address], **FAST) as s2:
        a = await s1.connect("g", b"A")
        await s1.watch("g")
        for i in range(3):
            b = await s2.connect("g", b"B%d" % i)
            await b.send(b"hello %d" % i)
            await b.disconnect()
        expected = []
        for i in range(3):
            addr = b"B%d" % i
            expected += [("join", addr), ("message", addr), ("leave", addr)]
        got: list[tuple[str, bytes]] = []
        with anyio.fail_after(3):
            async for item in a.incoming():
                if isinstance(item, Message):
                    got.append(("message", item.sender))
                else:
                    got.append((item.kind, item.member.addr))
                if len(got) == len(expected):
                    break
        assert got == expected


# ------------------------------------------------------------------------------------------ buffers


async def test_full_receive_buffer_drops_the_oldest_and_counts(router: RouterThread) -> None:
    """A channel nobody reads keeps the newest ``receive_buffer`` messages; the shared
    connection's reader never blocks, so other channels keep receiving."""
    async with RouterStub([router.address], **{**FAST, "receive_buffer": 5}) as s1, \
            RouterStub([router.address], **FAST) as s2:
        idle = await s1.connect("g", b"idle")
        busy = await s1.connect("h", b"busy")
        sender_g = await s2.connect("g", b"S")
        sender_h = await s2.connect("h", b"T")
        for i in range(20):
            await sender_g.send(b"%d" % i)
        await sender_h.send(b"still flowing")
        with anyio.fail_after(3):
            assert (await busy.receive()).payload == b"still flowing"
        await settle(s1, s2)
        # Counted after the round trips: a late copy would show in dropped or in the buffer.
        assert idle.dropped == 15
        assert [m.payload for m in await drain(idle, 0)] == [b"%d" % i for i in range(15, 20)]
        assert s1.stats.undeliverable == 0


async def test_disconnect_ends_the_stream_and_discovery_mode_cannot_send(
        router: RouterThread) -> None:
    async with RouterStub([router.address], **FAST) as stub, \
            RouterStub([router.address], mode="discovery", **FAST) as disc:
        chan = await stub.connect("g", b"A")
        d = await disc.connect("g", b"D", name="d", physical=[("10.0.0.7", 7800)])
        assert {m.addr for m in await stub.members("g")} == {b"A", b"D"}
        with pytest.raises(ModeError):
            await d.send(b"no routing in discovery mode")

        async def consume() -> list[Message]:
            return [m async for m in chan]

        result: list[list[Message]] = []

        async def run() -> None:
            result.append(await consume())

        async with anyio.create_task_group() as n:
            n.start_soon(run)
            await anyio.sleep(0.05)
            await chan.disconnect()
        assert result == [[]]  # the async-for ended
        assert chan.closed and router.members("g") == {b"D"}
        with pytest.raises(ChannelClosedError):
            await chan.send(b"x")
    assert stub.closed
    assert router.members("g") == set()  # leaving the block disconnected everyone


async def test_state_changes_and_callback() -> None:
    port = free_port()
    seen: list[StubEvent] = []
    addr = ("127.0.0.1", port)
    r = RouterThread(port)
    try:
        async with RouterStub([addr], on_state=seen.append, **FAST) as stub:
            with pytest.raises(NotConnectedError) as e:
                await stub.wait_connected(2.0, fail_fast=True)
            assert str(e.value) == f"cannot reach router at 127.0.0.1:{port}: connection refused"
            await r.astart()
            await stub.wait_connected(3.0)
    finally:
        await r.astop()
    states = [ev.state for ev in seen]
    assert states[0] is ConnectionState.CONNECTING
    assert ConnectionState.RECONNECTING in states
    assert states[-2:] == [ConnectionState.CONNECTED, ConnectionState.CLOSED]
    assert all(ev.router == addr for ev in seen)


async def test_exceptions_raised_inside_the_block_are_not_wrapped(router: RouterThread) -> None:
    with pytest.raises(KeyError):
        async with RouterStub([router.address], **FAST):
            raise KeyError("mine")


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError):
        RouterStub([])
    with pytest.raises(ValueError):
        RouterStub(["127.0.0.1"])
    with pytest.raises(ValueError):
        RouterStub([("127.0.0.1", 1)], heartbeat_interval=5, heartbeat_timeout=5)
    with pytest.raises(ValueError):
        RouterStub([("127.0.0.1", 1)], heartbeat_interval=0, heartbeat_timeout=5)
    with pytest.raises(ValueError):
        RouterStub([("127.0.0.1", 1)], mode="tunnel")  # type: ignore[arg-type]
    assert RouterStub("127.0.0.1:1,127.0.0.1:2").routers == (("127.0.0.1", 1), ("127.0.0.1", 2))



async def test_the_write_lock_hands_over_in_order_and_survives_cancellation() -> None:
    """Connection.lock (WriteLock): waiters get it in arrival order, a cancelled waiter
    leaves the queue, and one cancelled just as the lock was handed to it passes it on."""
    lock = WriteLock()
    order: list[str] = []

    async def take(name: str) -> None:
        async with lock:
            order.append(name)
            await anyio.sleep(0.01)

    async with anyio.create_task_group() as tg, lock:
        for name in ("a", "b", "c"):
            tg.start_soon(take, name)
            await anyio.wait_all_tasks_blocked()  # queued in this order
        with anyio.CancelScope() as gone:  # a waiter that gives up
            gone.cancel()
            async with lock:
                pytest.fail("a cancelled waiter got the lock")
    assert order == ["a", "b", "c"]

    # Handed over to a waiter that was cancelled before it could run: it passes the lock on
    # to the next waiter, and the lock ends free.
    doomed: list[anyio.CancelScope] = []

    async def cancelled_at_the_handover() -> None:
        with anyio.CancelScope() as scope:
            doomed.append(scope)
            async with lock:
                order.append("handed")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await lock.__aenter__()
            tg.start_soon(cancelled_at_the_handover)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(take, "e")
            await anyio.wait_all_tasks_blocked()
            doomed[0].cancel()  # cancelled, and in the same step handed the lock
            await lock.__aexit__()
    assert order[3:] == ["e"]
    assert not lock._held and not lock._waiters
