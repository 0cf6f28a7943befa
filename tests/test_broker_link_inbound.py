"""The relay thread's broker link, the read side (relay/inbound.c; issue 30): routed messages
read from the broker are delivered by the thread only as the receiving router's Python would
deliver them (peers.Peers._on_federation and _on_path, signing.Verifier, batch.decode_batch,
codec.decode_route, frames.check_routed), and everything else reaches Python unchanged, in
order."""

from __future__ import annotations

import random
import select
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gossiprouter.federation import signing
from gossiprouter.federation.batch import BATCH_PROPERTY, decode_batch
from gossiprouter.federation.codec import decode_route, encode_route
from gossiprouter.federation.frames import check_routed
from gossiprouter.federation.link_side import FROM_PROPERTY, SENT_PROPERTY
from gossiprouter.federation.paho_fast import read_publish
from gossiprouter.federation.signing import MAC_PROPERTY, Verifier
from tests.broker_link_rig import (
    G5,
    KEY,
    PEER_TOPIC,
    SENDER5,
    G,
    Reader,
    Rig,
    publish_packet,
    time_ms,
    vbi_size,
)


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
    read = read_publish(packet[1 + vbi_size(packet[1:]):])
    assert read is not None
    assert v.check(PEER_TOPIC, payload, dict(read[2])[MAC_PROPERTY], writer="far",
                   kind="route") == "replayed"
    # ... and what Python accepts, the thread refuses after (link_seen).
    fresh, _ = reader.route(None, 1)
    later = reader.message([fresh])
    read = read_publish(later[1 + vbi_size(later[1:]):])
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
        "other topic": lambda: publish_packet("gr/%fed/x/route/me", payload,
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
    with Reader(age_ms=1000) as r:
        r.learn_in(None)
        payload, _ = r.route(None, 2)
        r.broker_peer.sendall(r.message([payload], sent_ms=int(time_ms()) - 5000))
        fresh, frames = r.route(None, 1)
        r.broker_peer.sendall(r.message([fresh]))
        assert r.local_bytes(len(frames)) == frames  # only the fresh one
        got, _ = _read_counts(r)
        assert got == [(r.writer, 1, 1, 1, 1, 1)]


def test_a_stale_inbound_route_goes_back_to_python(reader: Reader) -> None:
    reader.learn_in(None)
    payload, _ = reader.route(None, 1)
    reader.relay.invalidate(1)  # the group changed (its slot)
    packet = reader.message([payload])
    reader.broker_peer.sendall(packet)
    assert reader.up() == packet


def _python_delivers(packet: bytes, key: bytes, group: str = G) -> bytes | None:
    """The frames the receiving router's Python delivers of ``packet`` (to the learned
    multicast route of ``group`` from its sender), or None when it refuses or would not deliver
    all of it: peers.Peers._on_federation and _on_path, signing.Verifier, batch.decode_batch,
    codec.decode_route, frames.check_routed, each as the receiving side calls it."""
    read = read_publish(packet[1 + vbi_size(packet[1:]):])
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
            if (rt.origin, rt.group, rt.dest, rt.handed, rt.src) != ("far", group, None,
                                                                     False, None):
                return None
            senders = {SENDER5.key} if group == G5 else {b"s"}
            if check_routed(group, rt.frames, rt.frame_count, 65536, senders) is not None:
                return None
            out += rt.frames
        return out
    except Exception:
        return None


@pytest.mark.parametrize("jgroups5", [False, True], ids=["native", "jgroups5"])
@pytest.mark.parametrize("key", [KEY, b""])
def test_mutated_messages_are_delivered_only_as_python_would_deliver_them(
        key: bytes, jgroups5: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bounded differential fuzz of the read side (run under ASAN and TSAN by
    scripts/sanitize): valid routed messages with bytes changed after the fixed header, each
    followed by a valid one. The thread either delivers a message exactly as Python's checks
    would, or hands it to Python; it never delivers what Python would refuse, and the
    stream goes on. The clock in the messages (send time, signature) is one instant, so the
    same seed makes the same messages, mutations and outcomes in every run."""
    now = int(time_ms())
    monkeypatch.setattr(signing, "_now_ms", lambda: now)
    r = Reader(key=key, jgroups5=jgroups5)
    rng = random.Random(25)
    try:
        r.learn_in(None)
        delivered = handed = 0
        for i in range(300):
            payloads = [r.route(None, rng.randint(1, 3))[0] for _ in range(rng.randint(1, 3))]
            good = r.message(payloads, sent_ms=now)
            head = 1 + vbi_size(good[1:])
            mutant = bytearray(good)
            for _ in range(rng.randint(1, 3)):
                pos = rng.randrange(head, len(mutant))
                mutant[pos] = rng.randrange(256) if rng.random() < 0.5 else mutant[pos] ^ (
                    1 << rng.randrange(8))
            sentinel_payload, sentinel = r.route(None, 1)
            sentinel_packet = r.message([sentinel_payload], sent_ms=now)
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
            python = _python_delivers(bytes(mutant), key, r.group)
            if got != sentinel:  # the thread delivered the mutant: Python would have too
                assert python is not None and got == python + sentinel, f"iteration {i}"
                delivered += 1
        # Most mutations break something the thread checks; some (in a frame's payload, in
        # the send time: not signed) leave a message Python delivers too, and so does it.
        assert handed > 50
        if key:
            assert delivered < 30  # the signature covers the payload: few survive
        else:
            assert delivered > 0
    finally:
        r.close()
