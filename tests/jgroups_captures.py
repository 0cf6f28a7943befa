"""Load the JGroups GossipRouter capture logs (real 2.12 and 5.5.6 traffic) for golden tests.

Each log line written by the capture proxy is ``epoch connN C>S|S>C nbytes hex``; a 0-byte line
is a FIN, and ``connN DIR ERR ...`` lines record socket errors. This module turns a log into
chunks in arrival order and reassembles each connection's byte stream per direction.

It also holds what the codec tests share: reference encoders written from the Java definitions
(independent of the codec modules) and hypothesis strategies for JGroups values.

The logs are kept in ``tests/data/jgroups_captures`` (copied from the reference notes); the
environment variable ``JGROUPS_CAPTURES`` takes precedence. A missing log fails the test.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
from hypothesis import settings
from hypothesis import strategies as st

from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.jgroups_address import V2, V5, JAddress

CAPTURES_212 = ("cap212.log", "captun212.log")
CAPTURES_556 = ("cap556.log", "captun556.log")

C2S = "C>S"
S2C = "S>C"


def capture_dir() -> Path | None:
    """The first directory that holds the capture logs, or None."""
    candidates = []
    env = os.environ.get("JGROUPS_CAPTURES")
    if env:
        candidates.append(Path(env))
    candidates.append(Path(__file__).parent / "data" / "jgroups_captures")
    for c in candidates:
        if (c / CAPTURES_212[0]).is_file():
            return c
    return None


@dataclass(frozen=True, slots=True)
class Chunk:
    """One ``recv()`` result seen by the proxy."""

    ts: float
    conn: str
    direction: str
    data: bytes


def parse_log(text: str) -> list[Chunk]:
    """Chunks in log order; FIN (0-byte) and ERR lines are left out."""
    chunks = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4 or parts[2] == "ERR" or parts[1] == "ERR":
            continue
        ts, conn, direction, count = parts[:4]
        data = bytes.fromhex(parts[4]) if len(parts) > 4 else b""
        if len(data) != int(count):
            raise ValueError(f"byte count mismatch in line: {line[:80]}")
        if data:
            chunks.append(Chunk(float(ts), conn, direction, data))
    return chunks


def load(name: str) -> list[Chunk]:
    """The chunks of one capture log; fails the calling test when the logs are not present."""
    d = capture_dir()
    if d is None:
        pytest.fail("JGroups capture logs not found in tests/data/jgroups_captures")
    return parse_log((d / name).read_text())


def streams(chunks: list[Chunk]) -> dict[tuple[str, str], bytes]:
    """``(conn, direction) -> the whole byte stream`` of that direction."""
    out: dict[tuple[str, str], bytearray] = {}
    for c in chunks:
        out.setdefault((c.conn, c.direction), bytearray()).extend(c.data)
    return {k: bytes(v) for k, v in out.items()}


def connection_chunks(chunks: list[Chunk]) -> dict[str, list[Chunk]]:
    """``conn -> its chunks`` in log order (both directions interleaved as observed)."""
    out: dict[str, list[Chunk]] = {}
    for c in chunks:
        out.setdefault(c.conn, []).append(c)
    return out


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the given offsets (clamped to its length), without empty pieces."""
    points = sorted({0, len(data), *(min(c, len(data)) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def one_byte_pieces(data: bytes) -> Iterator[bytes]:
    """``data`` as 1-byte segments."""
    for i in range(len(data)):
        yield data[i : i + 1]


# --------------------------------------------------------------------------- decoding helpers

#: The codec property tests' settings.
EXAMPLES = settings(max_examples=200, deadline=None)

class EventDecoder(Protocol):
    """A codec's stream decoder (``jgroups2.Decoder``/``ClientDecoder``, ``jgroups5.Decoder``)."""

    def feed(self, data: bytes) -> None: ...

    def next_event(self) -> object: ...

    @property
    def buffered(self) -> int: ...


def h(text: str) -> bytes:
    """Bytes written as spaced hex, as in the reference notes."""
    return bytes.fromhex(text)


def decode_all(dec: EventDecoder, data: bytes) -> list[Any]:
    """Feed ``data``; every event the decoder then has (typed by the caller)."""
    dec.feed(data)
    out: list[Any] = []
    while (ev := dec.next_event()) is not None:
        out.append(ev)
    return out


def drain_to_protocol_error(dec: EventDecoder) -> bool:
    """Every event ``dec`` has, where the one exception allowed is ProtocolError, after which
    the stream stays failed (the next call raises it again). True if it failed."""
    try:
        while dec.next_event() is not None:
            pass
    except ProtocolError:
        with pytest.raises(ProtocolError):  # the stream stays failed
            dec.next_event()
        return True
    return False


def assert_only_protocol_errors(dec: EventDecoder, data: bytes, cuts: list[int]) -> None:
    """Arbitrary ``data``, cut at ``cuts``, fed to ``dec`` piece by piece, every event read
    after each piece: the one exception is ProtocolError, and the stream stays failed."""
    for piece in split_at(data, cuts):
        dec.feed(piece)
        drain_to_protocol_error(dec)


def decode_pieces(dec: EventDecoder, data: bytes, cuts: list[int]) -> list[Any]:
    """Feed ``data`` cut at ``cuts`` (see :func:`split_at`); every event, in order."""
    out: list[Any] = []
    for piece in split_at(data, cuts):
        out += decode_all(dec, piece)
    return out


def assert_split_anywhere(
    dec: EventDecoder, encode: Callable[[Any], bytes], events: list[Any], cuts: list[int]
) -> None:
    """``events``, encoded back to back and cut at ``cuts``, decode to themselves, and nothing
    is left in the decoder."""
    assert decode_pieces(dec, b"".join(encode(e) for e in events), cuts) == events
    assert dec.buffered == 0


# --------------------------------------------------------------------------- shared test values
#
# Reference encoders written straight from the Java definitions (independently of the codec
# modules), and hypothesis strategies for JGroups values, shared by the codec test modules.


def java_write_utf(s: str) -> bytes:
    """``DataOutputStream.writeUTF`` as Java does it: per UTF-16 code unit, 1 to 3 bytes."""
    units = s.encode("utf-16-be", "surrogatepass")
    out = bytearray()
    for i in range(0, len(units), 2):
        c = int.from_bytes(units[i : i + 2], "big")
        if 0x0001 <= c <= 0x007F:
            out.append(c)
        elif c <= 0x07FF:
            out += bytes([0xC0 | (c >> 6), 0x80 | (c & 0x3F)])
        else:
            out += bytes([0xE0 | (c >> 12), 0x80 | ((c >> 6) & 0x3F), 0x80 | (c & 0x3F)])
    return len(out).to_bytes(2, "big") + bytes(out)


def java_write_string(s: str | None) -> bytes:
    return b"\x00" if s is None else b"\x01" + java_write_utf(s)


def _long(v: int) -> bytes:
    return v.to_bytes(8, "big", signed=True)


def uuid_key(msb: int, lsb: int) -> bytes:
    return _long(msb) + _long(lsb)


def int_compressed(v: int) -> bytes:
    """``Bits.writeIntCompressed`` (v >= 0 here)."""
    if v == 0:
        return b"\x00"
    n = (v.bit_length() + 7) // 8
    return bytes([n]) + v.to_bytes(n, "little")


# A built address: (raw writeAddress bytes, expected routing key)
Built = tuple[bytes, bytes]

longs = st.integers(-(2**63), 2**63 - 1)
ports = st.integers(0, 0xFFFF)
ipv4 = st.binary(min_size=4, max_size=4)
ipv6 = st.binary(min_size=16, max_size=16)
short_strings = st.none() | st.text(max_size=12)
opt_data = st.none() | st.binary(max_size=6)


def _additional(data: bytes | None) -> bytes:
    """The 2.12 UUID/IpAddress trailer: boolean presence [+ ushort len + bytes]."""
    return b"\x00" if data is None else b"\x01" + len(data).to_bytes(2, "big") + data


@st.composite
def _ip_body(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """IpAddress body without trailer, and its key."""
    if draw(st.booleans()):
        packed = draw(ipv4)
        body = b"\x04" + packed
    else:
        packed = draw(ipv6)
        body = (
            b"\x10"
            + packed
            + draw(st.integers(-(2**31), 2**31 - 1)).to_bytes(4, "big", signed=True)
        )
    port = draw(ports).to_bytes(2, "big")
    return body + port, b"ip:" + packed + port


@st.composite
def built_address_v2(draw: st.DrawFn) -> Built:
    """Any 2.12 address form: UUID, IpAddress, or "other class" (68, 82, 83, 84, 1)."""
    msb, lsb = draw(longs), draw(longs)
    key = uuid_key(msb, lsb)
    uuid_body = _long(lsb) + _long(msb) + _additional(draw(opt_data))
    form = draw(st.sampled_from(["uuid", "ip", "m68", "m82", "m83", "m84", "m1"]))
    if form == "uuid":
        return b"\x02" + uuid_body, key
    if form == "m68":
        return b"\x00\x00\x44" + uuid_body, key
    if form == "m82":
        return b"\x00\x00\x52" + uuid_body + java_write_string(draw(short_strings)), key
    if form == "m83":
        data = draw(opt_data)
        buf = b"\x00" if data is None else b"\x01" + len(data).to_bytes(4, "big") + data
        return b"\x00\x00\x53" + uuid_body + buf, key
    if form == "m84":
        strings = b"".join(java_write_string(draw(short_strings)) for _ in range(3))
        return b"\x00\x00\x54" + uuid_body + strings, key
    body, ipkey = draw(_ip_body())
    body += _additional(draw(opt_data))
    return (b"\x04" + body if form == "ip" else b"\x00\x00\x01" + body), ipkey


@st.composite
def _extended_tail(draw: st.DrawFn) -> bytes:
    """FlagsUUID flags + ExtendedUUID key/value table."""
    flags = int_compressed(draw(st.integers(0, 2**31 - 1)))
    pairs = draw(st.lists(st.tuples(st.binary(max_size=5), st.binary(max_size=5)), max_size=3))
    table = bytes([len(pairs)]) + b"".join(
        bytes([len(k)]) + k + bytes([len(v)]) + v for k, v in pairs
    )
    return flags + table


@st.composite
def built_address_v5(draw: st.DrawFn) -> Built:
    """Any 5.x address form: flags 02/04/08/10 and magic 1, 11, 12, 13, 14, 19, 22."""
    msb, lsb = draw(longs), draw(longs)
    key = uuid_key(msb, lsb)
    uuid_body = _long(lsb) + _long(msb)
    form = draw(
        st.sampled_from(
            ["uuid", "ip", "site", "sm", "m1", "m11", "m12", "m13", "m14", "m19", "m22"]
        )
    )
    if form == "uuid":
        return b"\x02" + uuid_body, key
    if form == "m11":
        return b"\x00\x00\x0b" + uuid_body, key
    if form == "m19":
        return b"\x00\x00\x13" + uuid_body + int_compressed(draw(st.integers(0, 2**31 - 1))), key
    if form == "m12":
        return b"\x00\x00\x0c" + uuid_body + draw(_extended_tail()), key
    if form in ("site", "sm", "m13", "m14"):
        site = draw(short_strings)
        tail = (
            draw(_extended_tail())
            + java_write_string(site)
            + java_write_string(draw(short_strings))
        )
        prefix = {"site": b"\x04", "sm": b"\x08", "m13": b"\x00\x00\x0d", "m14": b"\x00\x00\x0e"}
        is_sm = form in ("sm", "m14")
        return prefix[form] + uuid_body + tail, key + (
            b"sm" + java_write_string(site) if is_sm else b""
        )
    if form == "m22":
        millis = _long(draw(longs))
        return b"\x00\x00\x16" + millis, b"ms:" + millis
    body, ipkey = draw(_ip_body())
    return (b"\x10" + body if form == "ip" else b"\x00\x00\x01" + body), ipkey


def _parsed(version: int) -> Callable[[Built], JAddress]:
    def parse(b: Built) -> JAddress:
        a = JAddress.parse(b[0], version=version)
        assert a is not None
        return a

    return parse


#: JAddress values of every form, per wire version.
addresses_v2 = built_address_v2().map(_parsed(V2))
addresses_v5 = built_address_v5().map(_parsed(V5))

#: Group and logical names: None, ASCII, and anything unicode (NUL, non-BMP, ...).
names = st.none() | st.sampled_from(["demo", "", "\x00", "grüße", "😀 ok"]) | st.text(max_size=40)
payloads = st.binary(max_size=300)
