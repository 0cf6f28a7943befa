"""Slow consumers never stall a group (issue 5, acceptance 1).

A group of 8: two senders multicast as fast as they can for 5 s, five more
members read, one member's socket never reads. Every reading member must get
everything; the stalled one is cut off (policy ``disconnect``) or has its
frames dropped and counted (policy ``drop``). The healthy members' delivery
rate with the stalled member is compared with a run without it and printed
(``-s`` shows it); it is a figure for the notes, not an assertion.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

import pytest
import trio

from gossiprouter.protocol import native as wire
from gossiprouter.server.listener import Server
from tests.nclient import NativeClient
from tests.procs import RouterProcess

# Each test sends for SEND_SECONDS: left out of a quick `pytest -m "not slow"` run.
pytestmark = pytest.mark.slow

SEND_SECONDS = 5.0
SIZES = {b"S1": 1000, b"S2": 1001}  # payload size tells the receiver who sent a frame


@dataclass
class Tally:
    nbytes: int = 0


def _frame_len(sender: bytes) -> int:
    return len(wire.encode_route("g", None, sender, bytes(SIZES[sender])))


async def _reader(c: NativeClient, tally: Tally, stop: trio.Event) -> None:
    # Count bytes only: the frames are of known sizes, so a lost, extra or
    # ERROR frame shows as a byte count that does not match what was sent,
    # and counting stays cheap enough for the readers to keep up.
    while not stop.is_set():
        with trio.move_on_after(0.2):
            data = await c.stream.receive_some(1 << 20)
            if not data:
                return
            tally.nbytes += len(data)


async def _sender(c: NativeClient, addr: bytes, sent: dict[bytes, int]) -> None:
    one = wire.encode_route("g", None, addr, bytes(SIZES[addr]))
    batch = one * 256
    deadline = trio.current_time() + SEND_SECONDS
    while trio.current_time() < deadline:
        await c.stream.send_all(batch)
        sent[addr] += 256


async def _run(address: tuple[str, int], stalled: bool) -> tuple[dict[bytes, Tally], dict[
        bytes, int], NativeClient | None, float]:
    members: dict[bytes, NativeClient] = {}
    for i in range(7 if not stalled else 8):
        addr = b"S1" if i == 0 else b"S2" if i == 1 else b"R%d" % i
        if stalled and i == 7:
            addr = b"STALLED"
        c = await NativeClient.open(*address)
        if addr == b"STALLED":
            c.raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        assert await c.connect("g", addr) == wire.Ok(1)
        members[addr] = c
    tallies = {a: Tally() for a in members if a != b"STALLED"}
    sent = {b"S1": 0, b"S2": 0}
    stop = trio.Event()
    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        for a, t in tallies.items():
            nursery.start_soon(_reader, members[a], t, stop)
        async with trio.open_nursery() as senders:
            senders.start_soon(_sender, members[b"S1"], b"S1", sent)
            senders.start_soon(_sender, members[b"S2"], b"S2", sent)
        # Wait (bounded) until every reader has everything, then stop them.
        with trio.move_on_after(30):
            while not all(_complete(a, t, sent, stalled) for a, t in tallies.items()):
                await trio.sleep(0.05)
        elapsed = trio.current_time() - t0
        stop.set()
    return tallies, sent, members.get(b"STALLED"), elapsed


SUSPECT = len(wire.encode(wire.Event("g", "suspect", b"STALLED", None, ())))


def _expected_bytes(addr: bytes, sent: dict[bytes, int], stalled: bool) -> int:
    """What ``addr`` must receive: the others' frames, plus, when the stalled
    member is cut off, one EVENT suspect for it."""
    return sum(n * _frame_len(s) for s, n in sent.items() if s != addr) + stalled * SUSPECT


def _complete(addr: bytes, t: Tally, sent: dict[bytes, int], stalled: bool) -> bool:
    return t.nbytes >= _expected_bytes(addr, sent, stalled)


def _check_everything_delivered(
    tallies: dict[bytes, Tally], sent: dict[bytes, int], stalled: bool
) -> int:
    """Every reading member got exactly what the others sent; returns the frame count."""
    frames = 0
    for addr, t in tallies.items():
        assert t.nbytes == _expected_bytes(addr, sent, stalled), (addr, t.nbytes, sent)
        frames += sum(n for s, n in sent.items() if s != addr)
    return frames


async def test_stalled_member_is_cut_off_and_the_group_keeps_flowing() -> None:
    rates = {}
    for stalled in (False, True):
        with RouterProcess(None, "--close-timeout", "60") as proc:
            tallies, sent, stalled_client, elapsed = await _run(("127.0.0.1", proc.port), stalled)
            delivered = _check_everything_delivered(tallies, sent, stalled)
            rates[stalled] = delivered / elapsed
            if stalled_client is not None:
                # Only now does the stalled member read: whole frames, then the ERROR, then EOF.
                frames = await stalled_client.recv_until_closed(timeout=20)
                assert frames, "the stalled member got nothing at all"
                last = frames[-1]
                assert isinstance(last, wire.Error) and last.code == "slow_consumer"
                assert all(isinstance(f, wire.Route) for f in frames[:-1])
            assert proc.stop() == 0
    ratio = rates[True] / rates[False]
    print(f"\nhealthy deliveries/s without a stalled member: {rates[False]:,.0f}; "
          f"with one: {rates[True]:,.0f} ({ratio:.0%})")


async def test_drop_policy_counts_drops(start_router: object) -> None:
    router: Server = await start_router(  # type: ignore[operator]
        slow_consumer_policy="drop", outbound_queue_bytes=2 * 1024 * 1024, max_frame=1024 * 1024)
    assert router.address is not None
    stalled = await NativeClient.open(*router.address)
    stalled.raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await stalled.connect("g", b"STALLED")
    a, b = await NativeClient.open(*router.address), await NativeClient.open(*router.address)
    await a.connect("g", b"A")
    await b.connect("g", b"B")
    n = 20_000
    payload = bytes(1000)
    tally = Tally()
    stop = trio.Event()
    frame = wire.encode_route("g", None, b"A", payload)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_reader, b, tally, stop)
        for _ in range(n // 100):
            await a.stream.send_all(frame * 100)
        with trio.fail_after(30):
            while tally.nbytes < n * len(frame):
                await trio.sleep(0.05)
        await trio.sleep(0.2)
        stop.set()
    assert tally.nbytes == n * len(frame)
    drops = router.hub.counters.drops.get("slow_consumer", 0)
    assert drops > 0
    # Dropped frames are counted once each, on the stalled member's connection only.
    sessions = [c.session for c in router.connections if c.session is not None]
    assert sum(s.outbox.dropped for s in sessions) == drops
    # The stalled member stays connected and registered under this policy.
    assert [e.addr for e in router.hub.table.members("g")] == [b"STALLED", b"A", b"B"]
