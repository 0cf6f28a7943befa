"""The hot loop (NativeSession.on_data) against a frame-by-frame reference.

Runs of same-header frames are routed in bulk and same-size runs are checked
column-wise; this property test feeds random mixes of headers, sizes,
encodings, PINGs and split points and checks every receiver gets exactly the
bytes a naive frame-by-frame router would have queued for it.
"""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from gossiprouter.config import Config
from gossiprouter.protocol import native as wire
from gossiprouter.sessions.base import Hub
from gossiprouter.sessions.native import NativeSession


def _route_bin32(group: str, dest: bytes | None, sender: bytes, payload: bytes) -> bytes:
    """A valid ROUTE with a non-minimal (bin32) payload header."""
    import msgpack

    head: bytes = msgpack.packb([wire.T.ROUTE, group, dest, sender], use_bin_type=True)
    body = b"\x95" + head[1:] + b"\xc6" + struct.pack(">I", len(payload)) + payload
    return struct.pack(">I", len(body)) + body


frame_specs = st.tuples(
    st.sampled_from(["g", "h"]),                       # group
    st.sampled_from([None, b"R1", b"R2", b"S2"]),      # dest
    st.sampled_from([b"S1", b"S2"]),                   # sender
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
    expect: dict[str, bytes] = {"sender": b"", "r1": b"", "r2": b""}
    for i, (grp, dest, snd, size, odd, ping) in enumerate(specs):
        payload = bytes([i % 256]) * size
        f = (_route_bin32 if odd else wire.encode_route)(grp, dest, snd, payload)
        stream += f
        if dest is None:
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
    assert hub.counters.routed == len(specs)


def test_same_size_run_stops_at_a_different_header() -> None:
    hub = Hub(Config(port=0))
    s = NativeSession(hub, "s")
    s.on_data(wire.encode(wire.Hello((1,), "t")), 0.0)
    s.outbox.take()
    a, b = NativeSession(hub, "a"), NativeSession(hub, "b")
    hub.table.connect(s, "g", b"S")
    hub.table.connect(a, "g", b"A")
    hub.table.connect(b, "g", b"B")
    to_a = wire.encode_route("g", b"A", b"S", b"x" * 10)
    to_b = wire.encode_route("g", b"B", b"S", b"x" * 10)  # same size, differs in one byte
    s.on_data(to_a * 50 + to_b + to_a * 3, 0.0)
    assert b"".join(a.outbox.take()) == to_a * 53
    assert b"".join(b.outbox.take()) == to_b
