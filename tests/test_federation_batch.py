"""Routed messages batched per destination router (gossiprouter/federation/batch.py, issue 30):
the envelope in bytes, then in-process routers federated through a real mosquitto on
127.0.0.1 with raw native clients. What crossed is counted by the routers' own counters
(broker messages per peer, payloads per message), never timed."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import trio

from gossiprouter.federation.batch import ROOM, Batches, decode_batch
from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol import native as wire
from gossiprouter.protocol.jgroups_address import JAddress
from tests.federation_routers import G, everywhere, federation, member, routes
from tests.jgroups_clients import V2, V5, J2Client, J5Client, ip, uuid
from tests.test_bridge import MOSQUITTO, Mosquitto, bridge_of
from tests.test_bridge import broker as broker  # the fixture: mosquitto on a free port
from tests.test_stub import InProcessRouter, eventually


def test_a_batch_is_its_payloads_in_order_each_whole_within_the_limit() -> None:
    b = Batches(limit=100)
    b.add("r1", b"a" * 30)
    b.add("r2", b"only")
    b.add("r1", b"b" * 30)
    b.add("r1", b"c" * 60)  # with a and b: 136 bytes framed, beyond 100: a second message
    b.add("r1", b"d" * 200)  # beyond the limit alone: alone, as it is
    assert b.bytes == 30 + 4 + 30 + 60 + 200 + 5 * 4
    out = b.take()
    assert not b and b.bytes == 0
    assert [(o, n) for o, _, n in out] == [("r1", 2), ("r1", 1), ("r1", 1), ("r2", 1)]
    assert decode_batch(out[0][1]) == [b"a" * 30, b"b" * 30]
    assert [m for _, m, _ in out[1:]] == [b"c" * 60, b"d" * 200, b"only"]
    assert (b.stats.messages_out, b.stats.payloads_out) == (4, 5)


def test_the_limit_comes_from_the_brokers_packet_size_and_the_queue_bound() -> None:
    b = Batches()
    b.set_limit(4096, 1 << 24)
    assert b.limit == 4096 - ROOM
    b.set_limit(None, 1000)
    assert b.limit == 1000


@pytest.mark.parametrize("bad", [b"", b"\x00\x00\x00\x05abc", b"\x00\x00\x00\x01a",
                                 b"\x00\x00\x00\x01a\x00\x00", b"\x00\x00\x00\x00",
                                 b"\x00\x00\x00\x01a\x00\x00\x00\x00"])
def test_a_malformed_envelope_is_refused(bad: bytes) -> None:
    with pytest.raises(ValueError):
        decode_batch(bad)


def _interleaved(n: int, dests: list[bytes | None], size: int) -> tuple[bytes, list[bytes]]:
    """One write of ``n`` ROUTEs from s, each to the next of ``dests`` (None: the group)."""
    payloads = [b"%04d" % i + bytes(size) for i in range(n)]
    return b"".join(wire.encode(wire.Route(G, dests[i % len(dests)], b"s", p))
                    for i, p in enumerate(payloads)), payloads


async def test_what_one_read_routes_to_a_router_leaves_as_one_broker_message(
        nursery: trio.Nursery, broker: Mosquitto) -> None:
    """Interleaved destinations (two members on router B, one on C, the group): one write
    makes one broker message to B and one to C, however many runs of frames it holds, and
    each frame reaches its member in order."""
    ra, rb, rc = await federation(nursery, broker, 3)
    s, near = await member(ra, b"s"), await member(ra, b"near")
    b1, b2, c1 = await member(rb, b"b1"), await member(rb, b"b2"), await member(rc, b"c1")
    await everywhere([ra, rb, rc], {b"s", b"near", b"b1", b"b2", b"c1"})
    ba = bridge_of(ra)
    links = {r: ba.liveness.link(bridge_of(r).origin) for r in (rb, rc)}
    before = {r: link.sent for r, link in links.items()}
    data, payloads = _interleaved(12, [b"b1", None, b"b2", b"c1"], 10)
    await s.send_raw(data)
    await s.round_trip()
    # 12 frames: 3 unicasts to b1, 3 to b2, 3 to c1, 3 multicasts; B gets 9 runs, C 6.
    await eventually(lambda: bridge_of(rb).batches.stats.payloads_in == 9
                     and bridge_of(rc).batches.stats.payloads_in == 6)
    assert {r: link.sent - before[r] for r, link in links.items()} == {rb: 1, rc: 1}
    for r in (rb, rc):
        assert bridge_of(r).batches.stats.messages_in == 1
    assert [f.payload for f in await routes(b1)] == [payloads[i] for i in (0, 1, 4, 5, 8, 9)]
    assert [f.payload for f in await routes(b2)] == [payloads[i] for i in (1, 2, 5, 6, 9, 10)]
    assert [f.payload for f in await routes(c1)] == [payloads[i] for i in (1, 3, 5, 7, 9, 11)]
    assert [f.payload for f in await routes(near)] == [payloads[i] for i in (1, 5, 9)]


@pytest.fixture
def small_broker(tmp_path: Path) -> Iterator[Mosquitto]:
    """mosquitto with max_packet_size 4096: announced in CONNACK; a larger PUBLISH makes it
    cut the router off."""
    if not shutil.which(MOSQUITTO):
        pytest.fail("mosquitto is not installed (scripts/setup installs it)")
    b = Mosquitto(tmp_path, "allow_anonymous true\nmax_packet_size 4096\n")
    b.start()
    yield b
    b.stop()


async def test_a_batch_never_exceeds_the_brokers_maximum_packet_size(
        nursery: trio.Nursery, small_broker: Mosquitto) -> None:
    """40 frames of 500 bytes for router B in one write leave in several messages, each
    within the broker's 4,096 bytes; all arrive, in order, and the link stays up."""
    ra, rb = await federation(nursery, small_broker, 2)
    s = await member(ra, b"s")
    b1, b2 = await member(rb, b"b1"), await member(rb, b"b2")
    await everywhere([ra, rb], {b"s", b"b1", b"b2"})
    ba, bb = bridge_of(ra), bridge_of(rb)
    assert ba.batches.limit == 4096 - ROOM
    data, payloads = _interleaved(40, [b"b1", b"b2"], 500)
    await s.send_raw(data)
    await eventually(lambda: bb.federation.stats.routed_in == 40)
    assert [f.payload for f in await routes(b1)] == payloads[0::2]
    assert [f.payload for f in await routes(b2)] == payloads[1::2]
    sent = ba.liveness.link(bb.origin).sent
    # 40 payloads of about 540 bytes: at least 8 messages within 3,072 bytes, and far fewer
    # than one per frame.
    assert 8 <= sent < 40 and bb.batches.stats.messages_in == sent
    assert ba.stats.connects == 1 and ba.stats.oversized == 0
    assert ba.federation.stats.not_forwarded == 0


@pytest.mark.parametrize("qos", [0, 1])
async def test_a_federated_groups_local_copies_stay_on_the_fast_path(
        nursery: trio.Nursery, broker: Mosquitto, qos: int) -> None:
    """A group with a member on another router: the relay thread relays the local copies of
    its multicasts (and unicasts) itself; their remote share it publishes itself through its
    broker link (routed messages at QoS 0), or hands up to Python, which sends it on (QoS 1:
    paho's). Every frame reaches every receiver once, in order. Counted by the fast path's
    and the link's own counters: without them the thread relays none of these."""
    ra, rb = await federation(nursery, broker, 2, fast_path="on", bridge_qos=qos)
    s, near = await member(ra, b"s"), await member(ra, b"near")
    far = await member(rb, b"far")
    await everywhere([ra, rb], {b"s", b"near", b"far"})
    assert ra.server is not None and ra.server.fast is not None
    hub, fast = ra.server.hub, ra.server.fast
    ba = bridge_of(ra)
    assert fast.link.routing == (qos == 0)
    assert ba.view()["relay_thread_routes"] == (qos == 0)
    hub.sync()
    relayed, remote = hub.counters.fast_relayed, fast.remote.frames
    wakeups, flushes = ba.route_wakeups, fast.remote.flushes
    published = ba.batches.stats.payloads_out
    assert rb.server is not None
    rb.server.hub.sync()
    rb_delivered = rb.server.hub.counters.delivered
    sent: list[bytes] = []
    # Ten writes of 30 frames (multicast, to far, to near, in turn), each read on its own (a
    # PING's PONG between them): the first teaches the thread, the others it repeats.
    for k in range(10):
        payloads = [b"%d-%02d" % (k, i) for i in range(30)]
        data = b"".join(wire.encode(wire.Route(G, [None, b"far", b"near"][i % 3], b"s", p))
                        for i, p in enumerate(payloads))
        await s.send_raw(data)
        await s.round_trip()
        sent += payloads
    fb = bridge_of(rb).federation
    await eventually(lambda: fb.stats.routed_in == 200)
    assert [f.payload for f in await routes(far)] == [p for i, p in enumerate(sent)
                                                      if i % 3 != 2]
    assert [f.payload for f in await routes(near)] == [p for i, p in enumerate(sent)
                                                       if i % 3 != 1]
    hub.sync()
    rb.server.hub.sync()
    # Frames from another router count as the federation's (delivered_in), not as the
    # receiving router's own deliveries, whoever delivered them.
    assert rb.server.hub.counters.delivered == rb_delivered
    # At least the nine repeated writes: 270 frames relayed by the thread, the 180 of them
    # with a remote share.
    assert hub.counters.fast_relayed - relayed >= 270
    if qos == 0:
        # Published by the thread: Python neither saw them nor woke for them. Each write's
        # runs (multicast, far, near...) are route payloads, one message per write.
        assert fast.remote.frames == remote
        assert ba.batches.stats.payloads_out - published >= 9 * 20
        # ... and read by the receiving router's thread: unicasts to far, each write on its
        # own (a multicast's route waits in Python while Moves watches far, new on rb:
        # MOVE_WINDOW; which of the writes above held one depends on how they were read).
        assert rb.server.fast is not None
        link_b = rb.server.fast.link
        before = link_b.read_in
        for k in range(50):
            await s.send_raw(wire.encode(wire.Route(G, b"far", b"s", b"u%d" % k)))
            while not ((f := await far.recv()) and isinstance(f, wire.Route)
                       and f.payload == b"u%d" % k):
                pass
            rb.server.hub.sync()
            if link_b.read_in - before >= 3:
                break
        assert link_b.read_in - before >= 3
        assert ba.federation.stats.routed_out >= 180
        assert ba.route_wakeups - wakeups < 9
        return
    # Handed up and sent on by Python, at the end of each batch of upcalls, without waking
    # the bridge's end-of-tick task (which only Python's own routing of the first write
    # needs).
    assert fast.remote.frames - remote >= 180
    assert fast.remote.flushes - flushes >= 9
    assert ba.route_wakeups - wakeups < 9


@pytest.mark.parametrize("qos", [0, 1])
async def test_a_federated_jgroups5_groups_local_copies_stay_on_the_fast_path(
        nursery: trio.Nursery, broker: Mosquitto, qos: int) -> None:
    """The same for a JGroups 5.x group: the relay thread relays the local copies (the
    sender's own multicast copy included); the remote share it publishes itself (QoS 0), or
    hands up (REMOTE_J5) for Python to send on as it sends its own routing's (QoS 1). Every
    frame reaches every receiver once, in order, as sent. Without it, a 5.x group with a
    member on another router stays in Python whole: the thread relays none of these."""
    ra, rb = await federation(nursery, broker, 2, fast_path="on", bridge_qos=qos)
    assert ra.server is not None and ra.server.fast is not None and rb.server is not None
    (s, near, far), (a, n, f) = await _jgroups_members(ra, rb, J5Client)
    hub, fast = ra.server.hub, ra.server.fast
    ba = bridge_of(ra)
    hub.sync()
    relayed, remote = hub.counters.fast_relayed, fast.remote.frames
    published = ba.batches.stats.payloads_out
    # Ten writes of 30 MESSAGEs (multicast, to far, to near, in turn), each read on its own
    # (a HEARTBEAT's echo between them): the first teaches the thread, the others it repeats.
    sent: list[bytes] = []
    own: list[bytes] = []  # the sender's copies of its multicasts, read before each echo
    for k in range(10):
        frames = [j5.message("demo", [None, f, n][i % 3], a, b"%d-%02d" % (k, i))
                  for i in range(30)]
        await s.send_raw(b"".join(frames))
        own += [ev.raw for ev in await s.round_trip() if isinstance(ev, j5.Message)]
        sent += frames
    fb = bridge_of(rb).federation
    await eventually(lambda: fb.stats.routed_in == 200)

    assert await _messages(far, 200) == [m for i, m in enumerate(sent) if i % 3 != 2]
    assert await _messages(near, 200) == [m for i, m in enumerate(sent) if i % 3 != 1]
    own += await _messages(s, 100 - len(own))
    assert own == [m for i, m in enumerate(sent) if i % 3 == 0]
    hub.sync()
    # The nine repeated writes: 270 frames relayed by the thread, the 180 multicasts and
    # unicasts to far with a remote share...
    assert hub.counters.fast_relayed - relayed >= 270
    if qos == 0:  # ... published by the thread (Python never saw them): 20 payloads a write
        assert fast.remote.frames == remote and fast.by_kind[fast.mod.REMOTE_J5] == 0
        assert ba.batches.stats.payloads_out - published >= 9 * 20
        # ... and read by the receiving router's thread: unicasts to far, each write on its
        # own (a multicast's route waits in Python while Moves watches the group: far is new
        # on rb), byte-exact.
        link_b = rb.server.fast.link if rb.server.fast is not None else None
        assert link_b is not None
        before = link_b.read_in
        for k in range(50):
            frame = await s.message("demo", f, a, b"u%d" % k)
            assert await _messages(far, 1) == [frame]
            rb.server.hub.sync()
            if link_b.read_in - before >= 3:
                break
        assert link_b.read_in - before >= 3
    else:  # ... sent on by Python
        assert fast.remote.frames - remote >= 180
        assert fast.by_kind[fast.mod.REMOTE_J5] >= 9


async def test_a_federated_jgroups2_groups_local_copies_stay_on_the_fast_path(
        nursery: trio.Nursery, broker: Mosquitto) -> None:
    """The same for a JGroups 2.12 group, whose frames every receiver gets re-wrapped: the
    thread relays the local copies, and hands each frame up as received (REMOTE_J2) for
    Python to re-wrap and send on. Every message reaches every receiver once, in order, as
    the router re-wraps it. Without it, a 2.12 group with a member on another router stays in
    Python whole: the thread relays none of these."""
    ra, rb = await federation(nursery, broker, 2, fast_path="on")
    assert ra.server is not None and ra.server.fast is not None and rb.server is not None
    (s, near, far), (_, n, f) = await _jgroups_members(ra, rb, J2Client)
    hub, fast = ra.server.hub, ra.server.fast
    hub.sync()
    relayed, remote = hub.counters.fast_relayed, fast.remote.frames

    # Each write read on its own: the next goes once near has this one's 20 messages (a
    # 2.12 client cannot tell a GOSSIP_GET reply from messages around it: no round trip).
    sent: list[bytes] = []
    at_near: list[bytes] = []
    for k in range(10):
        payloads = [b"%d-%02d" % (k, i) for i in range(30)]
        await s.send_raw(b"".join(j2.message("demo", [None, f, n][i % 3], p)
                                  for i, p in enumerate(payloads)))
        at_near += await _messages(near, 20)
        sent += payloads
    fb = bridge_of(rb).federation
    await eventually(lambda: fb.stats.routed_in == 200)
    assert await _messages(far, 200) == [m for i, m in enumerate(sent) if i % 3 != 2]
    assert at_near == [m for i, m in enumerate(sent) if i % 3 != 1]
    assert await _messages(s, 100) == [m for i, m in enumerate(sent) if i % 3 == 0]
    hub.sync()
    # The nine repeated writes: 270 frames relayed by the thread, the 180 with a remote share
    # that Python re-wrapped and sent on.
    assert hub.counters.fast_relayed - relayed >= 270
    assert fast.remote.frames - remote >= 180
    assert fast.by_kind[fast.mod.REMOTE_J2] >= 9


async def _messages(c: J2Client | J5Client, count: int) -> list[bytes]:
    """The next ``count`` messages ``c`` receives, skipping other events: a 5.x MESSAGE's
    whole frame, a 2.12 message's payload."""
    got: list[bytes] = []
    while len(got) < count:
        ev = await c.recv()
        if isinstance(ev, j5.Message):
            got.append(ev.raw)
        elif isinstance(ev, j2.Message):
            got.append(ev.payload)
    return got


C = TypeVar("C", J2Client, J5Client)


async def _jgroups_members(ra: InProcessRouter, rb: InProcessRouter, client: type[C]
                           ) -> tuple[tuple[C, C, C], tuple[JAddress, JAddress, JAddress]]:
    """Members s and near of JGroups group "demo" on router ``ra``, far on ``rb`` (clients of
    ``client``'s version), listed on both: their clients and addresses."""
    assert ra.server is not None and rb.server is not None
    v = client.version
    addrs = (uuid(1, v), uuid(2, v), uuid(3, v))
    clients = (await client.open(*ra.server.address),  # type: ignore[misc]
               await client.open(*ra.server.address),  # type: ignore[misc]
               await client.open(*rb.server.address))  # type: ignore[misc]
    for c, addr, port in zip(clients, addrs, (7800, 7801, 7802), strict=True):
        if isinstance(c, J2Client):
            assert (await c.connect("demo", addr, addr.key.hex(), [ip(port, V2)])).ok
        else:
            await c.register("demo", addr, addr.key.hex(), ip(port, V5))
    await everywhere([ra, rb], {x.key for x in addrs}, f"jgroups{2 if v == V2 else 5}:demo")
    return clients, addrs
