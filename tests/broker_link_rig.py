"""The rigs of the relay thread's broker link tests (tests/test_broker_link.py, the write
side; tests/test_broker_link_inbound.py, the read side): a real ``Relay`` thread, a native
connection of a socket pair as a sender, another as a local receiver, and the other end of a
third as the "broker", written and read by the test."""

from __future__ import annotations

import select
import socket
import time
from typing import Any, Self

import msgpack

from gossiprouter.federation.batch import BATCH_PROPERTY, FORMAT
from gossiprouter.federation.codec import encode_route
from gossiprouter.federation.frames import j5_header
from gossiprouter.federation.link_side import FROM_PROPERTY, SENT_PROPERTY
from gossiprouter.federation.paho_fast import property_key, read_publish, user_properties
from gossiprouter.federation.signing import MAC_PROPERTY, Signer
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol import native as wire
from gossiprouter.protocol.jgroups_address import V5, JAddress
from gossiprouter.protocol.native_scan import NativeScanner
from gossiprouter.server import fastpath

G = "grp"
TOPIC = "gr/%fed/me/route/other"
KEY = b"k" * 32


def link_params(key: bytes = KEY, limit: int = 1 << 20, max_packet: int = 0,
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
        self.relay.link_enable(*link_params(key, **limits))
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
            read = read_publish(packet[1 + vbi_size(packet[1:]):])
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.relay.stop()
        self.relay.link_close()
        for s in (self.tx, self.tx_peer, self.rx, self.rx_peer, self.broker, self.broker_peer):
            s.close()


def vbi_size(b: bytes) -> int:
    i = 0
    while b[i] & 128:
        i += 1
    return i + 1


PEER_TOPIC = "gr/%fed/far/route/me"
NAMES = (FROM_PROPERTY, SENT_PROPERTY, BATCH_PROPERTY, MAC_PROPERTY, "gossiprouter-beat")


def publish_packet(topic: str, payload: bytes, users: list[tuple[str, str]]) -> bytes:
    """A QoS 0 PUBLISH as paho_fast.BufferedClient.publish_qos0 writes it."""
    props = user_properties(users)
    t = topic.encode()
    rest = (len(t).to_bytes(2, "big") + t + vbi(len(props)) + props + payload)
    return b"\x30" + vbi(len(rest)) + rest


def vbi(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 127, n >> 7
        out.append(b | (128 if n else 0))
        if not n:
            return bytes(out)


# The JGroups 5.x group of a Reader(jgroups5=True), and its sender on router "far".
G5 = "jgroups5:g5"
SENDER5 = JAddress.from_uuid(0x0A, 0x0B, version=V5)


class Reader(Rig):
    """A Rig whose thread also reads the broker end: routed messages from router "far" (native
    frames of group G, or with ``jgroups5`` 5.x MESSAGEs of group G5, multicasts)."""

    def __init__(self, key: bytes = KEY, age_ms: int = 0, jgroups5: bool = False) -> None:
        super().__init__(key)
        self.group = G5 if jgroups5 else G
        self.relay.link_inbound(NAMES)
        self.in_cid = self.relay.open(self.broker.fileno(), self.mod.MQTT, self.mod.MAX_HOLD)
        self.relay.read(self.in_cid, False)
        self.writer = self.relay.link_writer(PEER_TOPIC.encode(), msgpack.packb("far"), age_ms)
        self.signer = Signer(key, "peerrun")
        self.n = 0

    def learn_in(self, dest: bytes | None, sender: bytes = b"s") -> None:
        kind = self.mod.NATIVE
        if self.group == G5:
            assert dest is None
            key = j5_header(j5.message(G5[9:], None, SENDER5, b"x"), 65536)
            kind = self.mod.JG5
        else:
            frame = wire.encode(wire.Route(G, dest, sender, b"x"))
            list(self.scanner.scan(frame))
            key = self.scanner.header(frame, 4)
        assert key is not None
        assert self.relay.link_learn_in(self.writer, msgpack.packb(self.group)
                                        + msgpack.packb(dest), key, 65536, [self.local], 1,
                                        kind)

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
        return publish_packet(PEER_TOPIC, payload, users)

    def route(self, dest: bytes | None, n: int) -> tuple[bytes, bytes]:
        """A route payload of ``n`` frames (from sender s, or SENDER5) and the frames."""
        if self.group == G5:
            frames = b"".join(j5.message(G5[9:], None, SENDER5, b"m%d" % (self.n + i))
                              for i in range(n))
        else:
            frames = b"".join(wire.encode(wire.Route(G, dest, b"s", b"m%d" % (self.n + i)))
                              for i in range(n))
        self.n += n
        return encode_route("far", self.group, dest, n, frames, seq=self.n), frames

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
