"""Tests for the JGroups 2.12 GossipRouter codec: reference examples, real captures, properties."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.jgroups_address import V2, V5, JAddress
from tests import jgroups_captures as cap
from tests.jgroups_captures import EXAMPLES, addresses_v2, decode_all, h, names, payloads

A = JAddress.from_uuid(0x0102030405060708, 0x1112131415161718, version=V2)
B = JAddress.from_uuid(0x2122232425262728, 0x3132333435363738, version=V2)
PHYS_A = JAddress.from_ip("127.0.0.1", 7800, version=V2)
PHYS_B = JAddress.from_ip("127.0.0.1", 7801, version=V2)




# --------------------------------------------------------------------------- reference §1.5

# (hex on the wire, the event the router's decoder yields)
CLIENT_REQUESTS = [
    (  # 1.5.1 CONNECT of A
        "01 01 0004 64656d6f 02 1112131415161718 0102030405060708 00 01 0001 41 ffff"
        " 0001 04 04 7f000001 1e78 00 00",
        j2.Connect("demo", A, "A", (PHYS_A,)),
    ),
    (  # 1.5.2 DISCONNECT of B
        "02 01 0004 64656d6f 02 3132333435363738 2122232425262728 00 00 ffff ffff 00",
        j2.Disconnect("demo", B),
    ),
    ("04 01 0004 64656d6f 01 00 ffff ffff 00", j2.GossipGet("demo")),  # 1.5.3
    (  # 1.5.4 unicast A -> B
        "0a 01 0004 64656d6f 02 3132333435363738 2122232425262728 00 00 ffff ffff 01 00000002 cafe",
        j2.Message("demo", B, b"\xca\xfe"),
    ),
    (  # 1.5.4 multicast
        "0a 01 0004 64656d6f 01 00 ffff ffff 01 00000003 010203",
        j2.Message("demo", None, b"\x01\x02\x03"),
    ),
    ("0c 00 01 00 ffff ffff 00", j2.Ping()),  # 1.5.6
    ("0d 00 01 00 ffff ffff 00", j2.Close()),
    (  # 1.5.7 a real TUNNEL CONNECT
        "01 01 0004 64656d6f 02 0f23defc64615c02 2692c89705796f36 00 01 0001 41 ffff"
        " 0001 04 04 7f000001 bbdc 00 00",
        j2.Connect(
            "demo",
            JAddress.from_uuid(0x2692C89705796F36, 0x0F23DEFC64615C02, version=V2),
            "A",
            (JAddress.from_ip("127.0.0.1", 0xBBDC, version=V2),),
        ),
    ),
]

MEMBERS_REPLY_HEX = (
    "0002"
    " 02 1112131415161718 0102030405060708 00 00 00 01 01 0001 41 0001 04 04 7f000001 1e78 00"
    " 02 3132333435363738 2122232425262728 00 00 00 01 01 0001 42 0001 04 04 7f000001 1e79 00"
)
MEMBERS = (j2.Member(A, "A", (PHYS_A,)), j2.Member(B, "B", (PHYS_B,)))


@pytest.mark.parametrize(("wire", "event"), CLIENT_REQUESTS)
def test_reference_client_requests(wire: str, event: j2.ServerEvent) -> None:
    data = h(wire)
    assert decode_all(j2.Decoder(), data) == [event]
    assert j2.encode(event) == data


def test_reference_request_encoders() -> None:
    assert j2.connect("demo", A, "A", [PHYS_A]) == h(CLIENT_REQUESTS[0][0])
    assert j2.disconnect("demo", B) == h(CLIENT_REQUESTS[1][0])
    assert j2.gossip_get("demo") == h(CLIENT_REQUESTS[2][0])
    assert j2.message("demo", B, b"\xca\xfe") == h(CLIENT_REQUESTS[3][0])
    assert j2.message("demo", None, b"\x01\x02\x03") == h(CLIENT_REQUESTS[4][0])
    assert j2.ping() == h(CLIENT_REQUESTS[5][0])
    assert j2.close() == h(CLIENT_REQUESTS[6][0])


def test_reference_router_replies() -> None:
    assert j2.connect_ok() == b"\x0e"
    assert j2.op_fail() == b"\x0f"
    assert j2.disconnect_ok() == h("10 00 01 00 ffff ffff 00")
    assert j2.gossip_get_reply(MEMBERS) == h(MEMBERS_REPLY_HEX)
    assert j2.gossip_get_reply([]) == h("0000")
    assert j2.message_to_client(B, b"\xca\xfe") == h(
        "0a 00 02 3132333435363738 2122232425262728 00 00 ffff ffff 01 00000002 cafe"
    )
    assert j2.message_to_client(None, b"\x01\x02\x03") == h(
        "0a 00 01 00 ffff ffff 01 00000003 010203"
    )
    assert j2.suspect(A) == h("0b 00 01 00 ffff ffff 00 02 1112131415161718 0102030405060708 00")


def test_reference_replies_decode_on_the_client() -> None:
    dec = j2.ClientDecoder()
    dec.expect_connect_reply()
    assert decode_all(dec, b"\x0e") == [j2.ConnectReply(0x0E)]
    dec.expect_members_reply()
    dec.expect_members_reply()
    wire = h(MEMBERS_REPLY_HEX) + h("0000")
    assert decode_all(dec, wire) == [j2.MembersReply(MEMBERS), j2.MembersReply(())]
    rest = (
        j2.message_to_client(B, b"\xca\xfe")
        + j2.suspect(A)
        + j2.disconnect_ok()
        + j2.encode_gossip_data(j2.OP_FAIL)
    )
    assert decode_all(dec, rest) == [
        j2.Message(None, B, b"\xca\xfe"),
        j2.Suspect(A),
        j2.DisconnectOk(),
        j2.OpFail(),
    ]
    dec.expect_connect_reply()
    assert decode_all(dec, b"\x0f") == [j2.ConnectReply(0x0F)]


def test_expectation_skips_an_object_already_partly_received() -> None:
    # A MESSAGE is half-way in when the client sends GOSSIP_GET: the reply is the object after it.
    msg = j2.message_to_client(None, b"payload")
    dec = j2.ClientDecoder()
    assert decode_all(dec, msg[:5]) == []
    dec.expect_members_reply()
    assert decode_all(dec, msg[5:] + h(MEMBERS_REPLY_HEX)) == [
        j2.Message(None, None, b"payload"),
        j2.MembersReply(MEMBERS),
    ]
    assert dec.received == len(msg) + len(h(MEMBERS_REPLY_HEX))


def test_connect_reply_ok() -> None:
    assert j2.ConnectReply(0x0E).ok
    assert not j2.ConnectReply(0x0F).ok
    assert not j2.ConnectReply(0x0A).ok


# --------------------------------------------------------------------------- captures


def _replay(chunks: Iterable[cap.Chunk], split: bool) -> tuple[list[j2.Event], list[j2.Event]]:
    """Replay one connection in observed order; returns (client->router, router->client) events.

    The router->client decoder is told what to expect when the client->router decoder sees
    the request, as a real client would.
    """
    sdec, cdec = j2.Decoder(), j2.ClientDecoder()
    sev: list[j2.Event] = []
    cev: list[j2.Event] = []
    for c in chunks:
        pieces = cap.one_byte_pieces(c.data) if split else [c.data]
        for piece in pieces:
            if c.direction == cap.C2S:
                for ev in decode_all(sdec, piece):
                    sev.append(ev)
                    if isinstance(ev, j2.Connect):
                        cdec.expect_connect_reply()
                    elif isinstance(ev, j2.GossipGet):
                        cdec.expect_members_reply()
            else:
                cev.extend(decode_all(cdec, piece))
    assert sdec.buffered == 0 and cdec.buffered == 0
    return sev, cev


def _encoded(events: Sequence[j2.Event]) -> bytes:
    return b"".join(j2.encode(ev) for ev in events)


@pytest.mark.parametrize("name", cap.CAPTURES_212)
@pytest.mark.parametrize("split", [False, True], ids=["as-received", "1-byte"])
def test_capture_replays_and_reencodes_exactly(name: str, split: bool) -> None:
    chunks = cap.load(name)
    whole = cap.streams(chunks)
    for conn, cl in cap.connection_chunks(chunks).items():
        sev, cev = _replay(cl, split)
        assert sev and cev
        assert not any(isinstance(e, j2.Unknown) for e in [*sev, *cev])
        assert _encoded(sev) == whole[(conn, cap.C2S)]
        assert _encoded(cev) == whole[(conn, cap.S2C)]


@pytest.mark.parametrize("name", cap.CAPTURES_212)
def test_capture_whole_streams(name: str) -> None:
    chunks = cap.load(name)
    for (conn, direction), data in cap.streams(chunks).items():
        if direction != cap.C2S:
            continue
        requests = decode_all(j2.Decoder(), data)
        assert _encoded(requests) == data
        # In these captures no asynchronous frame arrives between a request and its reply, so
        # the whole reply stream decodes with every expectation queued up front.
        cdec = j2.ClientDecoder()
        for ev in requests:
            if isinstance(ev, j2.Connect):
                cdec.expect_connect_reply()
            elif isinstance(ev, j2.GossipGet):
                cdec.expect_members_reply()
        replies = decode_all(cdec, cap.streams(chunks)[(conn, cap.S2C)])
        assert _encoded(replies) == cap.streams(chunks)[(conn, cap.S2C)]
        assert cdec.buffered == 0


def test_capture_stub_session_content() -> None:
    chunks = cap.load("cap212.log")
    sev, cev = _replay(cap.connection_chunks(chunks)["conn1"], split=False)
    assert sev == [
        j2.Connect("demo", A, "A", (PHYS_A,)),
        j2.GossipGet("demo"),
        j2.GossipGet("nosuchgroup"),
        j2.Message("demo", B, b"\xca\xfe"),
        j2.Message(
            "demo",
            JAddress.parse(h("02" + "5152535455565758414243444546474800"), version=V2),
            b"\xde\xad",
        ),
        j2.Message("demo", None, b"\x01\x02\x03"),
        j2.Ping(),
    ]
    assert cev == [
        j2.ConnectReply(0x0E),
        j2.MembersReply(MEMBERS),
        j2.MembersReply(()),
        j2.Message(None, None, b"\x01\x02\x03"),  # its own multicast comes back
        j2.Suspect(A),
    ]


# --------------------------------------------------------------------------- properties

opt_addr = st.none() | addresses_v2
opt_phys = st.none() | st.lists(addresses_v2, max_size=3).map(tuple)
SERVER_TYPES = {j2.CONNECT, j2.DISCONNECT, j2.GOSSIP_GET, j2.MESSAGE, j2.PING, j2.CLOSE}
CLIENT_TYPES = {j2.MESSAGE, j2.SUSPECT, j2.OP_FAIL, j2.DISCONNECT_OK}

server_events: st.SearchStrategy[j2.ServerEvent] = st.one_of(
    st.builds(j2.Connect, names, opt_addr, names, opt_phys),
    st.builds(j2.Disconnect, names, opt_addr),
    st.builds(j2.GossipGet, names),
    st.builds(j2.Message, names, opt_addr, payloads),
    st.just(j2.Ping()),
    st.just(j2.Close()),
    st.builds(j2.Unknown, st.integers(0, 255).filter(lambda t: t not in SERVER_TYPES)),
)
members = st.builds(j2.Member, opt_addr, names, opt_phys, st.booleans())
client_events: st.SearchStrategy[j2.ClientEvent] = st.one_of(
    st.builds(j2.ConnectReply, st.integers(0, 255)),
    st.builds(j2.MembersReply, st.lists(members, max_size=4).map(tuple)),
    st.builds(j2.Message, names, opt_addr, payloads),
    st.builds(j2.Suspect, opt_addr),
    st.just(j2.DisconnectOk()),
    st.just(j2.OpFail()),
    st.builds(j2.Unknown, st.integers(0, 255).filter(lambda t: t not in CLIENT_TYPES)),
)


def _decode_client_stream(
    events: Sequence[j2.ClientEvent], cuts: list[int]
) -> list[j2.ClientEvent]:
    """Encode ``events``, feed them cut at ``cuts``, and decode them as a client would.

    A client announces a reply when it sends the request, i.e. before any byte of the reply
    arrives: so the stream is also cut where each reply starts, and the expectation is queued
    just before that piece is fed.
    """
    wires = [j2.encode(e) for e in events]
    starts: dict[int, j2.ClientEvent] = {}
    offset = 0
    for ev, wire in zip(events, wires, strict=True):
        if isinstance(ev, j2.ConnectReply | j2.MembersReply):
            starts[offset] = ev
        offset += len(wire)
    data = b"".join(wires)
    dec = j2.ClientDecoder()
    out: list[j2.ClientEvent] = []
    fed = 0
    for piece in cap.split_at(data, [*cuts, *starts]):
        reply = starts.get(fed)
        if isinstance(reply, j2.ConnectReply):
            dec.expect_connect_reply()
        elif isinstance(reply, j2.MembersReply):
            dec.expect_members_reply()
        dec.feed(piece)
        fed += len(piece)
        out += _drain(dec)
    assert dec.buffered == 0
    return out


def _drain(dec: j2.ClientDecoder) -> list[j2.ClientEvent]:
    out: list[j2.ClientEvent] = []
    while (ev := dec.next_event()) is not None:
        out.append(ev)
    return out


@EXAMPLES
@given(server_events)
def test_server_event_round_trip(ev: j2.ServerEvent) -> None:
    assert decode_all(j2.Decoder(), j2.encode(ev)) == [ev]


@EXAMPLES
@given(client_events)
def test_client_event_round_trip(ev: j2.ClientEvent) -> None:
    assert _decode_client_stream([ev], []) == [ev]


@EXAMPLES
@given(st.lists(server_events, max_size=6), st.lists(st.integers(0, 5000), max_size=12))
def test_server_stream_split_anywhere(evs: list[j2.ServerEvent], cuts: list[int]) -> None:
    cap.assert_split_anywhere(j2.Decoder(), j2.encode, evs, cuts)


@EXAMPLES
@given(st.lists(client_events, max_size=6), st.lists(st.integers(0, 5000), max_size=12))
def test_client_stream_split_anywhere(evs: list[j2.ClientEvent], cuts: list[int]) -> None:
    assert _decode_client_stream(evs, cuts) == evs


@EXAMPLES
@given(st.lists(server_events, min_size=1, max_size=3))
def test_server_stream_one_byte_pieces(evs: list[j2.ServerEvent]) -> None:
    dec = j2.Decoder()
    out: list[j2.Event] = []
    for piece in cap.one_byte_pieces(b"".join(j2.encode(e) for e in evs)):
        out += decode_all(dec, piece)
    assert out == evs


@EXAMPLES
@given(st.binary(max_size=200), st.lists(st.integers(0, 200), max_size=5))
def test_arbitrary_bytes_router_side(data: bytes, cuts: list[int]) -> None:
    cap.assert_only_protocol_errors(j2.Decoder(max_frame=4096), data, cuts)


@EXAMPLES
@given(st.binary(max_size=200), st.lists(st.sampled_from(["c", "m"]), max_size=3))
def test_arbitrary_bytes_client_side(data: bytes, expects: list[str]) -> None:
    dec = j2.ClientDecoder(max_frame=4096)
    for e in expects:
        (dec.expect_connect_reply if e == "c" else dec.expect_members_reply)()
    dec.feed(data)
    cap.drain_to_protocol_error(dec)


@EXAMPLES
@given(server_events, st.binary(min_size=1, max_size=30))
def test_valid_prefix_then_garbage(ev: j2.ServerEvent, garbage: bytes) -> None:
    dec = j2.Decoder(max_frame=4096)
    dec.feed(j2.encode(ev) + garbage)
    assert dec.next_event() == ev
    cap.drain_to_protocol_error(dec)


# --------------------------------------------------------------------------- limits, errors


def test_oversize_buffer_refused_before_the_bytes_arrive() -> None:
    dec = j2.Decoder(max_frame=1 << 20)
    dec.feed(h("0a 00 01 00 ffff ffff 01 7fffffff"))  # MESSAGE claiming a 2 GiB buffer
    with pytest.raises(ProtocolError) as e:
        dec.next_event()
    assert e.value.code == "frame_too_large"
    with pytest.raises(ProtocolError):  # the stream cannot be resynchronised
        dec.next_event()


def test_oversize_string_refused() -> None:
    dec = j2.Decoder(max_frame=64)
    dec.feed(h("01 01 ffff"))  # a 65535-byte group name
    with pytest.raises(ProtocolError) as e:
        dec.next_event()
    assert e.value.code == "frame_too_large"


def test_max_frame_bounds_the_whole_object() -> None:
    ok = j2.message("demo", None, b"x" * 100)
    assert decode_all(j2.Decoder(max_frame=len(ok)), ok) == [j2.Message("demo", None, b"x" * 100)]
    with pytest.raises(ProtocolError):
        decode_all(j2.Decoder(max_frame=len(ok) - 1), ok)


@pytest.mark.parametrize(
    "wire",
    [
        "01 01 0004 64656d6f 07",  # bad address flags
        "01 02",  # bad presence byte for the group
        "0a 00 01 00 ffff ffff 01 ffffffff",  # negative buffer length
        "01 01 0002 f09f",  # 4-byte UTF-8 sequence
        "01 00 00 0063",  # unknown address magic number
    ],
)
def test_bad_input_raises(wire: str) -> None:
    dec = j2.Decoder()
    dec.feed(h(wire))
    with pytest.raises(ProtocolError) as e:
        dec.next_event()
    assert e.value.code == "protocol"


def test_unknown_type_is_parsed_and_ignored() -> None:
    # exp2 scenario 6: a full GossipData with type 0x63, then a GOSSIP_GET on the same stream
    wire = j2.encode_gossip_data(0x63, "demo") + j2.gossip_get("demo")
    assert decode_all(j2.Decoder(), wire) == [j2.Unknown(0x63), j2.GossipGet("demo")]


def test_null_buffer_message_decodes_as_empty() -> None:
    wire = j2.encode_gossip_data(j2.MESSAGE, "demo", None)
    assert decode_all(j2.Decoder(), wire) == [j2.Message("demo", None, b"")]


def test_other_address_forms_pass_through() -> None:
    topo = JAddress.parse(
        h("00 0054 1112131415161718 0102030405060708 00 01 0001 53 00 00"), version=V2
    )
    assert topo is not None and topo.key == A.key
    wire = j2.connect("demo", topo, "T", None)
    (ev,) = decode_all(j2.Decoder(), wire)
    assert isinstance(ev, j2.Connect) and ev.addr == topo and ev.physical is None
    assert j2.suspect(topo).endswith(topo.raw)


def test_members_reply_variants() -> None:
    dec = j2.ClientDecoder()
    dec.expect_members_reply()
    assert decode_all(dec, h("ffff")) == [j2.MembersReply(())]  # RouterStub reads none
    # a PingData with a view_id (coordinator address + long id) is accepted
    dec.expect_members_reply()
    entry = A.raw + h("00 01") + B.raw + h("0000000000000007 00 00 ffff")
    assert decode_all(dec, h("0001") + entry) == [
        j2.MembersReply((j2.Member(A, None, None, False),))
    ]
    dec.expect_members_reply()
    dec.feed(h("0001") + A.raw + h("01"))  # a View: not supported
    with pytest.raises(ProtocolError):
        dec.next_event()


def test_large_payload_in_small_pieces() -> None:
    # Correctness only; speed is benchmarks/bench_hotloop.py's job, not a wall-clock bound here.
    payload = bytes(range(256)) * 4096  # 1 MiB
    wire = j2.message("demo", B, payload)
    dec = j2.Decoder()
    events: list[j2.Event] = []
    for i in range(0, len(wire), 512):
        events += decode_all(dec, wire[i : i + 512])
    assert events == [j2.Message("demo", B, payload)]


def test_encoders_refuse_a_5x_address() -> None:
    a5 = JAddress.from_uuid(1, 2, version=V5)
    ip5 = JAddress.from_ip("127.0.0.1", 1, version=V5)
    encoders: list[Callable[[], bytes]] = [
        lambda: j2.connect("demo", a5, "A", None),
        lambda: j2.connect("demo", A, "A", [ip5]),
        lambda: j2.suspect(a5),
    ]
    for encode in encoders:
        with pytest.raises(ValueError, match="not 2"):
            encode()


def test_encode_rejects_foreign_objects() -> None:
    with pytest.raises(TypeError):
        j2.encode(object())  # type: ignore[arg-type]


def test_invalid_max_frame() -> None:
    with pytest.raises(ValueError):
        j2.Decoder(max_frame=0)
