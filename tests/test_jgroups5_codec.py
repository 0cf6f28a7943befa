"""Tests for the JGroups 3.6.5+/5.x GossipRouter codec: reference examples, captures, properties."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.jgroups_address import V2, V5, JAddress
from tests import jgroups_captures as cap
from tests.jgroups_captures import EXAMPLES, addresses_v5, decode_all, h, names, payloads

A = JAddress.from_uuid(0x0102030405060708, 0x1112131415161718, version=V5)
B = JAddress.from_uuid(0x2122232425262728, 0x3132333435363738, version=V5)
C = JAddress.from_uuid(0x4142434445464748, 0x5152535455565758, version=V5)
PHYS_A = JAddress.from_ip("127.0.0.1", 7800, version=V5)
PHYS_B = JAddress.from_ip("127.0.0.1", 7801, version=V5)
PHYS_C = JAddress.from_ip("127.0.0.1", 7802, version=V5)
A_HEX = "02 1112131415161718 0102030405060708"
B_HEX = "02 3132333435363738 2122232425262728"




def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def message_event(wire: bytes) -> j5.Message:
    (ev,) = decode_all(j5.Decoder(), wire)
    assert isinstance(ev, j5.Message)
    return ev


# --------------------------------------------------------------------------- reference §2.5

MEMBERS_REPLY_HEX = (
    "00000052 07 01 0004 64656d6f 01 01 00 0002"
    f" {A_HEX} 01 01 0001 41 10 04 7f000001 1e78 ffff"
    f" {B_HEX} 01 01 0001 42 10 04 7f000001 1e79 ffff"
    " 01 00000000"
)
MEMBERS = (j5.Member(A, "A", PHYS_A), j5.Member(B, "B", PHYS_B))

REFERENCE = [
    (
        f"0000002c 00 01 0004 64656d6f {A_HEX} 01 01 0001 41 0000 10 04 7f000001 1e78 00000000",
        j5.Register("demo", A, "A", PHYS_A),
    ),
    ("00000012 02 01 0004 64656d6f 01 01 00 0000 01 00000000", j5.GetMembers("demo")),
    ("0000000c 02 00 01 01 00 0000 01 00000000", j5.GetMembers(None)),
    (MEMBERS_REPLY_HEX, j5.MembersReply("demo", MEMBERS, last=True)),
    ("0000000c 05 00 01 01 00 0000 01 00000000", None),  # HEARTBEAT, checked below
    (f"00000022 06 01 0004 64656d6f {A_HEX} 01 00 0000 01 00000000", j5.Suspect("demo", A)),
    (f"00000022 01 01 0004 64656d6f {B_HEX} 01 00 0000 01 00000000", j5.Unregister("demo", B)),
    ("fffffffb", j5.CloseMarker()),
]

UNICAST_HEX = f"00000030 04 01 0004 64656d6f {B_HEX} {A_HEX} 00000002 cafe"
MULTICAST_HEX = f"00000021 04 01 0004 64656d6f 01 {A_HEX} 00000003 010203"


@pytest.mark.parametrize(("wire", "event"), REFERENCE)
def test_reference_frames(wire: str, event: j5.Event | None) -> None:
    data = h(wire)
    if event is None:
        event = j5.Heartbeat(data)
    assert decode_all(j5.Decoder(), data) == [event]
    assert j5.encode(event) == data


def test_reference_encoders() -> None:
    assert j5.register("demo", A, "A", PHYS_A) == h(REFERENCE[0][0])
    assert j5.get_members("demo") == h(REFERENCE[1][0])
    assert j5.get_members(None) == h(REFERENCE[2][0])
    assert j5.get_members_reply("demo", MEMBERS, last=True) == h(MEMBERS_REPLY_HEX)
    assert j5.heartbeat() == h(REFERENCE[4][0])
    assert j5.suspect("demo", A) == h(REFERENCE[5][0])
    assert j5.unregister("demo", B) == h(REFERENCE[6][0])
    assert j5.close_marker() == j5.CLOSE_MARKER == h("fffffffb")
    assert j5.message("demo", B, A, b"\xca\xfe") == h(UNICAST_HEX)
    assert j5.message("demo", None, A, b"\x01\x02\x03") == h(MULTICAST_HEX)


def test_reference_messages_carry_their_raw_frame() -> None:
    for wire, dest, payload in (
        (UNICAST_HEX, B, b"\xca\xfe"),
        (MULTICAST_HEX, None, b"\x01\x02\x03"),
    ):
        data = h(wire)
        ev = message_event(data)
        assert (ev.group, ev.dest, ev.sender) == ("demo", dest, A)
        assert ev.raw == data
        assert ev.payload == payload
        assert bytes(ev.payload_view()) == payload
        assert j5.encode(ev) == data


def test_members_reply_type_3_and_all_groups() -> None:
    wire = j5.get_members_reply("<<all-groups>>:other", [j5.Member(C, "C", PHYS_C)], last=False)
    assert wire[4] == j5.GET_MBRS_RSP
    assert decode_all(j5.Decoder(), wire) == [
        j5.MembersReply("<<all-groups>>:other", (j5.Member(C, "C", PHYS_C),), last=False)
    ]


# --------------------------------------------------------------------------- captures


def _check_stream(events: list[j5.Event], data: bytes) -> None:
    assert not any(isinstance(e, j5.Malformed) for e in events)
    assert b"".join(j5.encode(e) for e in events) == data
    # every frame-carrying event holds exactly its own frame
    pos = 0
    for e in events:
        size = 4 if isinstance(e, j5.CloseMarker) else 4 + struct.unpack_from(">i", data, pos)[0]
        if isinstance(e, j5.Message | j5.Heartbeat):
            assert e.raw == data[pos : pos + size]
        pos += size
    assert pos == len(data)


@pytest.mark.parametrize("name", cap.CAPTURES_556)
def test_capture_whole_streams(name: str) -> None:
    for data in cap.streams(cap.load(name)).values():
        dec = j5.Decoder()
        events = decode_all(dec, data)
        assert events and dec.buffered == 0
        _check_stream(events, data)


@pytest.mark.parametrize("name", cap.CAPTURES_556)
def test_capture_one_byte_pieces(name: str) -> None:
    for data in cap.streams(cap.load(name)).values():
        dec = j5.Decoder()
        events: list[j5.Event] = []
        for piece in cap.one_byte_pieces(data):
            events += decode_all(dec, piece)
        _check_stream(events, data)


@pytest.mark.parametrize("name", cap.CAPTURES_556)
def test_capture_as_received(name: str) -> None:
    chunks = cap.load(name)
    whole = cap.streams(chunks)
    for conn, cl in cap.connection_chunks(chunks).items():
        decoders = {"C>S": j5.Decoder(), "S>C": j5.Decoder()}
        events: dict[str, list[j5.Event]] = {"C>S": [], "S>C": []}
        for c in cl:
            events[c.direction] += decode_all(decoders[c.direction], c.data)
        for direction, evs in events.items():
            if (conn, direction) in whole:
                _check_stream(evs, whole[(conn, direction)])


def test_capture_stub_session_content() -> None:
    s = cap.streams(cap.load("cap556.log"))
    assert decode_all(j5.Decoder(), s[("conn1", "C>S")])[:4] == [
        j5.Register("demo", A, "A", PHYS_A),
        j5.GetMembers("demo"),
        j5.GetMembers("nosuchgroup"),
        j5.GetMembers(None),
    ]
    replies = decode_all(j5.Decoder(), s[("conn1", "S>C")])
    assert replies[:3] == [
        j5.MembersReply("demo", MEMBERS, last=True),
        j5.MembersReply("<<all-groups>>:other", (j5.Member(C, "C", PHYS_C),), last=False),
        j5.MembersReply("<<all-groups>>:demo", MEMBERS, last=True),
    ]
    assert decode_all(j5.Decoder(), s[("conn2", "S>C")])[-1] == j5.Suspect("demo", A)


# --------------------------------------------------------------------------- properties

opt_addr = st.none() | addresses_v5
members = st.builds(
    j5.Member,
    opt_addr,
    names,
    opt_addr,
    st.integers(0, 255),
    st.none() | st.lists(addresses_v5, max_size=3).map(tuple),
)
messages = st.builds(j5.message, names, opt_addr, opt_addr, payloads).map(message_event)
events: st.SearchStrategy[j5.Event] = st.one_of(
    st.builds(j5.Register, names, opt_addr, names, opt_addr),
    st.builds(j5.Unregister, names, opt_addr),
    st.builds(j5.GetMembers, names),
    messages,
    st.just(j5.Heartbeat(j5.heartbeat())),
    st.just(j5.CloseMarker()),
    st.builds(j5.MembersReply, names, st.lists(members, max_size=4).map(tuple), st.booleans()),
    st.builds(j5.Suspect, names, opt_addr),
)


@EXAMPLES
@given(events)
def test_event_round_trip(ev: j5.Event) -> None:
    assert decode_all(j5.Decoder(), j5.encode(ev)) == [ev]


@EXAMPLES
@given(names, opt_addr, opt_addr, payloads)
def test_message_fields_round_trip(
    group: str | None, dest: JAddress | None, sender: JAddress | None, payload: bytes
) -> None:
    wire = j5.message(group, dest, sender, payload)
    ev = message_event(wire)
    assert (ev.group, ev.dest, ev.sender, ev.payload, ev.raw) == (
        group,
        dest,
        sender,
        payload,
        wire,
    )


@EXAMPLES
@given(st.lists(events, max_size=6), st.lists(st.integers(0, 4000), max_size=12))
def test_stream_split_anywhere(evs: list[j5.Event], cuts: list[int]) -> None:
    cap.assert_split_anywhere(j5.Decoder(), j5.encode, evs, cuts)


@EXAMPLES
@given(st.binary(max_size=200), st.lists(st.integers(0, 200), max_size=5))
def test_arbitrary_bytes_only_raise_protocol_error(data: bytes, cuts: list[int]) -> None:
    cap.assert_only_protocol_errors(j5.Decoder(max_frame=4096), data, cuts)


@EXAMPLES
@given(st.lists(st.binary(max_size=80), min_size=1, max_size=4))
def test_arbitrary_frame_bodies_never_desync(bodies: list[bytes]) -> None:
    data = b"".join(frame(b) for b in bodies) + j5.heartbeat()
    out = decode_all(j5.Decoder(), data)
    assert len(out) == len(bodies) + 1
    assert out[-1] == j5.Heartbeat(j5.heartbeat())
    for body, ev in zip(bodies, out, strict=False):
        if isinstance(ev, j5.Malformed):
            assert ev.body_len == len(body)
        elif isinstance(ev, j5.Message | j5.Heartbeat):
            assert ev.raw == frame(body)


# --------------------------------------------------------------------------- malformed frames


def _register_body() -> bytes:
    return j5.register("demo", A, "A", PHYS_A)[4:]


MALFORMED = {
    "type 9": frame(b"\x09\x00\x01\x01\x00\x00\x00\x01\x00\x00\x00\x00"),
    "type 255": frame(b"\xff" + j5.heartbeat()[5:]),
    "trailing bytes": frame(_register_body() + b"\x00\x00\x00\x05"),
    "trailing after payload": frame(j5.message("demo", None, A, b"xy")[4:] + b"z"),
    "empty frame": b"\x00\x00\x00\x00",
    "truncated body": frame(_register_body()[:-7]),
    "truncated payload": frame(j5.message("demo", None, A, b"xyz")[4:-1]),
    "bad address flags": frame(b"\x04\x01\x00\x04demo\x07"),
    "bad utf": frame(b"\x02\x01\x00\x02\xf0\x9f\x01\x01\x00\x00\x00\x01\x00\x00\x00\x00"),
    "negative payload length": frame(b"\x04\x00\x01\x01\xff\xff\xff\xff"),
    "unknown address magic": frame(b"\x00\x00\x00\x00\x63"),
}


@pytest.mark.parametrize("bad", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_frame_is_skipped(bad: bytes) -> None:
    good = j5.message("demo", B, A, b"\xca\xfe")
    dec = j5.Decoder()
    out = decode_all(dec, bad + good + bad + j5.heartbeat())
    assert len(out) == 4
    assert isinstance(out[0], j5.Malformed) and isinstance(out[2], j5.Malformed)
    assert out[0].body_len == len(bad) - 4
    assert out[0].reason
    assert out[1] == message_event(good)
    assert out[3] == j5.Heartbeat(j5.heartbeat())


def test_malformed_in_one_byte_pieces() -> None:
    data = b"".join(MALFORMED.values()) + j5.heartbeat()
    dec = j5.Decoder()
    out: list[j5.Event] = []
    for piece in cap.one_byte_pieces(data):
        out += decode_all(dec, piece)
    assert [type(e) for e in out] == [j5.Malformed] * len(MALFORMED) + [j5.Heartbeat]


def test_encode_refuses_malformed() -> None:
    with pytest.raises(ValueError):
        j5.encode(j5.Malformed("x", 1))
    with pytest.raises(TypeError):
        j5.encode(object())  # type: ignore[arg-type]


# --------------------------------------------------------------------------- limits


def test_huge_length_refused_on_the_prefix_alone() -> None:
    dec = j5.Decoder(max_frame=16 * 1024 * 1024)
    dec.feed(b"\x7f\xff\xff\xff")  # ~2 GiB; not one body byte has arrived
    with pytest.raises(ProtocolError) as e:
        dec.next_event()
    assert e.value.code == "frame_too_large"
    with pytest.raises(ProtocolError):  # no resynchronisation after an oversize prefix
        dec.next_event()


def test_http_probe_is_refused() -> None:
    dec = j5.Decoder()
    dec.feed(b"GET / HTTP/1.1\r\n")  # read as length 0x47455420
    with pytest.raises(ProtocolError) as e:
        dec.next_event()
    assert e.value.code == "frame_too_large"


@pytest.mark.parametrize("prefix", [b"\xff\xff\xff\xff", b"\x80\x00\x00\x00", b"\xff\xff\xff\xfa"])
def test_negative_length_other_than_close_marker(prefix: bytes) -> None:
    dec = j5.Decoder()
    dec.feed(prefix)
    with pytest.raises(ProtocolError) as e:
        dec.next_event()
    assert e.value.code == "protocol"


def test_max_frame_boundary() -> None:
    wire = j5.message("demo", None, A, b"x" * 50)
    body_len = len(wire) - 4
    assert len(decode_all(j5.Decoder(max_frame=body_len), wire)) == 1
    dec = j5.Decoder(max_frame=body_len - 1)
    dec.feed(wire[:4])
    with pytest.raises(ProtocolError):
        dec.next_event()


def test_close_marker_then_more_frames() -> None:
    out = decode_all(j5.Decoder(), j5.close_marker() + j5.heartbeat())
    assert out == [j5.CloseMarker(), j5.Heartbeat(j5.heartbeat())]


def test_partial_frame_stays_buffered() -> None:
    dec = j5.Decoder()
    wire = j5.heartbeat()
    assert decode_all(dec, wire[:7]) == []
    assert dec.buffered == 7
    assert decode_all(dec, wire[7:]) == [j5.Heartbeat(wire)]
    assert dec.buffered == 0


def test_other_address_forms_are_forwarded_byte_for_byte() -> None:
    ext = JAddress.parse(h(f"00 000c {A_HEX[3:]} 01 05 01 01 6b 02 7676"), version=V5)
    assert ext is not None and ext.key == A.key
    wire = j5.message("demo", B, ext, b"p")
    ev = message_event(wire)
    assert ev.sender == ext and ev.raw == wire
    assert ev.sender is not None and ev.sender.key == A.key


def test_encoders_refuse_a_212_address() -> None:
    a2 = JAddress.from_uuid(1, 2, version=V2)
    ip2 = JAddress.from_ip("::1", 1, version=V2)
    encoders: list[Callable[[], bytes]] = [
        lambda: j5.register("demo", a2, "A", None),
        lambda: j5.message("demo", None, a2, b""),
        lambda: j5.get_members_reply("demo", [j5.Member(A, "A", ip2)], True),
    ]
    for encode in encoders:
        with pytest.raises(ValueError, match="not 5"):
            encode()


def test_invalid_max_frame() -> None:
    with pytest.raises(ValueError):
        j5.Decoder(max_frame=-1)


def test_many_messages_in_one_feed() -> None:
    # Correctness only; speed is benchmarks/bench_hotloop.py's job, not a wall-clock bound here.
    one = j5.message("demo", B, A, b"p" * 1000)
    dec = j5.Decoder()
    dec.feed(one * 20_000)
    n = 0
    while (ev := dec.next_event()) is not None:
        assert isinstance(ev, j5.Message) and ev.raw == one, ev
        n += 1
    assert n == 20_000
