"""Tests for the JGroups wire primitives: modified UTF-8, Reader, and the address model."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.jgroups_address import (
    V2,
    V5,
    AddressKind,
    JAddress,
    read_address,
    read_addresses,
    write_address,
    write_addresses,
)
from gossiprouter.protocol.jgroups_reader import (
    NeedMore,
    Reader,
    copy_bytes,
    decode_utf,
    encode_utf,
    write_string,
)
from tests.jgroups_captures import (
    Built,
    addresses_v2,
    addresses_v5,
    built_address_v2,
    built_address_v5,
    java_write_string,
    java_write_utf,
    longs,
)

EXAMPLES = settings(max_examples=200, deadline=None)

A_MSB, A_LSB = 0x0102030405060708, 0x1112131415161718

# --------------------------------------------------------------------------- modified UTF-8


@pytest.mark.parametrize(
    ("text", "wire"),
    [
        ("", "0000"),
        ("A", "000141"),
        ("demo", "000464656d6f"),
        ("\x00", "0002c080"),  # NUL uses the 2-byte form
        ("é", "0002c3a9"),
        ("€", "0003e282ac"),
        ("😀", "0006eda0bdedb880"),  # non-BMP: a surrogate pair, 3 bytes per half
        ("a\x00😀", "0009" + "61" + "c080" + "eda0bdedb880"),
    ],
)
def test_utf_examples(text: str, wire: str) -> None:
    assert encode_utf(text).hex() == wire
    assert decode_utf(bytes.fromhex(wire)[2:]) == text


def test_write_string() -> None:
    assert write_string(None) == b"\x00"
    assert write_string("demo") == bytes.fromhex("01000464656d6f")


def test_utf_length_limit() -> None:
    assert len(encode_utf("x" * 0xFFFF)) == 0x10001
    with pytest.raises(ProtocolError):
        encode_utf("x" * 0x10000)
    with pytest.raises(ProtocolError):
        encode_utf("é" * 0x8000)  # 65536 bytes once encoded


def test_decode_utf_lenient_where_java_is() -> None:
    assert decode_utf(b"a\x00b") == "a\x00b"  # Java's readUTF accepts a raw NUL byte
    assert decode_utf(b"\xed\xa0\x80") == "\ud800"  # lone surrogates survive, as in Java


@pytest.mark.parametrize(
    "bad",
    [
        b"\xf0\x9f\x98\x80",  # standard 4-byte UTF-8: no such form in modified UTF-8
        b"\xff",
        b"\x80",  # a continuation byte first
        b"\xc3",  # cut inside a sequence
        b"\xe2\x82",
        b"\xc3\x41",  # bad continuation
    ],
)
def test_decode_utf_rejects(bad: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_utf(bad)


@EXAMPLES
@given(st.text())
def test_utf_matches_java_and_round_trips(s: str) -> None:
    wire = encode_utf(s)
    assert wire == java_write_utf(s)
    assert decode_utf(wire[2:]) == s
    assert decode_utf(bytearray(wire[2:])) == s
    assert decode_utf(memoryview(wire)[2:]) == s


@EXAMPLES
@given(st.binary(max_size=40))
def test_decode_utf_only_raises_protocol_error(data: bytes) -> None:
    try:
        s = decode_utf(data)
    except ProtocolError:
        return
    assert isinstance(s, str)


# --------------------------------------------------------------------------- Reader


def test_reader_values() -> None:
    data = bytes.fromhex("ff 8000 7fffffff fffffffffffffffe 01 000141 00 0301020304")
    for buf in (data, bytearray(data), memoryview(data)):
        r = Reader(buf)
        assert r.i8() == -1
        assert r.i16() == -0x8000
        assert r.i32() == 0x7FFFFFFF
        assert r.i64() == -2
        assert r.string() == "A"
        assert r.string() is None
        assert r.int_compressed() == 0x030201
        assert r.remaining() == 1
        assert r.take(1) == b"\x04"


def test_reader_need_more_reports_the_offset() -> None:
    r = Reader(b"\x00\x05abc")
    n = r.u16()
    with pytest.raises(NeedMore) as e:
        r.take(n)
    assert e.value.needed == 7


def test_reader_limit_refuses_declared_length_at_once() -> None:
    # Only the length is present: the limit check happens before waiting for the bytes.
    r = Reader(b"\xff\xff", limit=100)
    n = r.u16()
    with pytest.raises(ProtocolError) as e:
        r.skip(n)
    assert e.value.code == "frame_too_large"


def test_reader_rejects_bad_presence_and_compressed_int() -> None:
    with pytest.raises(ProtocolError):
        Reader(b"\x02").string()
    with pytest.raises(ProtocolError):
        Reader(b"\x05\x00\x00\x00\x00\x00").int_compressed()


def test_copy_bytes_releases_bytearray() -> None:
    buf = bytearray(b"0123456789")
    assert copy_bytes(buf, 2, 5) == b"234"
    buf += b"more"  # would raise BufferError if a view were still exported
    del buf[:3]
    assert copy_bytes(memoryview(b"abc"), 1, 3) == b"bc"


# --------------------------------------------------------------------------- addresses


def test_uuid_v2_and_v5_encodings() -> None:
    a2 = JAddress.from_uuid(A_MSB, A_LSB, version=V2)
    a5 = JAddress.from_uuid(A_MSB, A_LSB, version=V5)
    assert a2.raw.hex() == "021112131415161718010203040506070800"
    assert a5.raw.hex() == "0211121314151617180102030405060708"
    assert a2.key == a5.key == bytes.fromhex("01020304050607081112131415161718")
    assert a2 != a5  # different wire bytes: the key is the identity
    assert str(a2) == str(a5) == "01020304-0506-0708-1112-131415161718"
    assert a2.uuid == uuid.UUID("01020304-0506-0708-1112-131415161718")
    assert a2.is_uuid and a2.kind is AddressKind.UUID
    assert a2.host_port is None
    assert JAddress.parse(a2.raw, version=V2) == a2
    assert JAddress.parse(a5.raw, version=V5) == a5


def test_uuid_accepts_unsigned_and_signed_bits() -> None:
    u = uuid.uuid4()
    a = JAddress.from_uuid_obj(u, version=V5)
    assert a.uuid == u and str(a) == str(u)
    msb, lsb = u.int >> 64, u.int & (2**64 - 1)
    signed = JAddress.from_uuid(msb - 2**64 if msb >= 2**63 else msb, lsb, version=V5)
    assert signed.key == a.key
    with pytest.raises(ValueError):
        JAddress.from_uuid(2**64, 0, version=V5)


def test_ip_encodings() -> None:
    assert JAddress.from_ip("127.0.0.1", 7800, version=V2).raw.hex() == "04047f0000011e7800"
    v5 = JAddress.from_ip("127.0.0.1", 7800, version=V5)
    assert v5.raw.hex() == "10047f0000011e78"
    assert v5.key == b"ip:\x7f\x00\x00\x01\x1e\x78"
    assert v5.host_port == ("127.0.0.1", 7800)
    assert str(v5) == "127.0.0.1:7800"
    assert not v5.is_uuid and v5.uuid is None

    six = JAddress.from_ip("fe80::1", 7801, version=V5, scope_id=3)
    assert six.raw.hex() == "1010fe800000000000000000000000000001000000031e79"
    assert six.host_port == ("fe80::1%3", 7801)
    assert str(six) == "[fe80::1%3]:7801"
    assert JAddress.from_ip("fe80::1%3", 7801, version=V5) == six
    # the scope id is not part of the identity (Inet6Address.equals ignores it)
    assert JAddress.from_ip("fe80::1", 7801, version=V5).key == six.key
    six2 = JAddress.from_ip("::1", 1, version=V2)
    assert six2.raw.hex() == "0410" + "00" * 15 + "01" + "00000000" + "0001" + "00"
    assert JAddress.parse(six2.raw, version=V2) == six2


def test_ip_null_address_and_additional_data_v2() -> None:
    a = JAddress.parse(bytes.fromhex("04 00 1e78 01 0002 abcd"), version=V2)
    assert a is not None and a.host_port == ("", 7800)
    assert a.key == b"ip:\x1e\x78" and str(a) == "<null>:7800"


def test_uuid_additional_data_v2_is_kept_in_raw() -> None:
    raw = bytes.fromhex("02 1112131415161718 0102030405060708 01 0003 aabbcc")
    a = JAddress.parse(raw, version=V2)
    assert a is not None and a.raw == raw
    assert a.key == JAddress.from_uuid(A_MSB, A_LSB, version=V2).key


def test_other_class_forms_v2() -> None:
    body = "1112131415161718 0102030405060708 00"
    key = JAddress.from_uuid(A_MSB, A_LSB, version=V2).key
    cases = {
        "00 0044 " + body: AddressKind.UUID,
        "00 0052 " + body + " 01 0001 78": AddressKind.PAYLOAD_UUID,
        "00 0053 " + body + " 01 00000002 abcd": AddressKind.ADDITIONAL_DATA_UUID,
        "00 0054 " + body + " 01 0003 4c4f4e 00 01 0002 6d31": AddressKind.TOPOLOGY_UUID,
    }
    for hexed, kind in cases.items():
        raw = bytes.fromhex(hexed)
        a = JAddress.parse(raw, version=V2)
        assert a is not None
        assert (a.kind, a.key, a.raw) == (kind, key, raw)
        assert str(a) == "01020304-0506-0708-1112-131415161718"
    ip = JAddress.parse(bytes.fromhex("00 0001 04 7f000001 1e78 00"), version=V2)
    assert ip is not None and ip.host_port == ("127.0.0.1", 7800)


def test_other_class_forms_v5() -> None:
    body = "1112131415161718 0102030405060708"
    key = JAddress.from_uuid(A_MSB, A_LSB, version=V5).key
    ext = " 01 05 01 01 6b 02 7676"  # flags=5, one pair k -> vv
    site = " 01 0003 4c4f4e 01 0001 41"  # site "LON", name "A"
    cases = {
        "00 000b " + body: AddressKind.UUID,
        "00 0013 " + body + " 02 0001": AddressKind.FLAGS_UUID,
        "00 000c " + body + ext: AddressKind.EXTENDED_UUID,
        "00 000c " + body + " 00 00": AddressKind.EXTENDED_UUID,
        "04 " + body + ext + site: AddressKind.SITE_UUID,
        "00 000d " + body + ext + site: AddressKind.SITE_UUID,
    }
    for hexed, kind in cases.items():
        raw = bytes.fromhex(hexed)
        a = JAddress.parse(raw, version=V5)
        assert a is not None
        assert (a.kind, a.key, a.raw) == (kind, key, raw)


def test_site_master_v5_key_includes_the_site() -> None:
    zero = "00" * 16
    lon = JAddress.parse(bytes.fromhex("08" + zero + "00 00 01 0003 4c4f4e 00"), version=V5)
    sfo = JAddress.parse(bytes.fromhex("08" + zero + "00 00 01 0003 53464f 00"), version=V5)
    every = JAddress.parse(bytes.fromhex("00 000e" + zero + "00 00 00 00"), version=V5)
    assert lon is not None and sfo is not None and every is not None
    assert lon.kind is sfo.kind is every.kind is AddressKind.SITE_MASTER
    assert len({lon.key, sfo.key, every.key, b"\x00" * 16}) == 4
    assert str(lon) == "SiteMaster(LON)"
    assert str(every) == "SiteMaster(<all sites>)"


def test_millis_address_v5() -> None:
    a = JAddress.parse(bytes.fromhex("00 0016 0000000000000457"), version=V5)
    assert a is not None and a.kind is AddressKind.MILLIS
    assert str(a) == "1111" and not a.is_uuid


@pytest.mark.parametrize(
    ("hexed", "version"),
    [
        ("03", V2),  # NULL|UUID bits: JGroups' writers never produce it
        ("08", V2),
        ("10 047f0000011e78", V2),  # the 5.x IP flag is not a 2.12 flag
        ("04 047f0000011e78 00", V5),  # 2.12 IP flag = SiteUUID in 5.x, truncated
        ("20", V5),
        ("00 0063", V2),  # unknown magic number
        ("00 0044", V5),  # a 2.12 magic number
        ("04 05 0102030405 1e78 00", V2),  # bad IP length
        ("02 1112", V5),  # truncated
        ("00 0013" + "00" * 16 + "09", V5),  # compressed int with 9 bytes
    ],
)
def test_bad_addresses(hexed: str, version: int) -> None:
    with pytest.raises(ProtocolError):
        JAddress.parse(bytes.fromhex(hexed), version=version)


def test_parse_rejects_trailing_bytes() -> None:
    with pytest.raises(ProtocolError):
        JAddress.parse(bytes.fromhex("02" + "00" * 16 + "00"), version=V5)


def test_null_address_and_lists() -> None:
    assert JAddress.parse(b"\x01", version=V2) is None
    assert write_address(None) == b"\x01"
    assert write_addresses(None) == b"\xff\xff"
    a = JAddress.from_ip("127.0.0.1", 7800, version=V2)
    b = JAddress.from_uuid(1, 2, version=V2)
    wire = write_addresses([a, b])
    assert wire == b"\x00\x02" + a.raw + b.raw
    assert read_addresses(Reader(wire), V2) == (a, b)
    assert read_addresses(Reader(b"\xff\xff"), V2) is None
    assert read_addresses(Reader(b"\x00\x00"), V2) == ()
    # a null entry inside a list is dropped
    assert read_addresses(Reader(b"\x00\x02\x01" + a.raw), V2) == (a,)


def test_wrong_version_or_port() -> None:
    with pytest.raises(ValueError):
        JAddress.from_uuid(1, 2, version=3)
    with pytest.raises(ValueError):
        JAddress.from_ip("127.0.0.1", 70000, version=V5)
    with pytest.raises(ValueError):
        read_address(Reader(b"\x04"), 4)


@pytest.mark.parametrize("version", [V2, V5])
@EXAMPLES
@given(st.data())
def test_any_address_parses_to_its_key(version: int, data: st.DataObject) -> None:
    raw, key = data.draw(built_address_v2() if version == V2 else built_address_v5())
    a = JAddress.parse(raw, version=version)
    assert a is not None
    assert a.raw == raw and a.key == key and a.version == version
    assert write_address(a) == write_address(a, version) == raw
    str(a)


@EXAMPLES
@given(built_address_v5(), st.integers(1, 30))
def test_truncated_addresses_need_more(built: Built, cut: int) -> None:
    raw = built[0]
    r = Reader(raw[: max(0, len(raw) - cut)])
    with pytest.raises(NeedMore):
        read_address(r, V5)


@EXAMPLES
@given(longs, longs)
def test_uuid_round_trip_and_identity_across_versions(msb: int, lsb: int) -> None:
    a2 = JAddress.from_uuid(msb, lsb, version=V2)
    a5 = JAddress.from_uuid(msb, lsb, version=V5)
    assert JAddress.parse(a2.raw, version=V2) == a2
    assert JAddress.parse(a5.raw, version=V5) == a5
    assert a2.key == a5.key
    assert str(a5) == str(uuid.UUID(bytes=a5.key))


@EXAMPLES
@given(st.lists(addresses_v2, max_size=4), st.lists(addresses_v5, max_size=4))
def test_address_lists_round_trip(l2: list[JAddress], l5: list[JAddress]) -> None:
    assert read_addresses(Reader(write_addresses(l2)), V2) == tuple(l2)
    assert read_addresses(Reader(write_addresses(l5)), V5) == tuple(l5)


@EXAMPLES
@given(st.binary(max_size=64), st.sampled_from([V2, V5]))
def test_arbitrary_bytes_only_raise_protocol_error(data: bytes, version: int) -> None:
    try:
        a = JAddress.parse(data, version=version)
    except ProtocolError:
        return
    if a is not None:
        assert a.raw == data
        str(a)
        repr(a)


def test_java_reference_helpers_agree() -> None:
    assert java_write_string("A") == write_string("A")
