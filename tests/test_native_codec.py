"""The native codec: round trips, split-anywhere input, garbage, oversize lengths."""

from __future__ import annotations

import contextlib
import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gossiprouter.protocol import native as wire
from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.native_scan import route_header

groups = st.text(min_size=1, max_size=40).filter(lambda g: len(g.encode()) <= wire.MAX_GROUP)
addrs = st.binary(min_size=0, max_size=wire.MAX_ADDR)
names = st.none() | st.text(max_size=30)
reqs = st.integers(min_value=0, max_value=2**63 - 1)
physical = st.lists(
    st.tuples(st.text(max_size=20), st.integers(min_value=0, max_value=65535)), max_size=3
).map(tuple)
members = st.builds(wire.MemberInfo, addrs, names, physical)

frames = st.one_of(
    st.builds(wire.Hello, st.lists(st.integers(0, 100), min_size=1, max_size=4).map(tuple),
              st.text(max_size=20), st.none() | st.text(max_size=20)),
    st.builds(wire.Welcome, st.integers(0, 10), st.text(max_size=20),
              st.dictionaries(st.text(max_size=10), st.integers(0, 2**40), max_size=4)),
    st.builds(wire.Connect, reqs, groups, addrs, names, physical),
    st.builds(wire.Disconnect, reqs, groups, addrs),
    st.builds(wire.GetMembers, reqs, groups),
    st.builds(wire.Route, groups, st.none() | addrs, addrs, st.binary(max_size=300)),
    st.builds(wire.Ok, reqs, st.none() | st.lists(members, max_size=4).map(tuple)),
    st.builds(wire.Error, st.none() | reqs, st.text(max_size=20), st.text(max_size=50)),
    st.builds(wire.Ping, st.integers(-(2**63), 2**64 - 1)),
    st.builds(wire.Pong, st.integers(-(2**63), 2**64 - 1)),
    st.builds(wire.Event, groups, st.sampled_from(wire.EVENT_KINDS), addrs, names, physical),
    st.builds(wire.Watch, reqs, groups),
    st.builds(wire.Unwatch, reqs, groups),
)


@settings(max_examples=300)
@given(frames)
def test_decode_encode_round_trip(frame: wire.Frame) -> None:
    d = wire.Decoder()
    d.feed(wire.encode(frame))
    assert d.frames() == [frame]
    assert d.pending == 0


@settings(max_examples=100)
@given(st.lists(frames, min_size=1, max_size=30), st.data())
def test_split_anywhere(fs: list[wire.Frame], data: st.DataObject) -> None:
    stream = b"".join(wire.encode(f) for f in fs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    d = wire.Decoder()
    out: list[wire.Frame] = []
    prev = 0
    for c in [*cuts, len(stream)]:
        d.feed(stream[prev:c])
        prev = c
        out += d.frames()
    assert out == fs


def test_one_byte_segments_and_hundreds_in_one_read() -> None:
    fs: list[wire.Frame] = [wire.Route("g", None, b"a", bytes([i % 256]) * i) for i in range(300)]
    stream = b"".join(wire.encode(f) for f in fs)
    d = wire.Decoder()
    out: list[wire.Frame] = []
    for i in range(len(stream)):
        d.feed(stream[i : i + 1])
        out += d.frames()
    assert out == fs
    d2 = wire.Decoder()
    d2.feed(stream)
    assert d2.frames() == fs


@settings(max_examples=500)
@given(st.binary(max_size=200))
def test_garbage_raises_only_protocol_error(data: bytes) -> None:
    d = wire.Decoder(max_frame=1000)
    try:
        d.feed(data)
        d.frames()
    except ProtocolError:
        pass


@settings(max_examples=300)
@given(st.binary(max_size=100))
def test_garbage_bodies_raise_only_protocol_error(body: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        wire.frame_from_body(body)


@settings(max_examples=300)
@given(st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text()
                    | st.binary(),
                    lambda c: st.lists(c, max_size=6), max_leaves=12))
def test_wellformed_msgpack_of_wrong_shape(value: object) -> None:
    """Any msgpack value is either a valid frame or a ProtocolError, never anything else."""
    with contextlib.suppress(ProtocolError):
        wire.frame_from_body(msgpack.packb(value, use_bin_type=True))


def test_oversize_length_refused_before_allocation() -> None:
    d = wire.Decoder(max_frame=1024)
    d.feed(struct.pack(">I", 2**31))  # only the prefix: no body was sent or buffered
    with pytest.raises(ProtocolError) as e:
        d.next_frame()
    assert e.value.code == "frame_too_large"
    assert d.pending == 4


def test_max_frame_boundary() -> None:
    body = msgpack.packb([wire.FrameType.PING, 1])
    d = wire.Decoder(max_frame=len(body))
    d.feed(struct.pack(">I", len(body)) + body)
    assert d.frames() == [wire.Ping(1)]
    d = wire.Decoder(max_frame=len(body) - 1)
    d.feed(struct.pack(">I", len(body)) + body)
    with pytest.raises(ProtocolError):
        d.frames()


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ([wire.FrameType.CONNECT, 1, "", b"a", None, []], "empty"),
        ([wire.FrameType.CONNECT, 1, "g", b"a" * 256, None, []], "longer than 255"),
        ([wire.FrameType.CONNECT, 1, "g" * 1025, b"a", None, []], "longer than 1024"),
        ([wire.FrameType.CONNECT, 1, "g", "a", None, []], "binary"),
        ([wire.FrameType.CONNECT, 1, "g", b"a", None], "takes 5 fields"),
        ([wire.FrameType.ROUTE, "g", None, b"a", "text"], "binary"),
        ([99, 1], "unknown frame type"),
        ({"type": 1}, "array"),
        ([wire.FrameType.EVENT, "g", "boom", b"a", None, []], "event kind"),
    ],
)
def test_invalid_frames_name_the_problem(value: object, why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        wire.frame_from_body(msgpack.packb(value, use_bin_type=True))


def test_invalid_utf8_group() -> None:
    body = b"\x93" + bytes([wire.FrameType.GET_MEMBERS]) + b"\x01" + b"\xa2\xff\xfe"
    with pytest.raises(ProtocolError):
        wire.frame_from_body(body)


@settings(max_examples=200)
@given(groups, st.none() | addrs, addrs, st.binary(max_size=70000))
def test_route_header_matches_full_decoder(
    group: str, dest: bytes | None, sender: bytes, payload: bytes
) -> None:
    frame = wire.encode_route(group, dest, sender, payload)
    g, d, s, hlen = route_header(frame, 4, len(frame))
    assert (g.decode(), d, s) == (group, dest, sender)
    assert frame[4 + hlen :].endswith(payload)
    assert wire.frame_from_body(frame[4:]) == wire.Route(group, dest, sender, payload)


def test_route_header_rejects_trailing_bytes() -> None:
    frame = wire.encode_route("g", None, b"a", b"x") + b"!"
    with pytest.raises(ProtocolError):
        route_header(frame, 4, len(frame))


def test_docs_example_bytes() -> None:
    """The hex example in docs/protocol.md §9 is what the codec produces."""
    assert wire.encode(wire.Hello((1,), "test", None)).hex() == "0000000a94019101a474657374c0"
    assert (wire.encode(wire.Connect(1, "demo", b"A", "A", ())).hex()
            == "0000000e960301a464656d6fc40141a14190")
    assert (wire.encode(wire.Route("demo", None, b"A", b"hi")).hex()
            == "0000000f9506a464656d6fc0c40141c4026869")


def test_renamed_names_still_work_with_a_deprecation_warning() -> None:
    """protocol.native.T and route_header were renamed/moved by issue 14; the old names keep
    working, with a DeprecationWarning naming the new ones."""
    import pytest

    from gossiprouter.protocol import native, native_scan

    with pytest.warns(DeprecationWarning, match="FrameType"):
        assert native.T is native.FrameType  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match="native_scan.route_header"):
        assert native.route_header is native_scan.route_header  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        native.no_such_name  # type: ignore[attr-defined]  # noqa: B018
