"""The hot loop (NativeSession.on_data) end to end, against a frame-by-frame reference.

The scanner's cutting of chunks into runs is tested against a naive frame splitter in
test_native_scan.py; this property test checks the whole path, the session's routing
decisions included: random mixes of headers, senders (one not registered), sizes,
encodings, PINGs and split points, and every receiver gets exactly the bytes a naive
frame-by-frame router would have queued for it.
"""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from gossiprouter.core.config import Config
from gossiprouter.protocol import native as wire
from gossiprouter.sessions.base import Hub
from gossiprouter.sessions.native import NativeSession


def _route_bin32(group: str, dest: bytes | None, sender: bytes, payload: bytes) -> bytes:
    """A valid ROUTE with a non-minimal (bin32) payload header."""
    import msgpack

    head: bytes = msgpack.packb([wire.FrameType.ROUTE, group, dest, sender], use_bin_type=True)
    body = b"\x95" + head[1:] + b"\xc6" + struct.pack(">I", len(payload)) + payload
    return struct.pack(">I", len(body)) + body


frame_specs = st.tuples(
    st.sampled_from(["g", "h"]),                       # group
    st.sampled_from([None, b"R1", b"R2", b"S2"]),      # dest
    st.sampled_from([b"S1", b"S2", b"S3"]),            # sender (S3 not registered)
    st.sampled_from([0, 1, 5, 100, 255, 256, 300]),    # payload size
    st.booleans(),                                     # non-minimal encoding
    st.booleans(),                                     # a PING after it
)


@settings(max_examples=300, deadline=None)
@given(st.lists(frame_specs, min_size=1, max_size=60), st.data())
def test_bulk_routing_matches_reference(
    specs: list[tuple[str, bytes | None, bytes, int, bool, bool]], data: st.DataObject
) -> None:
    hub = Hub(Config(port=0))
    sender = NativeSession(hub, "sender")
    sender.on_data(wire.PREAMBLE[:0] + wire.encode(wire.Hello((1,), "t")), 0.0)
    sender.outbox.take()
    r1, r2 = NativeSession(hub, "r1"), NativeSession(hub, "r2")
    for grp in ("g", "h"):
        hub.table.connect(sender, grp, b"S1")
        hub.table.connect(sender, grp, b"S2")
        hub.table.connect(r1, grp, b"R1")
        hub.table.connect(r2, grp, b"R2")
    stream = b""
    refused = 0
    expect: dict[str, bytes] = {"sender": b"", "r1": b"", "r2": b""}
    for i, (grp, dest, snd, size, odd, ping) in enumerate(specs):
        payload = bytes([i % 256]) * size
        f = (_route_bin32 if odd else wire.encode_route)(grp, dest, snd, payload)
        stream += f
        if snd == b"S3":
            # One ERROR per refused frame, in order with the rest, whatever the runs.
            expect["sender"] += wire.encode_error(
                None, "not_member", f"sender is not registered in {grp!r} on this connection")
            refused += 1
        elif dest is None:
            # Multicast: one copy per other carrier; the sender's connection also
            # carries the other S address, so it gets its copy too.
            for k in expect:
                expect[k] += f
        elif dest == b"S2":
            expect["sender"] += f
        else:
            expect["r1" if dest == b"R1" else "r2"] += f
        if ping:
            stream += wire.encode(wire.Ping(i))
            expect["sender"] += wire.encode(wire.Pong(i))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    prev = 0
    for c in [*cuts, len(stream)]:
        sender.on_data(stream[prev:c], 0.0)
        prev = c
    got = {s.peer: b"".join(s.outbox.take()) for s in (sender, r1, r2)}
    assert got == expect
    assert hub.counters.routed == len(specs) - refused


def _session_with_members() -> tuple[Hub, NativeSession, NativeSession]:
    hub = Hub(Config(port=0))
    s = NativeSession(hub, "s")
    s.on_data(wire.encode(wire.Hello((1,), "t")), 0.0)
    s.outbox.take()
    r = NativeSession(hub, "r")
    hub.table.connect(s, "g", b"S")
    hub.table.connect(r, "g", b"R")
    return hub, s, r


def _errors(s: NativeSession) -> list[wire.Frame]:
    d = wire.Decoder()
    d.feed(b"".join(s.outbox.take()))
    return d.frames()


def test_a_run_from_an_unregistered_sender_is_refused_frame_by_frame() -> None:
    hub, s, r = _session_with_members()
    stranger = wire.encode_route("g", b"R", b"X", b"x" * 10)
    ok = wire.encode_route("g", b"R", b"S", b"y" * 10)
    s.on_data(stranger * 5 + ok, 0.0)
    assert b"".join(r.outbox.take()) == ok
    errors = _errors(s)
    assert [(e.code, e.message) for e in errors if isinstance(e, wire.Error)] == [
        ("not_member", "sender is not registered in 'g' on this connection")] * 5
    assert len(errors) == 5 and hub.counters.routed == 1


def test_unknown_destination_is_answered_once_a_second_per_group() -> None:
    hub, s, _ = _session_with_members()
    lost = wire.encode_route("g", b"nobody", b"S", b"x")
    other = wire.encode_route("g", b"R", b"S", b"x")
    s.on_data(lost + other + lost, 10.0)  # two runs to nobody within the same second
    s.on_data(lost, 10.5)
    assert [e.code for e in _errors(s) if isinstance(e, wire.Error)] == ["unknown_destination"]
    s.on_data(lost, 11.0)  # a second after the last answer: answered again
    assert [e.code for e in _errors(s) if isinstance(e, wire.Error)] == ["unknown_destination"]
    assert hub.counters.drops["unknown_destination"] == 4
