"""JGroups 5.x members get one reconnect (issue 17): the router avoids closing them.

A 5.5.6 RouterStub survives only one router-side close of its connection, and JGroups
retransmits lost messages itself (NAKACK2, UNICAST3). So a JGroups frame above the router's
limit is skipped rather than refused, a slow JGroups receiver has frames dropped rather than
being disconnected, and a clean leave's trailing frames are routed quietly. Real sockets, the
raw 5.x client of tests/jgroups_clients.py.
"""

from __future__ import annotations

import logging

import pytest
import trio

from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol.jgroups_address import JAddress
from gossiprouter.server.listener import Server
from tests.conftest import RouterFactory
from tests.jgroups_clients import V5, J5Client, ip, uuid
from tests.quiet import nothing_more

A5, B5, C5 = uuid(1, V5), uuid(2, V5), uuid(3, V5)


async def _member(router: Server, group: str, addr: JAddress, name: str) -> J5Client:
    assert router.address is not None
    c = await J5Client.open(*router.address)
    await c.register(group, addr, name, ip(7800, V5))
    await c.sync()
    return c


async def test_oversized_frame_skipped_later_frames_routed(
        start_router: RouterFactory, caplog: pytest.LogCaptureFixture) -> None:
    """A frame above jgroups_max_frame streams past without being buffered (the budget gauge
    never moves), is counted and logged once per connection; the sender stays connected and
    its next frames, in the same chunk and later, are routed."""
    router = await start_router(jgroups_max_frame=1 << 20)
    a = await _member(router, "demo", A5, "A")
    b = await _member(router, "demo", B5, "B")
    big = j5.message("demo", B5, A5, b"x" * (2 << 20))
    after = j5.message("demo", B5, A5, b"after")
    peak = 0
    for i in range(0, len(big), 256 * 1024):
        await a.send_raw(big[i : i + 256 * 1024])
        await trio.sleep(0)
        peak = max(peak, router.hub.counters.partial_bytes)
    await a.send_raw(after)
    ev = await b.recv()
    assert isinstance(ev, j5.Message) and ev.raw == after
    # A second oversized frame followed by a small one in the same write.
    await a.send_raw(big + after)
    ev = await b.recv()
    assert isinstance(ev, j5.Message) and ev.raw == after
    assert router.hub.counters.drops.get("frame_too_large") == 2
    assert peak == 0 and router.hub.counters.partial_bytes == 0
    warnings = [r for r in caplog.records
                if r.levelno == logging.WARNING and "skipping a message" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert [m.name for m in (await b.get_members("demo"))[0].members] == ["A", "B"]
    assert not a.eof and router.hub.counters.protocol_errors == 0


async def test_12_mb_frame_routed_under_the_default_limit(router: Server) -> None:
    """A 12 MB message without FRAG2 is delivered (the Java router has no limit; max_frame,
    8 MiB, used to close the sender with frame_too_large)."""
    a = await _member(router, "demo", A5, "A")
    b = await _member(router, "demo", B5, "B")
    frame = j5.message("demo", B5, A5, bytes(range(256)) * (12_000_000 // 256))
    assert len(frame) > router.config.max_frame

    async def send() -> None:
        await a.send_raw(frame)

    async with trio.open_nursery() as n:
        n.start_soon(send)
        ev = await b.recv(timeout=30)
    assert isinstance(ev, j5.Message) and ev.raw == frame
    assert router.hub.counters.drops.get("frame_too_large", 0) == 0
    assert router.hub.counters.partial_bytes == 0


async def test_slow_receiver_gets_drops_not_a_close(start_router: RouterFactory) -> None:
    """By default a 5.x receiver whose queue is full has frames dropped (counted as
    slow_consumer) and is not disconnected: it is still a member, and once it reads again it
    finds a stream in sync (whole frames, then the echo of its heartbeat)."""
    router = await start_router(max_frame=64 * 1024, outbound_queue_bytes=256 * 1024)
    a = await _member(router, "demo", A5, "A")
    stalled = await _member(router, "demo", B5, "B")
    payload = b"p" * 60_000
    counters = router.hub.counters
    with trio.fail_after(30):
        for _ in range(1000):  # 60 MB at most: beyond what kernel buffers can absorb
            await a.message("demo", None, A5, payload)
            while not isinstance(await a.recv(timeout=10), j5.Message):
                pass  # a reads its own copy, so only the stalled member falls behind
            if counters.drops.get("slow_consumer", 0) >= 20:
                break
    assert counters.drops.get("slow_consumer", 0) >= 20
    assert counters.slow_consumer_disconnects == 0
    assert [m.name for m in (await a.get_members("demo"))[0].members] == ["A", "B"]
    # The stalled member reads again: only whole messages, then its heartbeat's echo.
    await stalled.send_raw(j5.heartbeat())
    with trio.fail_after(30):
        n = 0
        while not isinstance(ev := await stalled.recv(timeout=10), j5.Heartbeat):
            assert isinstance(ev, j5.Message) and len(ev.raw) > 60_000
            n += 1
    assert 0 < n < 1000
    assert not stalled.eof and not stalled.close_marker


async def test_clean_leave_logs_no_warning(
        router: Server, caplog: pytest.LogCaptureFixture) -> None:
    """A 5.x TUNNEL member leaving cleanly sends UNICAST3 ACKs after its UNREGISTER, and a
    TCPGOSSIP one UNREGISTERs twice: neither is a warning. The trailing frames are routed, as
    the Java router does; both are counted and logged at debug. The leave line names the
    member as the join line does."""
    caplog.set_level(logging.DEBUG, logger="gossiprouter")
    a = await _member(router, "demo", A5, "A")
    b = await _member(router, "demo", B5, "B")
    await a.unregister("demo", A5)
    ack = await a.message("demo", B5, A5, b"ack")
    await a.unregister("demo", A5)  # TCPGOSSIP: stop() and handleDisconnect()
    await a.sync()
    ev = await b.recv()
    assert isinstance(ev, j5.Message) and ev.raw == ack
    await a.send_raw(j5.close_marker())
    assert await a.recv_until_closed() == []
    await nothing_more(b, 0.05)
    fin = router.hub.counters.frames_in
    assert fin.get("jgroups5_after_leave") == 1
    assert fin.get("jgroups5_unregister_repeated") == 1
    assert router.hub.counters.drops.get("not_member", 0) == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    joined = [r.getMessage() for r in caplog.records if r.getMessage().startswith("joined A ")]
    left = [r.getMessage() for r in caplog.records if r.getMessage().startswith("left A ")]
    assert len(joined) == 1 and len(left) == 1, (joined, left)
    assert joined[0].split(" via ")[0][len("joined"):] == left[0].split(" via ")[0][len("left"):]


async def test_after_leave_window_is_bounded(
        router: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past AFTER_LEAVE, a frame from an address this connection unregistered is again
    dropped as not_member (the sender check is only relaxed for a leave's tail)."""
    from gossiprouter.sessions import jgroups_common

    monkeypatch.setattr(jgroups_common, "AFTER_LEAVE", 0.05)
    a = await _member(router, "demo", A5, "A")
    b = await _member(router, "demo", B5, "B")
    await a.unregister("demo", A5)
    await a.sync()
    await trio.sleep(0.1)
    await a.message("demo", B5, A5, b"late")
    await a.sync()
    assert router.hub.counters.drops.get("not_member") == 1
    await nothing_more(b, 0.05)


async def test_frame_larger_than_the_queue_bound_still_delivered(
        start_router: RouterFactory) -> None:
    """jgroups_max_frame may exceed outbound_queue_bytes: an empty queue takes one frame of any
    size (here without direct sends, so every frame goes through the queue), instead of the
    frame being dropped for every receiver as a slow consumer."""
    router = await start_router(max_frame=64 * 1024, outbound_queue_bytes=256 * 1024,
                                direct_send=False)
    a = await _member(router, "demo", A5, "A")
    b = await _member(router, "demo", B5, "B")
    frame = await a.message("demo", B5, A5, b"y" * (1 << 20))
    ev = await b.recv(timeout=10)
    assert isinstance(ev, j5.Message) and ev.raw == frame
    assert router.hub.counters.drops.get("slow_consumer", 0) == 0
