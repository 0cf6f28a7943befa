"""paho's per-message overheads made cheap (gossiprouter/federation/paho_fast.py, issue 30):
FastProperties packs, reads and refuses exactly what paho's Properties does; BufferedClient
reads several packets from a real socket on 127.0.0.1 in one recv. Counted, never timed."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("paho.mqtt")

from paho.mqtt.client import MQTTMessage
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.exception import MalformedPacket, MQTTException
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from gossiprouter.federation import paho_fast
from gossiprouter.federation.paho_fast import BufferedClient, FastProperties, install

PUB, WILL, CONN = PacketTypes.PUBLISH, PacketTypes.WILLMESSAGE, PacketTypes.CONNECT

CASES: list[tuple[int, dict[str, Any]]] = [
    (PUB, {}),
    (PUB, {"UserProperty": [("gossiprouter-from", "r1"), ("gossiprouter-sent", "17643"),
                            ("gossiprouter-batch", "1")]}),
    (PUB, {"MessageExpiryInterval": 90, "UserProperty": [("k", "v\u00e9\u4e2d")],
           "ContentType": "x/y", "CorrelationData": b"\x00\x01", "PayloadFormatIndicator": 1}),
    (WILL, {"UserProperty": ("gossiprouter-mac", "abc"), "WillDelayInterval": 5}),
    (CONN, {"SessionExpiryInterval": 7, "ReceiveMaximum": 10, "MaximumPacketSize": 4096}),
]


def both(kind: int, attrs: dict[str, Any]) -> tuple[Properties, FastProperties]:
    ref, fast = Properties(kind), FastProperties(kind)  # type: ignore[no-untyped-call]
    for name, value in attrs.items():
        setattr(ref, name, value)
        setattr(fast, name, value)
    return ref, fast


def attrs(p: Properties) -> dict[str, Any]:
    return {k: v for k, v in vars(p).items()
            if k not in ("packetType", "types", "names", "properties")}


@pytest.mark.parametrize(("kind", "values"), CASES)
def test_fast_properties_pack_and_read_what_paho_does(kind: int, values: dict[str, Any]
                                                      ) -> None:
    ref, fast = both(kind, values)
    assert attrs(fast) == attrs(ref)
    packed: bytes = ref.pack()  # type: ignore[no-untyped-call]
    assert fast.pack() == packed
    back_ref = Properties(kind).unpack(packed + b"payload")  # type: ignore[no-untyped-call]
    back_fast = FastProperties(kind).unpack(packed + b"payload")
    assert back_fast[1] == back_ref[1]
    assert attrs(back_fast[0]) == attrs(back_ref[0])
    # Read again into the same object: the earlier values are cleared first.
    again = back_fast[0].unpack(packed)
    assert attrs(again[0]) == attrs(back_ref[0])


def test_fast_properties_refuse_what_paho_refuses() -> None:
    for kind, name, value in ((PUB, "SessionExpiryInterval", 3), (PUB, "NoSuchThing", 1),
                              (CONN, "ReceiveMaximum", 0), (PUB, "PayloadFormatIndicator", 2)):
        with pytest.raises(MQTTException):
            setattr(Properties(kind), name, value)  # type: ignore[no-untyped-call]
        with pytest.raises(MQTTException):
            setattr(FastProperties(kind), name, value)
    for bad in (b"\x07\x26\x00\x01k\x00\x01\x00",  # a NUL in a string
                b"\x08\x26\x00\x01k\x00\x02\xef\xbb",  # cut short
                b"\x09\x26\x00\x01k\x00\x03\xef\xbb\xbf",  # U+FEFF
                b"\x09\x26\x00\x01k\x00\x03\xed\xa0\x80",  # a surrogate (D800)
                b"\x0a" + b"\x02\x00\x00\x00\x01" * 2):  # a single property twice
        for cls in (Properties, FastProperties):
            with pytest.raises((MalformedPacket, MQTTException, ValueError)):
                cls(PUB).unpack(bad)  # type: ignore[no-untyped-call]


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        a = socket.create_connection(srv.getsockname())
        b, _ = srv.accept()
    yield a, b
    a.close()
    b.close()


class Counting:
    """A socket whose recv calls are counted."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.recvs = sock, 0

    def recv(self, n: int) -> bytes:
        self.recvs += 1
        return self.sock.recv(n)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


def publish_packet(topic: str, payload: bytes) -> bytes:
    props = FastProperties(PUB)
    props.UserProperty = [("gossiprouter-from", "r1")]
    body = len(topic).to_bytes(2, "big") + topic.encode() + props.pack() + payload
    assert len(body) < 128
    return bytes([0x30, len(body)]) + body


def test_buffered_client_reads_several_packets_in_one_recv(
        pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    c = BufferedClient(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    got: list[tuple[str, Any, Any]] = []
    install()  # (as a bridge does: every PUBLISH's properties read by FastProperties)

    def on_message(client: Any, userdata: Any, msg: MQTTMessage) -> None:
        assert isinstance(msg.properties, FastProperties)
        got.append((msg.topic, msg.payload, getattr(msg.properties, "UserProperty", None)))

    c.on_message = on_message
    counting = Counting(b)
    c._sock = counting  # the connected socket paho reads
    a.sendall(b"".join(publish_packet(f"t/{i}", b"x" * i) for i in range(3)))
    c._sock.setblocking(True)
    assert c.loop_read() == 0
    assert c.buffered() > 0  # the other two packets: read, not yet handled
    while c.buffered():
        assert c.loop_read() == 0
    assert got == [(f"t/{i}", b"x" * i, [("gossiprouter-from", "r1")]) for i in range(3)]
    assert counting.recvs == 1  # paho alone: 3 or more a packet
    c.drop_buffer()
    assert c.buffered() == 0


class Sends:
    """A socket whose send calls are counted and recorded, each taking at most ``limit``
    bytes."""

    def __init__(self, sock: socket.socket, limit: int = 1 << 30) -> None:
        self.sock, self.sends, self.limit = sock, 0, limit
        self.data = b""

    def send(self, data: bytes) -> int:
        self.sends += 1
        n = self.sock.send(data[:self.limit])
        self.data += bytes(data[:n])
        return n

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


def client_on(sock: Any) -> BufferedClient:
    c = BufferedClient(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    c._sock = sock
    return c


def write_all(c: BufferedClient, a: socket.socket, b: socket.socket) -> bytes:
    """Everything ``c`` queued, written through ``a`` and read from ``b`` (bounded)."""
    a.setblocking(False)
    b.setblocking(False)
    got = b""
    for _ in range(100_000):
        assert c.loop_write() == 0
        try:
            while chunk := b.recv(1 << 20):
                got += chunk
        except BlockingIOError:
            pass
        if not c.want_write():
            break
    b.settimeout(0.2)
    try:
        while chunk := b.recv(1 << 20):
            got += chunk
    except TimeoutError:
        pass
    return got


USERS = [("gossiprouter-from", "r\u00e9"), ("gossiprouter-sent", "1764312345678"),
         ("gossiprouter-batch", "1")]


@pytest.mark.parametrize("size", [0, 1, 100, 20_000, 3_000_000])
def test_publish_qos0_writes_the_bytes_paho_publish_writes(
        pair: tuple[socket.socket, socket.socket], size: int) -> None:
    a, b = pair
    payload = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    ref, fast = client_on(a), client_on(a)
    props = FastProperties(PUB)
    props.UserProperty = USERS
    assert ref.publish("%fed/p/r1/route/r2", payload, 0, properties=props).rc == 0
    paho = write_all(ref, a, b)
    assert fast.publish_qos0(b"%fed/p/r1/route/r2", USERS, payload) == 0
    ours = write_all(fast, a, b)
    assert ours == paho  # paho's packet, byte for byte
    assert paho.endswith(payload) and len(paho) > len(payload)


def test_corked_publishes_leave_in_one_send(pair: tuple[socket.socket, socket.socket]) -> None:
    a, _b = pair
    sends = Sends(a)
    c = client_on(sends)
    topics = [b"t/%d" % i for i in range(4)]
    with c.corked():
        for t in topics[:3]:
            assert c.publish_qos0(t, USERS[:1], b"p" + t) == 0
        assert c.publish(topics[3].decode(), b"p" + topics[3], 0).rc == 0  # paho's own
        assert sends.sends == 0  # nothing written while corked
    assert c.uncorked_rc == 0
    assert sends.sends == 1 and c.gathered_sends == 1
    assert not c.want_write()
    one_by_one = Sends(a)
    reference = client_on(one_by_one)
    for t in topics[:3]:
        reference.publish_qos0(t, USERS[:1], b"p" + t)
    reference.publish(topics[3].decode(), b"p" + topics[3], 0)
    assert one_by_one.sends == 4
    assert sends.data == one_by_one.data  # the same packets, in the same order


def test_a_gathered_send_cut_short_goes_on_where_it_stopped(
        pair: tuple[socket.socket, socket.socket]) -> None:
    a, _b = pair
    sends = Sends(a, limit=7)  # each send takes 7 bytes: paho's own sends do the rest
    c = client_on(sends)
    with c.corked():
        for i in range(3):
            c.publish_qos0(b"t/%d" % i, USERS, b"x" * (10 + i))
    for _ in range(1000):
        if not c.want_write():
            break
        assert c.loop_write() == 0
    one_by_one = Sends(a)
    reference = client_on(one_by_one)
    for i in range(3):
        reference.publish_qos0(b"t/%d" % i, USERS, b"x" * (10 + i))
    assert sends.data == one_by_one.data  # every byte once, in order
    assert c.gathered_sends >= 1 and sends.sends > 3


class Recorder:
    """Where a client writes: what it sends, recorded (no socket)."""

    def __init__(self) -> None:
        self.data = b""

    def send(self, data: bytes) -> int:
        self.data += bytes(data)
        return len(data)

    def close(self) -> None:
        pass


def packet_of(topic: str, payload: bytes, props: FastProperties | None) -> bytes:
    """The bytes paho's publish writes (QoS 0)."""
    rec = Recorder()
    assert client_on(rec).publish(topic, payload, 0, properties=props).rc == 0
    return rec.data


def test_fast_publish_reads_what_paho_reads(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    expiring = FastProperties(PUB)
    expiring.MessageExpiryInterval = 60
    users = FastProperties(PUB)
    users.UserProperty = USERS
    packets = [("%fed/p/r1/route/r2", b"frames" * 50, users),  # read directly
               ("%fed/p/r1/route/r2", b"", None),  # no property at all: directly too
               ("t/\u00e9", b"x" * 300, users),  # the hook declines: paho's way
               ("%fed/p/r1/presence", b"p", expiring)]  # another property: paho's way
    stream = b"".join(packet_of(t, p, pr) for t, p, pr in packets)
    got: dict[str, list[tuple[str, bytes, list[tuple[str, str]] | None]]] = {
        "fast": [], "paho": []}
    clients = []  # (a client closes its socket when collected)
    for fast in (True, False):
        c = client_on(b)
        clients.append(c)
        def on_message(cl: Any, ud: Any, m: MQTTMessage) -> None:
            got["paho"].append(
                (m.topic, bytes(m.payload), getattr(m.properties, "UserProperty", None)))

        def on_fast(t: str, p: bytes, u: list[tuple[str, str]]) -> bool:
            if not t.startswith("%fed/"):
                return False
            got["fast"].append((t, p, u))
            return True

        c.on_message = on_message
        if fast:
            c.fast_publish = on_fast
        a.sendall(stream)
        b.setblocking(True)
        for _ in range(len(packets)):
            assert c.loop_read() == 0
        assert c.buffered() == 0
        if fast:
            assert [x[0] for x in got["fast"]] == ["%fed/p/r1/route/r2"] * 2
            assert [x[0] for x in got["paho"]] == ["t/\u00e9", "%fed/p/r1/presence"]
            fast_got = [got["fast"][0], (*got["fast"][1][:2], None)]
            directly, got["fast"], got["paho"] = fast_got, [], []
    # What paho read of the same packets, field for field (no property: [] read directly).
    assert directly == [(t, p, getattr(pr, "UserProperty", None)) for t, p, pr in packets[:2]]
    assert [g[0] for g in got["paho"]] == [t for t, _, _ in packets]
    for c in clients:
        c._sock = None


def test_fast_publish_leaves_malformed_packets_to_paho() -> None:
    from gossiprouter.federation.paho_fast import read_publish

    good = packet_of("%fed/p/r1/route/r2", b"abc", None)[2:]  # (after the fixed header)
    assert read_publish(good) == ("%fed/p/r1/route/r2", b"abc", [])
    for bad in (b"", b"\x00", b"\x00\x05ab", b"\x00\x01\xff\x00",  # cut, bad UTF-8
                b"\x00\x01t\x05\x26\x00\x01k",  # a user property cut short
                b"\x00\x01t\x03\x26\x00\x01k\x00\x01v",  # properties longer than said
                b"\x00\x00\x00"):  # no topic (an alias: paho's to handle)
        assert read_publish(bad) is None


def test_a_paho_laid_out_otherwise_gets_paho_s_own_ways(
        pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch) -> None:
    """BufferedClient builds on paho's private parts (the queued packets' dicts, the PUBLISH
    handler): with a paho whose parts differ, it publishes, reads and writes as paho does,
    the same bytes, and hands nothing to the fast reader."""
    a, b = pair
    first = client_on(a)  # (kept: a client closes its socket when collected)
    assert first.fast  # this paho: the fast ways
    monkeypatch.setattr(paho_fast, "_PAHO_METHODS", ("_a_method_paho_does_not_have",))
    ref, c = client_on(a), client_on(a)
    assert not c.fast
    props = FastProperties(PUB)
    props.UserProperty = USERS
    assert ref.publish("%fed/p/r1/route/r2", b"payload", 0, properties=props).rc == 0
    paho = write_all(ref, a, b)
    with c.corked():
        assert c.publish_qos0(b"%fed/p/r1/route/r2", USERS, b"payload") == 0
    assert write_all(c, a, b) == paho and c.gathered_sends == 0
    got: list[Any] = []
    r = client_on(b)

    def on_fast(t: str, p: bytes, u: list[tuple[str, str]]) -> bool:
        got.append(("fast", t))
        return True

    r.fast_publish = on_fast
    r.on_message = lambda cl, ud, m: got.append(("paho", m.topic))
    a.sendall(paho)
    b.setblocking(True)
    assert r.loop_read() == 0
    assert got == [("paho", "%fed/p/r1/route/r2")] and r.buffered() == 0
    del first


def test_uncork_writes_routed_messages_in_one_send_of_its_own(
        pair: tuple[socket.socket, socket.socket]) -> None:
    """A queue of publish_qos0's packets on a plain socket: one send past paho's loop_write,
    the same bytes as paho's sends; with a packet of paho's own in it, paho writes."""
    a, b = pair
    reference = Sends(a)
    ref = client_on(reference)
    for i in range(3):
        ref.publish_qos0(b"t/%d" % i, USERS, b"x" * i)
    want = reference.data
    c = client_on(a)
    with c.corked():
        for i in range(3):
            assert c.publish_qos0(b"t/%d" % i, USERS, b"x" * i) == 0
    assert c.uncorked_rc == 0 and c.direct_sends == 1 and not c.want_write()
    assert write_all(c, a, b) == want * 2  # (the reference's bytes, then these)
    c.cork()
    c.publish_qos0(b"t/0", USERS, b"")
    assert c.publish("t/1", b"paho", 0).rc == 0  # queued (corked): paho's own packet
    assert c.uncork() == 0
    assert c.direct_sends == 1 and not c.want_write()  # written by paho's loop_write


def test_uncork_cut_short_by_the_socket_leaves_the_rest_to_paho(
        pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    a.setblocking(False)
    big = [bytes([65 + i]) * 400_000 for i in range(2)]
    ref = client_on(Sends(a))  # (paho's writes, inline: the rest by write_all)
    for i, p in enumerate(big):
        ref.publish_qos0(b"t/%d" % i, USERS, p)
    want = write_all(ref, a, b)
    assert len(want) > 800_000
    c = client_on(a)
    with c.corked():
        for i, p in enumerate(big):
            c.publish_qos0(b"t/%d" % i, USERS, p)
    assert c.uncorked_rc == 0 and c.direct_sends == 1
    assert c.want_write()  # the socket took part of it: the rest waits, marked as paho's
    assert write_all(c, a, b) == want
    assert not c.want_write()


def test_whole_publishes_are_taken_from_the_buffer_for_fast_publish(
        pair: tuple[socket.socket, socket.socket]) -> None:
    """fast_publish gets each whole QoS 0 PUBLISH from the buffer (read by recv_into on a
    plain socket); a retained one and one it declines go to paho's on_message; one cut
    short is read paho's way, then handed to fast_publish (_handle_publish); in order."""
    a, b = pair
    c = client_on(b)
    got: list[tuple[str, bytes]] = []

    def fast(topic: str, payload: bytes, users: list[tuple[str, str]]) -> bool:
        assert users == [("gossiprouter-from", "r1")]
        if topic == "decline":
            return False
        got.append(("fast " + topic, payload))
        return True

    def on_message(client: Any, userdata: Any, msg: MQTTMessage) -> None:
        got.append(("paho " + msg.topic, bytes(msg.payload)))

    c.fast_publish = fast
    c.on_message = on_message
    retained = bytearray(publish_packet("kept", b"r"))
    retained[0] = 0x31
    cut = publish_packet("cut", b"c" * 50)
    a.sendall(publish_packet("t/0", b"a") + bytes(retained) + publish_packet("decline", b"d")
              + publish_packet("t/1", b"b" * 20) + cut[:10])
    b.setblocking(True)
    assert c.loop_read() == 0  # (waits for the bytes: every one is read at once)
    b.setblocking(False)  # as the bridge's: the packet cut short waits for the rest
    while c.buffered():
        assert c.loop_read() == 0
    a.sendall(cut[10:])
    b.setblocking(True)
    assert c.loop_read() == 0
    assert got == [("fast t/0", b"a"), ("paho kept", b"r"), ("paho decline", b"d"),
                   ("fast t/1", b"b" * 20), ("fast cut", b"c" * 50)]
    assert c.whole_reads == 2  # t/0 and t/1 (paho's reads: 3 or more a packet)
    a.close()
    assert c.loop_read() != 0  # the end of the stream: the connection is lost
