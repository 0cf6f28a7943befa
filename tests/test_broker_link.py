"""The relay thread's broker link (server/broker_link.py, relay/broker.c; issue 30): the bytes
it writes are those Python would write.

A real ``Relay`` thread, a native connection of a socket pair as the sender, and the other end
of another socket pair as the "broker": the test reads what the thread publishes and checks it
with the receiving side's own code (paho_fast.read_publish, signing.Verifier, batch.decode_batch,
codec.decode_route, frames.check_routed), byte for byte against codec.encode_route. Bounds,
ordering with Python's writes, breaking and closing are checked the same way.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import random
import socket
from collections.abc import Iterator

import pytest

from gossiprouter.federation.batch import BATCH_PROPERTY, FORMAT, decode_batch
from gossiprouter.federation.codec import decode_route, encode_route
from gossiprouter.federation.frames import check_routed
from gossiprouter.federation.link_side import FROM_PROPERTY, SENT_PROPERTY
from gossiprouter.federation.signing import MAC_PROPERTY, Signer, Verifier
from gossiprouter.protocol import native as wire
from gossiprouter.server import fastpath
from tests.broker_link_rig import KEY, TOPIC, G, Rig


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig()
    yield r
    r.close()


def test_hmac_sha256_is_pythons() -> None:
    mod = fastpath._relay
    assert mod is not None
    relay = mod.Relay()
    rng = random.Random(30)
    for size in (0, 1, 55, 56, 63, 64, 65, 119, 120, 1000, 70_000):
        for klen in (0, 1, 16, 32, 63, 64, 65, 200):
            key, data = rng.randbytes(klen), rng.randbytes(size)
            assert relay._hmac(key, data) == hmac.new(key, data, hashlib.sha256).hexdigest()


def test_a_run_of_frames_is_one_signed_route_payload_as_python_encodes_it(rig: Rig) -> None:
    prefix = rig.learn(b"far")
    frames = [wire.encode(wire.Route(G, b"far", b"s", b"p%d" % i)) for i in range(5)]
    rig.send(frames)
    assert rig.local_bytes(sum(map(len, frames))) == b"".join(frames)  # the local copy
    [(topic, payload, users)] = rig.publishes(1)
    assert topic == TOPIC
    assert [k for k, _ in users] == [FROM_PROPERTY, SENT_PROPERTY, MAC_PROPERTY]
    assert dict(users)[FROM_PROPERTY] == "me"
    # The receiving router's own checks accept it, once: a replay is refused.
    v = Verifier(KEY)
    mac = dict(users)[MAC_PROPERTY]
    assert mac.startswith("run1t:1:")
    assert v.check(topic, payload, mac, writer="me", kind="route") is None
    assert v.check(topic, payload, mac, writer="me", kind="route") == "replayed"
    assert v.check(topic, payload + b"x", mac, writer="me", kind="route") == "bad signature"
    rt = decode_route(payload)
    assert (rt.origin, rt.group, rt.dest, rt.frame_count, rt.handed) == ("me", G, b"far", 5,
                                                                         False)
    assert payload == encode_route("me", G, b"far", 5, b"".join(frames), seq=rt.seq)
    assert payload[2:2 + len(prefix)] == prefix
    assert check_routed(G, rt.frames, 5, 65536, {b"s"}) is None
    # The next read: the next fan-out number, one sequence with Python's (fanout()).
    python_number = rig.relay.fanout()
    rig.send(frames[:1])
    [(_, payload2, users2)] = rig.publishes(1)
    assert decode_route(payload2).seq == python_number + 1 == rt.seq + 2
    assert dict(users2)[MAC_PROPERTY].startswith("run1t:2:")
    info = rig.relay.link_collect()
    assert info[0] == [(rig.dst, 2, 2, 6, 0, 0)] and info[1] == []


def test_one_read_of_several_routes_is_one_envelope_per_router(rig: Rig) -> None:
    rig.learn(b"far")
    rig.learn(None)
    frames = [wire.encode(wire.Route(G, d, b"s", b"q%d" % i))
              for i, d in enumerate([b"far", b"far", None, b"far", None])]
    rig.send(frames)
    [(topic, envelope, users)] = rig.publishes(1)
    assert dict(users)[BATCH_PROPERTY] == FORMAT
    assert Verifier(KEY).check(topic, envelope, dict(users)[MAC_PROPERTY], writer="me",
                               kind="route") is None
    routes = [decode_route(p) for p in decode_batch(envelope)]
    assert [(r.dest, r.frame_count) for r in routes] == [(b"far", 2), (None, 1), (b"far", 1),
                                                         (None, 1)]
    assert b"".join(r.frames for r in routes) == b"".join(frames)
    seqs = [r.seq for r in routes]
    assert seqs == sorted(seqs) and len(set(seqs)) == 4


def test_pythons_writes_and_the_threads_keep_their_order(rig: Rig) -> None:
    rig.learn(b"far")
    frame = wire.encode(wire.Route(G, b"far", b"s", b"z"))
    ping = b"\xc0\x00"  # an MQTT PINGREQ, as paho writes it
    for _ in range(20):
        assert rig.relay.link_write(ping) == 2
        rig.send([frame])
        # Python's write came first, then the thread's PUBLISH for the frame after it.
        assert rig._packet() == ping
        rig.publishes(1)


def test_a_stale_route_goes_back_to_python(rig: Rig) -> None:
    rig.learn(b"far")
    frame = wire.encode(wire.Route(G, b"far", b"s", b"z"))
    rig.relay.link_invalidate()  # (a router's liveness changed, say)
    rig.send([frame])
    ups = rig.upcalls()
    assert ups[0][1] == rig.mod.DATA and ups[0][2] == frame  # Python routes it, and learns
    assert rig.relay.link_pending() == 0
    rig.relay.link_disable()
    rig.learn(b"far")  # fed targets while the link does not route: a remote share for Python
    rig.send([frame])
    ups = rig.upcalls()
    assert ups[0][1] == rig.mod.REMOTE and ups[0][2] == frame


def test_the_bounds_drop_and_count_as_python_does() -> None:
    frame = wire.encode(wire.Route(G, b"far", b"s", b"y" * 400))
    # bridge_queue_bytes below one routed message: none leaves, each counted lost.
    with Rig(queue_limit=300) as r:
        r.learn(b"far")
        r.send([frame] * 3)
        r.local_bytes(3 * len(frame))
        rows, _, oversized, queue_full, _, _, _ = r.collect()
        assert rows == [(r.dst, 0, 0, 0, 1, 3)] and (oversized, queue_full) == (0, 1)
    # The broker's Maximum Packet Size below one message with the topic's bound (200).
    with Rig(max_packet=500) as r:
        r.learn(b"far")
        r.send([frame])
        r.local_bytes(len(frame))
        rows, _, oversized, queue_full, _, _, _ = r.collect()
        assert rows == [(r.dst, 0, 0, 0, 1, 1)] and (oversized, queue_full) == (1, 0)
    # An envelope's bound: one read of alternating routes makes 10 payloads, cut into
    # messages within ``limit``.
    with Rig(limit=1000) as r:
        r.learn(b"far")
        r.learn(None)
        frames = [wire.encode(wire.Route(G, [b"far", None][i % 2], b"s", b"w" * 300))
                  for i in range(10)]
        r.send(frames)
        got: list[int] = []
        while sum(got) < 10:
            [(_, payload, users)] = r.publishes(1)
            got.append(len(decode_batch(payload)) if BATCH_PROPERTY in dict(users) else 1)
            assert len(payload) <= 1000
        assert len(got) >= 4


def test_without_a_key_nothing_is_signed() -> None:
    with Rig(key=b"") as r:
        r.learn(b"far")
        r.send([wire.encode(wire.Route(G, b"far", b"s", b"u"))])
        [(_, _, users)] = r.publishes(1)
        assert [k for k, _ in users] == [FROM_PROPERTY, SENT_PROPERTY]


def test_a_broken_link_raises_for_python_and_routes_through_it_no_more(rig: Rig) -> None:
    rig.learn(b"far")
    rig.broker_peer.close()
    with pytest.raises(OSError):
        for _ in range(100):  # the peer's RST comes back after the first write
            rig.relay.link_write(b"\xc0\x00")
    frame = wire.encode(wire.Route(G, b"far", b"s", b"v"))
    rig.send([frame])
    ups = rig.upcalls()  # its remote share goes up to Python, which owns the broken session
    assert ups[0][1] == rig.mod.REMOTE
    assert rig.relay.link_collect()[4] >= 1  # a write error counted
    rig.broker_peer = socket.socket()  # (closed above; the fixture closes this one)


def test_signers_and_the_threads_runs_never_collide() -> None:
    # Python's runs are 16 hex digits (peers.py); the thread's run adds a 't'.
    python_run = Signer(KEY, os.urandom(8).hex()).run
    assert len(python_run) == 16 and "t" not in python_run
