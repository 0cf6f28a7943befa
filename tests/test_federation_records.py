"""Membership records that scale (issue 30, docs/federation.md "Records"): versioned deltas and
chunked snapshots. Sans-IO state first (bytes in, the table out), then routers federated
through a real mosquitto on 127.0.0.1 that announces a Maximum Packet Size of 256 KiB.

Bounded by work, never by time: each test registers a fixed number of members and waits for
a fixed end state.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import trio

from gossiprouter.core.config import Config
from gossiprouter.federation.codec import Chunk, decode_record
from gossiprouter.federation.state import Federation
from gossiprouter.protocol import native as wire
from gossiprouter.sessions.base import Hub
from tests.carriers import Named
from tests.federation_routers import FED, table_members
from tests.nclient import NativeClient
from tests.test_bridge import MOSQUITTO, Mosquitto, bridge_of
from tests.test_stub import InProcessRouter, eventually

G = "fed"
LIMIT = 262_144  # the broker's max_packet_size in these tests
PHYS = (("10.0.0.1", 7800),)


def addr(i: int) -> bytes:
    """A 16-byte address, like a JGroups UUID."""
    return b"m-%014d" % i


# --------------------------------------------------------------------------- sans-IO


def fed(origin: str) -> Federation:
    f = Federation(Hub(Config()), origin, origin.upper(), lambda o, p: True, lambda: None)
    f.begin_sync()
    return f


def deliver(f: Federation, origin: str, records: list[tuple[str, str, bytes]]) -> None:
    for group, tag, payload in records:
        f.on_record(origin, group, payload, tag)


def test_a_late_joiner_converges_from_the_retained_snapshot_and_deltas_in_any_order() -> None:
    """A publishes a chunked snapshot, then deltas (joins, leaves, one coalesced away). B
    reads what the broker retains (last payload per topic) in a shuffled order, as a
    wildcard subscription may bring it, and ends with exactly A's members; the retained
    deltas before the snapshot are ignored."""
    a = fed("a")
    a.max_record = 4096
    retained: dict[tuple[str, str], bytes] = {}

    def publish(recs: list[tuple[str, str, bytes]]) -> None:
        for group, tag, payload in recs:
            if payload:
                retained[(group, tag)] = payload
            else:
                retained.pop((group, tag), None)

    carriers = {i: Named(f"c{i}") for i in range(400)}
    for i in range(300):
        a.table.connect(carriers[i], G, addr(i), f"n{i}", PHYS)
    publish(a.flush())
    assert sum(1 for g, t in retained if t.startswith("c")) >= 2  # chunked
    for i in range(300, 340):  # joins, one flush each: deltas
        a.table.connect(carriers[i], G, addr(i), f"n{i}", PHYS)
        publish(a.flush())
    for i in range(0, 40, 2):  # leaves
        a.table.disconnect(carriers[i], G, addr(i))
        publish(a.flush())
    a.table.connect(carriers[399], G, addr(399))  # joins and leaves within one flush
    a.table.disconnect(carriers[399], G, addr(399))
    assert a.flush() == []
    assert any(t.startswith("d") for _, t in retained)
    want = {addr(i) for i in range(340) if not (i < 40 and i % 2 == 0)}
    assert {e.addr for e in a.table.members(G)} == want
    for seed in range(3):
        b = fed("b")
        b.on_presence("a", a.presence())
        items = list(retained.items())
        random.Random(seed).shuffle(items)
        deliver(b, "a", [(g, t, p) for (g, t), p in items])
        assert {e.addr for e in b.table.members(G)} == want, seed
        assert b.stats.malformed == 0


def test_a_resync_reads_the_same_state_again_without_changing_anything() -> None:
    """B has applied A's records live; a resync hands it every retained record again, older
    deltas included: nothing leaves or joins, and later deltas still apply."""
    a, b = fed("a"), fed("b")
    b.on_presence("a", a.presence())
    retained: dict[tuple[str, str], bytes] = {}
    cs = [Named(f"c{i}") for i in range(60)]
    for i in range(50):
        a.table.connect(cs[i], G, addr(i))
        recs = a.flush()
        deliver(b, "a", recs)
        retained.update({(g, t): p for g, t, p in recs})
    w = Named("w")
    b.table.watch(w, G)
    b.begin_sync()
    b.on_presence("a", a.presence())
    deliver(b, "a", [(g, t, p) for (g, t), p in reversed(list(retained.items()))])
    b.end_sync()
    assert w.events == [] and {e.addr for e in b.table.members(G)} == {
        addr(i) for i in range(50)}
    a.table.disconnect(cs[3], G, addr(3))
    deliver(b, "a", a.flush())
    assert w.events == [("leave", addr(3))]


def test_every_record_fits_the_limit_and_a_join_costs_o1() -> None:
    """A group of 8,000 (about 400 kB): the snapshot is chunked within the limit; one join
    or leave after it publishes one delta whose size does not depend on the group's size."""
    a = fed("a")
    a.max_record = LIMIT - 1024
    for i in range(8_000):
        a.table.connect(Named(f"c{i}"), G, addr(i), f"n{i}", PHYS)
    snap = a.flush()
    assert len(snap) >= 2 and all(len(p) <= LIMIT - 1024 for _, _, p in snap)
    parts = [decode_record(p) for _, _, p in snap]
    assert sum(len(c.members) for c in parts if isinstance(c, Chunk)) == 8_000
    x = Named("x")
    a.table.connect(x, G, addr(99_999), "x", PHYS)
    join = a.flush()
    a.table.disconnect(x, G, addr(99_999))
    leave = a.flush()
    assert len(join) == len(leave) == 1
    assert len(join[0][2]) < 100 and len(leave[0][2]) < 60


# --------------------------------------------------------------------------- real mosquitto


@pytest.fixture
def small_broker(tmp_path: Path) -> Any:
    """mosquitto with a Maximum Packet Size of 256 KiB (announced in its CONNACK)."""
    if not shutil.which(MOSQUITTO):
        pytest.fail("mosquitto is not installed (scripts/setup installs it)")
    b = Mosquitto(tmp_path, f"allow_anonymous true\nmax_packet_size {LIMIT}\n")
    b.start()
    yield b
    b.stop()


async def router(nursery: trio.Nursery, broker: Mosquitto, name: str,
                 **options: Any) -> InProcessRouter:
    r = await InProcessRouter(nursery, bridge=broker.url, router_id=name,
                              **{**FED, **options}).start()
    await eventually(lambda: bridge_of(r).federation.synced
                     and bridge_of(r).max_packet == LIMIT, timeout=15, what=f"{name} up")
    return r


def register(r: InProcessRouter, lo: int, hi: int) -> dict[int, Named]:
    """Members ``lo`` to ``hi`` - 1 of G on ``r``: in-process table entries (cheap)."""
    assert r.server is not None
    table = r.server.hub.table
    out = {}
    for i in range(lo, hi):
        out[i] = Named(f"c{i}")
        table.connect(out[i], G, addr(i), f"member-{i}", PHYS)
    return out


async def test_a_group_of_20000_federates_through_a_256k_broker(
        nursery: trio.Nursery, small_broker: Mosquitto) -> None:
    """Acceptance 3a: 20,000 members on one router, a broker that refuses any packet over
    256 KiB: the other router lists every one (before: the record was never published)."""
    ra = await router(nursery, small_broker, "ra")
    rb = await router(nursery, small_broker, "rb")
    register(ra, 0, 20_000)
    want = {addr(i) for i in range(20_000)}
    await eventually(lambda: table_members(rb) == want, timeout=60,
                     what="20,000 members on rb")
    assert bridge_of(ra).stats.oversized == 0


async def test_a_late_router_and_a_broker_restart_converge_from_snapshot_and_deltas(
        nursery: trio.Nursery, small_broker: Mosquitto) -> None:
    """Acceptance 3b: a group beyond one packet, changed after its snapshot by deltas; a
    router started afterwards reads the retained snapshot and deltas and lists exactly
    the members; after a broker restart (it comes back empty) with changes while it was
    down, both converge again."""
    ra = await router(nursery, small_broker, "ra")
    cs = register(ra, 0, 6_000)  # about 330 kB of records: two chunks at least
    rb = await router(nursery, small_broker, "rb")
    want = {addr(i) for i in range(6_000)}
    await eventually(lambda: table_members(rb) == want, timeout=30, what="rb")
    assert ra.server is not None
    table = ra.server.hub.table
    fa = bridge_of(ra).federation
    for i in range(0, 200, 2):
        table.disconnect(cs[i], G, addr(i))
        want.discard(addr(i))
        await trio.sleep(0)  # a flush may go between them: deltas either way
    cs.update(register(ra, 6_000, 6_100))
    want |= {addr(i) for i in range(6_000, 6_100)}
    await eventually(lambda: table_members(rb) == want, timeout=30, what="rb, deltas")
    pub = fa.published[G]
    assert pub.chunks >= 2 and pub.slot > 0  # the state: a snapshot plus deltas after it
    rc = await router(nursery, small_broker, "rc")
    await eventually(lambda: table_members(rc) == want, timeout=30, what="late rc")

    small_broker.stop()
    await eventually(lambda: bridge_of(ra).state != "connected", what="ra cut off")
    for i in range(200, 300):
        table.disconnect(cs[i], G, addr(i))
        want.discard(addr(i))
    small_broker.start()
    await eventually(lambda: table_members(rb) == table_members(rc) == want
                     and bridge_of(rb).federation.synced and bridge_of(rc).federation.synced,
                     timeout=30, what="converged after the restart")
    register(ra, 7_000, 7_010)
    want |= {addr(i) for i in range(7_000, 7_010)}
    await eventually(lambda: table_members(rb) == table_members(rc) == want, timeout=30,
                     what="deltas after the restart")


async def test_a_churning_client_cannot_amplify_its_bytes_10x_into_the_broker(
        nursery: trio.Nursery, small_broker: Mosquitto) -> None:
    """Acceptance 3c: in a group of 1,000, one native client swaps its address 200 times
    (CONNECT the new one, DISCONNECT the old). What its router publishes on the members
    topics meanwhile is within 10x the bytes the client sent (before: the whole list per
    change, about 600x)."""
    ra = await router(nursery, small_broker, "ra")
    rb = await router(nursery, small_broker, "rb")
    register(ra, 0, 1_000)
    want = {addr(i) for i in range(1_000)}
    await eventually(lambda: table_members(rb) == want, timeout=30, what="rb")
    br = bridge_of(ra)
    published = [0]
    real = br._client.publish

    def counting(topic: str, payload: bytes = b"", *a: Any, **kw: Any) -> Any:
        if "/members/" in topic:
            published[0] += len(topic.encode()) + len(payload)
        return real(topic, payload, *a, **kw)

    br._client.publish = counting  # type: ignore[method-assign,assignment]
    assert ra.server is not None
    c = await NativeClient.to(ra.server)
    sent = 0
    prev: bytes | None = None
    for i in range(200):
        new = b"churn-%06d" % i
        for frame in ([wire.Connect(c.req(), G, new, "churner", PHYS)]
                      + ([] if prev is None else [wire.Disconnect(c.req(), G, prev)])):
            sent += len(wire.encode(frame))
            assert isinstance(await c.request(frame), wire.Ok)
        prev = new
    assert prev is not None
    want.add(prev)
    await eventually(lambda: table_members(rb) == want, timeout=30, what="rb after churn")
    await c.aclose()
    assert 0 < published[0] <= 10 * sent, (published[0], sent)


async def test_with_a_federation_key_each_chunk_and_delta_is_signed_and_accepted(
        nursery: trio.Nursery, small_broker: Mosquitto, tmp_path: Path) -> None:
    """Routers sharing a key: every chunk and delta carries its own signature (checked per
    topic), so a chunked group and its deltas reach a router started late; nothing is
    refused."""
    key = tmp_path / "fed.key"
    key.write_text("0123456789abcdef-shared\n")
    ra = await router(nursery, small_broker, "ra", federation_key_file=str(key))
    cs = register(ra, 0, 6_000)
    await eventually(lambda: G in bridge_of(ra).federation.published, what="published")
    assert ra.server is not None
    for i in range(10):
        ra.server.hub.table.disconnect(cs[i], G, addr(i))
        await trio.sleep(0)
    want = {addr(i) for i in range(10, 6_000)}
    rb = await router(nursery, small_broker, "rb", federation_key_file=str(key))
    await eventually(lambda: table_members(rb) == want, timeout=30, what="rb")
    assert bridge_of(ra).federation.published[G].chunks >= 2
    assert bridge_of(rb).federation.stats.unauthenticated == 0
