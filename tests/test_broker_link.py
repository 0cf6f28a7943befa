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
import select
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest

from gossiprouter.federation.batch import BATCH_PROPERTY, FORMAT, decode_batch
from gossiprouter.federation.codec import decode_route, encode_route
from gossiprouter.federation.frames import check_routed
from gossiprouter.federation.link_side import FROM_PROPERTY, SENT_PROPERTY
from gossiprouter.federation.paho_fast import property_key, read_publish, user_properties
from gossiprouter.federation.signing import MAC_PROPERTY, Signer, Verifier
from gossiprouter.protocol import native as wire
from gossiprouter.protocol.native_scan import NativeScanner
from gossiprouter.server import fastpath

G = "grp"
TOPIC = "gr/%fed/me/route/other"
KEY = b"k" * 32


def _params(key: bytes = KEY, limit: int = 1 << 20, max_packet: int = 0,
            queue_limit: int = 1 << 20) -> tuple[Any, ...]:
    origin = user_properties([(FROM_PROPERTY, "me")])
    sent = property_key(SENT_PROPERTY)
    batch = user_properties([(BATCH_PROPERTY, FORMAT)])
    mac = property_key(MAC_PROPERTY) if key else b""
    return (key, "run1t", origin + sent + batch + mac, len(origin), len(sent), len(batch),
            len(mac), limit, max_packet, queue_limit)


class Rig:
    """A Relay with a sender connection (frames in), a local receiver, and a broker link."""

    def __init__(self, key: bytes = KEY, **limits: int) -> None:
        mod = fastpath._relay
        assert mod is not None
        self.mod = mod
        self.relay = mod.Relay()
        self.tx, self.tx_peer = socket.socketpair()  # the sender's connection
        self.rx, self.rx_peer = socket.socketpair()  # a local receiver
        self.broker, self.broker_peer = socket.socketpair()
        self.broker_peer.settimeout(10)
        self.rx_peer.settimeout(10)
        self.sender = self.relay.open(self.tx.fileno(), mod.NATIVE, 65536)
        self.local = self.relay.open(self.rx.fileno(), mod.NATIVE, 65536)
        assert self.relay.attach(self.local)
        self.relay.link_open(self.broker.fileno())
        self.relay.link_enable(*_params(key, **limits))
        self.dst = self.relay.link_dst(TOPIC.encode(), 200)
        self.relay.start()
        self.scanner = NativeScanner(65536, relay=True)
        self.buf = b""

    def learn(self, dest: bytes | None, fed: bool = True) -> bytes:
        """Learn the route of ROUTE frames from ``b"s"`` to ``dest``; its header start."""
        frame = wire.encode(wire.Route(G, dest, b"s", b"x"))
        list(self.scanner.scan(frame))
        key = self.scanner.header(frame, 4)
        assert key is not None
        prefix = b"\x96" + b"".join(msgpack.packb(x) for x in ("me", G, dest))
        assert self.relay.learn(self.sender, key, b"", 0, 65536, [self.local], 1, True,
                                [(self.dst, prefix)] if fed else None)
        return prefix

    def send(self, frames: list[bytes]) -> None:
        self.relay.read(self.sender, False)
        self.tx_peer.sendall(b"".join(frames))

    def local_bytes(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            out += self.rx_peer.recv(65536)
        return out

    def publishes(self, n: int) -> list[tuple[str, bytes, list[tuple[str, str]]]]:
        """The next ``n`` PUBLISH packets the broker end received."""
        out: list[tuple[str, bytes, list[tuple[str, str]]]] = []
        while len(out) < n:
            packet = self._packet()
            assert packet[0] == 0x30, f"not a QoS 0 PUBLISH: {packet[:1].hex()}"
            read = read_publish(packet[1 + _vbi_size(packet[1:]):])
            assert read is not None
            out.append(read)
        return out

    def _packet(self) -> bytes:
        while True:
            if len(self.buf) >= 2:
                n, size, mult, i = 0, 0, 1, 1
                while i < len(self.buf):
                    b = self.buf[i]
                    size += (b & 127) * mult
                    mult <<= 7
                    i += 1
                    if not b & 128:
                        n = i + size
                        break
                if n and len(self.buf) >= n:
                    packet, self.buf = self.buf[:n], self.buf[n:]
                    return packet
            self.buf += self.broker_peer.recv(65536)

    def upcalls(self) -> list[tuple[int, int, bytes]]:
        """The next upcalls about the sender (within 10 s)."""
        for _ in range(100):
            select.select([self.relay.fileno()], [], [], 0.1)
            ups = [u for u in self.relay.upcalls() if u[0] == self.sender]
            if ups:
                return ups
        raise AssertionError("no upcall")

    def collect(self) -> tuple[Any, ...]:
        """link_collect() once the thread published or dropped something (within 10 s)."""
        for _ in range(1000):
            got = self.relay.link_collect()
            if got[0]:
                return tuple(got)
            select.select([], [], [], 0.01)
        raise AssertionError("nothing counted")

    def close(self) -> None:
        self.relay.stop()
        self.relay.link_close()
        for s in (self.tx, self.tx_peer, self.rx, self.rx_peer, self.broker, self.broker_peer):
            s.close()


def _vbi_size(b: bytes) -> int:
    i = 0
    while b[i] & 128:
        i += 1
    return i + 1


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
    assert info[0] == [(rig.dst, 2, 2, 6, 0, 0, 6)] and info[1] == []


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
    r = Rig(queue_limit=300)
    try:
        r.learn(b"far")
        r.send([frame] * 3)
        r.local_bytes(3 * len(frame))
        rows, _, oversized, queue_full, _, _, _ = r.collect()
        assert rows == [(r.dst, 0, 0, 0, 1, 3, 0)] and (oversized, queue_full) == (0, 1)
    finally:
        r.close()
    # The broker's Maximum Packet Size below one message with the topic's bound (200).
    r = Rig(max_packet=500)
    try:
        r.learn(b"far")
        r.send([frame])
        r.local_bytes(len(frame))
        rows, _, oversized, queue_full, _, _, _ = r.collect()
        assert rows == [(r.dst, 0, 0, 0, 1, 1, 0)] and (oversized, queue_full) == (1, 0)
    finally:
        r.close()
    # An envelope's bound: one read of alternating routes makes 10 payloads, cut into
    # messages within ``limit``.
    r = Rig(limit=1000)
    try:
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
    finally:
        r.close()


def test_without_a_key_nothing_is_signed() -> None:
    r = Rig(key=b"")
    try:
        r.learn(b"far")
        r.send([wire.encode(wire.Route(G, b"far", b"s", b"u"))])
        [(_, _, users)] = r.publishes(1)
        assert [k for k, _ in users] == [FROM_PROPERTY, SENT_PROPERTY]
    finally:
        r.close()


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


# ---------------------------------------------------------------------- the read side

PEER_TOPIC = "gr/%fed/far/route/me"
NAMES = (FROM_PROPERTY, SENT_PROPERTY, BATCH_PROPERTY, MAC_PROPERTY, "gossiprouter-beat")


def _publish(topic: str, payload: bytes, users: list[tuple[str, str]]) -> bytes:
    """A QoS 0 PUBLISH as paho_fast.BufferedClient.publish_qos0 writes it."""
    props = user_properties(users)
    t = topic.encode()
    rest = (len(t).to_bytes(2, "big") + t + _vbi(len(props)) + props + payload)
    return b"\x30" + _vbi(len(rest)) + rest


def _vbi(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 127, n >> 7
        out.append(b | (128 if n else 0))
        if not n:
            return bytes(out)


class Reader(Rig):
    """A Rig whose thread also reads the broker end: routed messages from router "far"."""

    def __init__(self, key: bytes = KEY, age_ms: int = 0) -> None:
        super().__init__(key)
        self.relay.link_inbound(NAMES)
        self.in_cid = self.relay.open(self.broker.fileno(), self.mod.MQTT, self.mod.MAX_HOLD)
        self.relay.read(self.in_cid, False)
        self.writer = self.relay.link_writer(PEER_TOPIC.encode(), msgpack.packb("far"), age_ms)
        self.signer = Signer(key, "peerrun")
        self.n = 0

    def learn_in(self, dest: bytes | None, sender: bytes = b"s") -> None:
        frame = wire.encode(wire.Route(G, dest, sender, b"x"))
        list(self.scanner.scan(frame))
        key = self.scanner.header(frame, 4)
        assert key is not None
        assert self.relay.link_learn_in(self.writer, msgpack.packb(G) + msgpack.packb(dest),
                                        key, 65536, [self.local], 1)

    def message(self, payloads: list[bytes], sent_ms: int | None = None,
                extra: list[tuple[str, str]] | None = None, sign: bool = True) -> bytes:
        payload = payloads[0] if len(payloads) == 1 else b"".join(
            len(p).to_bytes(4, "big") + p for p in payloads)
        sent = str(int(time_ms()) if sent_ms is None else sent_ms)
        users = [(FROM_PROPERTY, "far"), (SENT_PROPERTY, sent), *(extra or [])]
        if len(payloads) > 1:
            users.append((BATCH_PROPERTY, FORMAT))
        if sign and self.signer.key:
            users.append((MAC_PROPERTY, self.signer.sign(PEER_TOPIC, payload, "route")))
        return _publish(PEER_TOPIC, payload, users)

    def route(self, dest: bytes | None, n: int) -> tuple[bytes, bytes]:
        """A route payload of ``n`` frames (from sender s) and the frames."""
        frames = b"".join(wire.encode(wire.Route(G, dest, b"s", b"m%d" % (self.n + i)))
                          for i in range(n))
        self.n += n
        return encode_route("far", G, dest, n, frames, seq=self.n), frames

    def up(self) -> bytes:
        """What the thread handed up about the broker connection (DATA), within 10 s."""
        for _ in range(100):
            select.select([self.relay.fileno()], [], [], 0.1)
            got = [u for u in self.relay.upcalls() if u[0] == self.in_cid]
            if got:
                assert got[0][1] == self.mod.DATA
                return b"".join(u[2] for u in got)
        raise AssertionError("nothing handed up")

    def close(self) -> None:
        self.relay.close(self.in_cid)
        super().close()


def time_ms() -> float:
    return time.time() * 1000


@pytest.fixture
def reader() -> Iterator[Reader]:
    r = Reader()
    yield r
    r.close()


def test_a_routed_message_is_delivered_by_the_thread_once(reader: Reader) -> None:
    reader.learn_in(None)
    payload, frames = reader.route(None, 3)
    packet = reader.message([payload])
    reader.broker_peer.sendall(packet)
    assert reader.local_bytes(len(frames)) == frames
    got, replayed = _read_counts(reader)
    assert got == [(reader.writer, 1, 1, 3, 3, 0)] and replayed == 0
    assert reader.relay.link_floor("peerrun") == 1
    # The same message again: a replay, dropped and counted; nothing reaches the receiver
    # or Python, and the thread reads on.
    reader.broker_peer.sendall(packet)
    payload2, frames2 = reader.route(None, 1)
    reader.broker_peer.sendall(reader.message([payload2]))
    assert reader.local_bytes(len(frames2)) == frames2
    got, replayed = _read_counts(reader)
    assert got == [(reader.writer, 1, 1, 1, 1, 0)] and replayed == 1
    # Python's Verifier asks the thread: what it accepted is a replay there too.
    v = Verifier(KEY)
    v.link = _Floor(reader.relay)  # type: ignore[assignment]
    read = read_publish(packet[1 + _vbi_size(packet[1:]):])
    assert read is not None
    assert v.check(PEER_TOPIC, payload, dict(read[2])[MAC_PROPERTY], writer="far",
                   kind="route") == "replayed"
    # ... and what Python accepts, the thread refuses after (link_seen).
    fresh, _ = reader.route(None, 1)
    later = reader.message([fresh])
    read = read_publish(later[1 + _vbi_size(later[1:]):])
    assert read is not None
    assert v.check(PEER_TOPIC, fresh, dict(read[2])[MAC_PROPERTY], writer="far",
                   kind="route") is None
    assert reader.relay.link_floor("peerrun") == 3
    reader.broker_peer.sendall(later)
    for _ in range(1000):
        if _read_counts(reader)[1] == 1:
            break
        select.select([], [], [], 0.01)
    else:
        raise AssertionError("the replay of what Python accepted was not refused")


def _read_counts(r: Rig) -> tuple[list[tuple[int, ...]], int]:
    """What the thread read per other router since the last call, and the replays it refused."""
    got = r.relay.link_collect()
    return got[1], got[6]


class _Floor:
    """What signing.Verifier asks of the link: the thread's sequence numbers per run."""

    def __init__(self, relay: Any) -> None:
        self.relay = relay

    def floor(self, run: str) -> int:
        n: int = self.relay.link_floor(run)
        return n

    def seen(self, run: str, seq: int) -> None:
        self.relay.link_seen(run, seq)


def test_an_envelope_is_delivered_whole_or_handed_up_whole(reader: Reader) -> None:
    reader.learn_in(None)
    reader.learn_in(b"near")
    (p1, f1), (p2, f2) = reader.route(None, 2), reader.route(b"near", 1)
    reader.broker_peer.sendall(reader.message([p1, p2]))
    assert reader.local_bytes(len(f1 + f2)) == f1 + f2
    # One payload of a route not learned (another member): the whole message goes to Python,
    # nothing of it delivered here.
    (p3, _), (p4, _) = reader.route(None, 1), reader.route(b"other", 1)
    packet = reader.message([p3, p4])
    reader.broker_peer.sendall(packet)
    assert reader.up() == packet
    reader.rx_peer.setblocking(False)
    with pytest.raises(BlockingIOError):
        reader.rx_peer.recv(1)


@pytest.mark.parametrize("case", ["heartbeat", "bad signature", "unsigned", "other topic",
                                  "pingresp", "handed on"])
def test_what_the_thread_does_not_handle_goes_to_python_in_order(reader: Reader,
                                                                  case: str) -> None:
    reader.learn_in(None)
    payload, frames = reader.route(None, 1)
    makers: dict[str, Callable[[], bytes]] = {
        "heartbeat": lambda: reader.message([payload], extra=[("gossiprouter-beat", "far")]),
        "bad signature": lambda: reader.message([payload])[:-1] + b"!",
        "unsigned": lambda: reader.message([payload], sign=False),
        "other topic": lambda: _publish("gr/%fed/x/route/me", payload,
                                        [(FROM_PROPERTY, "x"), (SENT_PROPERTY, "1")]),
        "pingresp": lambda: b"\xd0\x00",
        "handed on": lambda: reader.message([encode_route("far", G, None, 1, frames,
                                                          handed=True, seq=9)]),
    }
    packet = makers[case]()
    after, _ = reader.route(None, 1)
    following = reader.message([after])
    reader.broker_peer.sendall(packet + following)
    # The packet and everything after it in the read go up; the thread reads no more.
    up = reader.up()
    assert up.startswith(packet)
    if len(up) < len(packet + following):  # (the rest came in another read: up as well)
        up += reader.up()
    assert up == packet + following
    assert reader.relay.link_floor("peerrun") == 0  # nothing accepted by the thread
    # Python says: read on. The next message is the thread's again.
    reader.relay.read(reader.in_cid, False)
    again, again_frames = reader.route(None, 1)
    reader.broker_peer.sendall(reader.message([again]))
    assert reader.local_bytes(len(again_frames)) == again_frames


def test_a_message_cut_between_reads_is_delivered_when_whole(reader: Reader) -> None:
    reader.learn_in(None)
    payload, frames = reader.route(None, 5)
    packet = reader.message([payload])
    for i in range(0, len(packet), 7):
        reader.broker_peer.sendall(packet[i:i + 7])
        time.sleep(0.001)
    assert reader.local_bytes(len(frames)) == frames


def test_frames_older_than_the_limit_are_dropped_and_counted() -> None:
    r = Reader(age_ms=1000)
    try:
        r.learn_in(None)
        payload, _ = r.route(None, 2)
        r.broker_peer.sendall(r.message([payload], sent_ms=int(time_ms()) - 5000))
        fresh, frames = r.route(None, 1)
        r.broker_peer.sendall(r.message([fresh]))
        assert r.local_bytes(len(frames)) == frames  # only the fresh one
        got, _ = _read_counts(r)
        assert got == [(r.writer, 1, 1, 1, 1, 1)]
    finally:
        r.close()


def test_a_stale_inbound_route_goes_back_to_python(reader: Reader) -> None:
    reader.learn_in(None)
    payload, _ = reader.route(None, 1)
    reader.relay.invalidate(1)  # the group changed (its slot)
    packet = reader.message([payload])
    reader.broker_peer.sendall(packet)
    assert reader.up() == packet


def _python_delivers(packet: bytes, key: bytes) -> bytes | None:
    """The frames the receiving router's Python delivers of ``packet`` (to the learned
    multicast route of group G from sender s), or None when it refuses or would not deliver
    all of it: peers.Peers._on_federation and _on_path, signing.Verifier, batch.decode_batch,
    codec.decode_route, frames.check_routed, each as the receiving side calls it."""
    read = read_publish(packet[1 + _vbi_size(packet[1:]):])
    if read is None:
        return None
    topic, payload, users = read
    props = dict(users)
    if topic != PEER_TOPIC or FROM_PROPERTY not in props or "gossiprouter-beat" in props:
        return None
    sent = props.get(SENT_PROPERTY, "")
    if not (sent.isascii() and sent.isdigit() and len(sent) < 20):
        return None
    if key and Verifier(key).check(topic, payload, next(
            (v for k, v in users if k == MAC_PROPERTY), None), writer="far",
            kind="route") is not None:
        return None
    try:
        items = decode_batch(payload) if BATCH_PROPERTY in props else [payload]
        out = b""
        for item in items:
            rt = decode_route(item)
            if (rt.origin, rt.group, rt.dest, rt.handed, rt.src) != ("far", G, None, False,
                                                                     None):
                return None
            if check_routed(G, rt.frames, rt.frame_count, 65536, {b"s"}) is not None:
                return None
            out += rt.frames
        return out
    except Exception:
        return None


@pytest.mark.parametrize("key", [KEY, b""])
def test_mutated_messages_are_delivered_only_as_python_would_deliver_them(key: bytes) -> None:
    """A bounded differential fuzz of the read side (run under ASAN and TSAN by
    scripts/sanitize): valid routed messages with bytes changed after the fixed header, each
    followed by a valid one. The thread either delivers a message exactly as Python's checks
    would, or hands it to Python; it never delivers what Python would refuse, and the
    stream goes on."""
    r = Reader(key=key)
    rng = random.Random(25)
    try:
        r.learn_in(None)
        delivered = handed = 0
        for i in range(300):
            payloads = [r.route(None, rng.randint(1, 3))[0] for _ in range(rng.randint(1, 3))]
            good = r.message(payloads)
            head = 1 + _vbi_size(good[1:])
            mutant = bytearray(good)
            for _ in range(rng.randint(1, 3)):
                pos = rng.randrange(head, len(mutant))
                mutant[pos] = rng.randrange(256) if rng.random() < 0.5 else mutant[pos] ^ (
                    1 << rng.randrange(8))
            sentinel_payload, sentinel = r.route(None, 1)
            sentinel_packet = r.message([sentinel_payload])
            r.broker_peer.sendall(bytes(mutant) + sentinel_packet)
            got = b""
            up = b""
            for _ in range(1000):
                ready, _, _ = select.select([r.rx_peer, r.relay.fileno()], [], [], 0.05)
                if r.rx_peer in ready:
                    got += r.rx_peer.recv(65536)
                ups = [u for u in r.relay.upcalls() if u[0] == r.in_cid]
                up += b"".join(u[2] for u in ups)
                if got.endswith(sentinel) or (up and len(up) >= len(mutant)):
                    break
            else:
                raise AssertionError(f"iteration {i}: neither delivered nor handed up")
            if up:
                # Handed to Python: the mutant and what followed it, nothing delivered of it.
                assert bytes(mutant).startswith(up[:len(mutant)]) or up.startswith(mutant)
                assert got == b"", f"iteration {i}: delivered and handed up"
                while len(up) < len(mutant) + len(sentinel_packet):
                    select.select([r.relay.fileno()], [], [], 0.05)
                    up += b"".join(u[2] for u in r.relay.upcalls() if u[0] == r.in_cid)
                r.relay.read(r.in_cid, False)
                handed += 1
                continue
            python = _python_delivers(bytes(mutant), key)
            if got != sentinel:  # the thread delivered the mutant: Python would have too
                assert python is not None and got == python + sentinel, f"iteration {i}"
                delivered += 1
        # Most mutations break something the thread checks; some (in a frame's payload, in
        # the send time: not signed) leave a message Python delivers too, and so does it.
        assert handed > 50 and delivered > 0
        if key:
            assert delivered < 30  # the signature covers the payload: few survive
    finally:
        r.close()
