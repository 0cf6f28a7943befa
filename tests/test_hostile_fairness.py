"""Hostile clients cannot stall, bloat or hold slots of the router (issue 12, items 4, 6, 8, 9).

Every test runs an attack on real sockets against an in-process router while an honest pair of
native members exchanges sequenced messages (:class:`Honest`): they must lose nothing, keep
their order, and the router must keep serving. No assertion is about time: the fairness
target (10 ms at p99) is measured by ``benchmarks/bench_fairness.py``; tests assert what the
router did (counters, errors sent, frames answered while an attack was in progress).
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio

from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol import native as wire
from gossiprouter.protocol.jgroups_address import V2, V5
from gossiprouter.server.listener import REFUSAL_SLOTS, Server
from tests.conftest import ops_of
from tests.hostile import (
    FLOOD_BUDGET,
    Honest,
    during,
    jgroups2_request_flood,
    jgroups5_heartbeat_flood,
    native_control_flood,
    pipelined_pings,
    throttled_then_closed,
)
from tests.jgroups_clients import J2Client, J5Client, uuid
from tests.nclient import NativeClient
from tests.ops_client import tokens_file

Start = Callable[..., Awaitable[Server]]


# ------------------------------------------------------------------ item 6: fairness


async def test_pipelined_pings_are_processed_in_turns(start_router: Start) -> None:
    """A pipeline of 5,000 PINGs (one 35 KB write, so one read) no longer runs in one go:
    other connections run between its turns, and it still gets every PONG."""
    router = await start_router(control_rate=0)  # the turn's share alone, no budget
    await during(router, pipelined_pings(router, 5000))
    assert router.hub.counters.turns_cut > 0


@pytest.mark.parametrize("kind", ["ping", "get_members"])
async def test_native_control_flood_is_throttled_then_closed(start_router: Start,
                                                            kind: str) -> None:
    router = await start_router(**FLOOD_BUDGET)
    frame = (wire.encode(wire.Ping(3)) if kind == "ping"
             else wire.encode(wire.GetMembers(1, "nothing-here")))

    await throttled_then_closed(router, lambda: native_control_flood(router, frame))


async def test_jgroups5_heartbeat_flood_is_throttled_then_closed(start_router: Start) -> None:
    router = await start_router(**FLOOD_BUDGET)
    await throttled_then_closed(router, lambda: jgroups5_heartbeat_flood(router))


async def test_jgroups2_request_flood_is_throttled_then_closed(start_router: Start) -> None:
    router = await start_router(**FLOOD_BUDGET)
    await throttled_then_closed(router, lambda: jgroups2_request_flood(router))


async def test_a_burst_within_budget_is_not_closed(start_router: Start) -> None:
    """An honest burst (a client registering in many groups at once) is slowed, never cut."""
    router = await start_router(control_rate=100, control_burst=50, control_grace=5)
    assert router.address is not None
    c = await NativeClient.open(*router.address)
    await c.send_raw(b"".join(wire.encode(wire.GetMembers(i, "g")) for i in range(1, 201)))
    for i in range(1, 201):
        f = await c.recv()
        assert isinstance(f, wire.Ok) and f.req == i
    assert router.hub.counters.throttled_turns > 0
    assert router.hub.counters.rate_limited == 0


# ------------------------------------------------------------------ item 4: WATCH and groups


async def test_watch_limit_per_connection(start_router: Start) -> None:
    router = await start_router(watches_per_connection=3)

    async def attack(honest: Honest) -> None:
        assert router.address is not None
        c = await NativeClient.open(*router.address)
        for i in range(3):
            assert await c.request(wire.Watch(i + 1, f"w{i}")) == wire.Ok(i + 1)
        assert await c.request(wire.Watch(9, "w0")) == wire.Ok(9)  # again: not one more
        r = await c.request(wire.Watch(10, "w3"))
        assert isinstance(r, wire.Error) and r.code == "limit"
        assert "3 watched groups per connection" in r.message
        assert "w3" not in router.hub.table.groups
        # Unwatching makes room; the connection stays usable.
        assert await c.request(wire.Unwatch(11, "w0")) == wire.Ok(11)
        assert await c.request(wire.Watch(12, "w3")) == wire.Ok(12)
        await c.aclose()

    await during(router, attack)


async def test_router_wide_group_cap(start_router: Start) -> None:
    """max_groups refuses a new group through every protocol; existing groups still work."""
    router = await start_router(max_groups=4)  # "honest" is one of them
    table = router.hub.table

    async def attack(honest: Honest) -> None:
        assert router.address is not None
        c = await NativeClient.open(*router.address)
        assert isinstance(await c.connect("n1", b"X"), wire.Ok)
        assert isinstance(await c.request(wire.Watch(c.req(), "n2")), wire.Ok)
        assert isinstance(await c.connect("n3", b"X"), wire.Ok)
        assert len(table.groups) == 4
        r = await c.connect("n4", b"X")
        assert isinstance(r, wire.Error) and r.code == "limit" and "max_groups" in r.message
        r = await c.request(wire.Watch(c.req(), "n5"))
        assert isinstance(r, wire.Error) and r.code == "limit"
        assert isinstance(await c.connect("n1", b"Y"), wire.Ok)  # an existing group: fine
        j2c = await J2Client.open(*router.address)
        reply = await j2c.connect("j", uuid(1, V2))
        assert reply.ok is False  # OP_FAIL
        j5c = await J5Client.open(*router.address)
        await j5c.register("j", uuid(2, V5), "x")
        await j5c.sync()
        assert "jgroups5:j" not in table.groups and "jgroups2:j" not in table.groups
        assert router.hub.counters.drops.get("refused_registration") == 2
        for x in (c, j2c, j5c):
            await x.aclose()

    await during(router, attack)


# ------------------------------------------------------------------ item 8: write deadline


def _stalled_socket(router: Server, first: bytes) -> socket.socket:
    """A raw client socket with a small receive buffer that sends ``first`` (its handshake
    and registration) and then reads nothing until the test says so."""
    assert router.address is not None
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(router.address)
    s.setblocking(False)
    s.send(first)
    return s


async def _stalled_receiver(router: Server, honest: Honest) -> tuple[socket.socket, int]:
    """A member of "honest" whose socket reads nothing; honest.a's traffic piles up for it
    below its queue bounds. Returns the raw socket and how many routed frames were sent."""
    assert router.address is not None
    s = _stalled_socket(router, wire.PREAMBLE + wire.encode(wire.Hello((1,), "stalled"))
                        + wire.encode(wire.Connect(1, "honest", b"STALLED", None, ())))
    sender = await NativeClient.open(*router.address)
    assert isinstance(await sender.connect("honest", b"S"), wire.Ok)
    sent = 0
    big = wire.encode_route("honest", b"STALLED", b"S", bytes(60_000))
    # Until the router had to queue for it (its socket and ours are full).
    with trio.fail_after(20):
        while not any(c.session is not None and c.session.outbox.chunks
                      and c.session.hub.table.holds(c.session, "honest", b"STALLED")
                      for c in router.connections):
            await sender.send_raw(big)
            sent += 1
            await trio.sleep(0.01)
    return s, sent


async def test_write_deadline_disconnects_a_stalled_receiver(start_router: Start) -> None:
    router = await start_router(write_timeout=0.5)

    async def attack(honest: Honest) -> None:
        s, _ = await _stalled_receiver(router, honest)
        with trio.fail_after(10):
            while router.hub.table.entry("honest", b"STALLED") is not None:
                await trio.sleep(0.05)
        ob_queued = [c for c in router.connections if c.session is not None
                     and c.session.outbox.close_reason == "slow_consumer"]
        assert ob_queued or router.hub.counters.slow_consumer_disconnects == 1
        s.close()

    await during(router, attack)
    c = router.hub.counters
    assert c.write_timeouts >= 1 and c.slow_consumer_disconnects == 1


async def test_write_deadline_with_drop_policy_discards_the_queue(start_router: Start) -> None:
    router = await start_router(write_timeout=0.5, slow_consumer_policy="drop")
    counters = router.hub.counters

    async def attack(honest: Honest) -> None:
        s, _ = await _stalled_receiver(router, honest)
        with trio.fail_after(10):
            while not counters.drops.get("write_timeout"):
                await trio.sleep(0.05)
        # Still a member, and its stream is still whole: once it reads again, every frame it
        # gets decodes (the frame being written when the queue was discarded was finished).
        assert router.hub.table.entry("honest", b"STALLED") is not None
        ts = trio.socket.from_stdlib_socket(s)
        dec = wire.Decoder(max_frame=1 << 20)
        await ts.send(wire.encode(wire.Ping(77)))
        with trio.fail_after(10):
            while wire.Pong(77) not in dec.frames():
                dec.feed(await ts.recv(1 << 16))
        s.close()

    await during(router, attack)
    assert counters.write_timeouts >= 1 and counters.slow_consumer_disconnects == 0


@pytest.mark.parametrize("protocol", ["jgroups2", "jgroups5"])
async def test_write_deadline_applies_to_jgroups_receivers(start_router: Start,
                                                           protocol: str) -> None:
    """A JGroups member whose socket stopped reading, its queue below the bounds, is a slow
    consumer after write_timeout (policy disconnect, set explicitly: JGroups connections
    default to drop, covered for the deadline by the native drop test): it leaves its group."""
    router = await start_router(write_timeout=0.5, jgroups_slow_consumer_policy="disconnect")
    table = router.hub.table
    version = V2 if protocol == "jgroups2" else V5
    stalled_addr = uuid(2, version)

    async def attack(honest: Honest) -> None:
        assert router.address is not None
        sender: J2Client | J5Client
        if protocol == "jgroups2":
            s = _stalled_socket(router, j2.connect("s", stalled_addr, "stalled", None))
            sender = await J2Client.open(*router.address)
            assert (await sender.connect("s", uuid(1, V2), "sender")).ok
        else:
            s = _stalled_socket(router, j5.register("s", stalled_addr, "stalled", None))
            sender = await J5Client.open(*router.address)
            await sender.register("s", uuid(1, V5), "sender")
        full = f"{protocol}:s"
        with trio.fail_after(10):
            while table.entry(full, stalled_addr.key) is None:
                await trio.sleep(0.01)
        payload = bytes(60_000)
        with trio.fail_after(20):
            while not router.hub.counters.write_timeouts:
                if isinstance(sender, J2Client):
                    await sender.message("s", stalled_addr, payload)
                else:
                    await sender.message("s", stalled_addr, uuid(1, V5), payload)
                await trio.sleep(0.02)
            while table.entry(full, stalled_addr.key) is not None:
                await trio.sleep(0.02)
        s.close()
        await sender.aclose()

    await during(router, attack)
    c = router.hub.counters
    assert c.write_timeouts >= 1 and c.slow_consumer_disconnects == 1


# ------------------------------------------------------------------ item 9: handshake, slots


@pytest.mark.parametrize("protocol", ["native", "jgroups2", "jgroups5"])
async def test_handshake_timeout_covers_the_first_frame(start_router: Start,
                                                        protocol: str) -> None:
    """Trickling the first frame (HELLO, CONNECT, REGISTER) one byte at a time no longer
    keeps a connection past handshake_timeout (it used to cover only the preamble)."""
    router = await start_router(handshake_timeout=0.5)
    first = {
        "native": wire.PREAMBLE + wire.encode(wire.Hello((1,), "slow")),
        "jgroups2": j2.connect("g", uuid(1, V2), "slow", None),
        "jgroups5": j5.register("g", uuid(1, V5), "slow", None),
    }[protocol]

    async def attack(honest: Honest) -> None:
        assert router.address is not None
        stream = await trio.open_tcp_stream(*router.address)
        got = b""
        with trio.fail_after(10):
            try:
                for i in range(len(first) - 1):
                    await stream.send_all(first[i : i + 1])
                    with trio.move_on_after(0.1):
                        data = await stream.receive_some(4096)
                        got += data
                        if not data:
                            break
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            else:
                while data := await stream.receive_some(4096):
                    got += data
        if protocol == "native":
            dec = wire.Decoder()
            dec.feed(got)
            assert dec.frames() == [wire.Error(None, "handshake_timeout",
                                               "handshake not done within 0.5s")]
        elif protocol == "jgroups5":
            assert got == j5.CLOSE_MARKER
        await stream.aclose()

    await during(router, attack)


async def test_connections_over_the_limit_are_refused_at_accept(start_router: Start) -> None:
    router = await start_router(max_connections=3)  # the honest pair, and one more

    async def attack(honest: Honest) -> None:
        assert router.address is not None
        held = []
        most = 0
        for _ in range(40):
            held.append(await trio.open_tcp_stream(*router.address))
            await trio.sleep(0.005)
            most = max(most, len(router.connections))
        assert most <= 3 + REFUSAL_SLOTS
        refused = ops_of(router).stats.refused.get(("any", "limit"), 0)
        assert refused >= 40 - 1 - REFUSAL_SLOTS
        for s in held:
            await s.aclose()

    await during(router, attack)


async def test_per_address_connection_limit(start_router: Start) -> None:
    router = await start_router(max_connections_per_ip=3)

    async def attack(honest: Honest) -> None:
        assert router.address is not None
        ok = await NativeClient.open(*router.address)  # the third from 127.0.0.1
        extra = await trio.open_tcp_stream(*router.address)
        await extra.send_all(wire.PREAMBLE)
        with trio.fail_after(5):
            assert await extra.receive_some(100) == b""  # closed at accept, nothing read
        assert ops_of(router).stats.refused.get(("any", "limit_per_ip")) == 1
        await ok.aclose()
        await extra.aclose()

    await during(router, attack)


async def test_failed_authentications_are_slowed_and_logged_in_summary(
        start_router: Start, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tokens = tokens_file(tmp_path, '[[token]]\nidentity = "app"\n'
                         'token = "0123456789abcdef-good"\ngroups = ["*"]\n')
    router = await start_router(tokens_file=str(tokens), auth_backoff=0.2)
    assert router.address is not None
    a = await NativeClient.open(*router.address, token="0123456789abcdef-good")
    b = await NativeClient.open(*router.address, token="0123456789abcdef-good")
    assert await a.connect("honest", b"A") == wire.Ok(1)
    assert await b.connect("honest", b"B") == wire.Ok(1)
    honest = Honest(a, b)
    caplog.set_level(logging.WARNING, logger="gossiprouter.ops.auth")
    async with trio.open_nursery() as n:
        await n.start(honest.run)
        for i in range(6):
            c = await NativeClient.open(*router.address, hello=False)
            await c.send(wire.Hello((1,), "guess", f"wrong-token-{i:08d}"))
            frames = await c.recv_until_closed()
            assert frames[-1].code == "unauthorized"  # type: ignore[union-attr]
            await c.aclose()
        honest.stop.set()
    honest.check()
    auth = ops_of(router).auth
    assert auth is not None and auth.failures["unauthorized"] == 6
    # Every guess after the first waited its turn ...
    assert ops_of(router).stats.auth_delayed == 5
    # ... and the log got one line, not six.
    lines = [r for r in caplog.records if "refusing" in r.getMessage()]
    assert len(lines) == 1


async def test_nothing_is_handled_after_a_rate_limited_close(start_router: Start) -> None:
    """The connection closed for staying over its control budget handles none of the input it
    still holds: a REGISTER flood closed mid-way leaves no member joined after the close (the
    reader used to run the session once more after closing it, so one more member joined a
    dead connection, visible to watchers as a join after its leaves)."""
    router = await start_router(control_rate=200, control_burst=200, control_grace=0.2)
    group = "jgroups5:flood"

    async def attack(honest: Honest) -> None:
        assert router.address is not None
        watcher = await NativeClient.open(*router.address)
        assert await watcher.request(wire.Watch(watcher.req(), group)) == wire.Ok(1)
        flood = await J5Client.open(*router.address)
        frames = b"".join(j5.register("flood", uuid(i, V5), f"m{i}", None)
                          for i in range(1, 901))  # below addresses_per_connection
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await flood.send_raw(frames)
        with trio.fail_after(20):
            while router.hub.counters.rate_limited == 0:
                await trio.sleep(0.01)
            # The close removes its members; the watcher keeps the group itself.
            while (g := router.hub.table.group(group)) is not None and g.entries:
                await trio.sleep(0.01)
        kinds: list[str] = []
        with contextlib.suppress(trio.TooSlowError):
            while True:
                ev = await watcher.recv(timeout=0.5)
                if isinstance(ev, wire.Event):
                    kinds.append(ev.kind)
        joined = kinds.count("join")
        assert 0 < joined < 900  # closed mid-way
        first_leave = kinds.index("leave")
        assert "join" not in kinds[first_leave:], "a member joined after the close"
        assert kinds.count("leave") == joined
        await watcher.aclose()
        await flood.aclose()

    await during(router, attack)
    assert router.hub.counters.rate_limited == 1
