"""The native scanner (protocol/native_scan.py) against a naive frame-by-frame reference.

The scanner groups same-header ROUTE frames into runs (extended frame by frame, or counted
column-wise when they have one size) and same-size PUBLISH frames into runs, and finds cached
headers by their bytes. These tests build random frame sequences whose meaning is known by
construction (the reference: one frame at a time, no parsing), cut them at random points,
feed the pieces as the session does (a cut frame is carried into the next piece) and check
that the items cover exactly the reference's frames, with the right kinds and headers, and
that runs are as long as the piece allows.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gossiprouter.protocol import native as wire
from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.native_scan import (
    CONTROL,
    MALFORMED,
    PARTIAL,
    PUBLICATIONS,
    RUN,
    TOO_LARGE,
    Item,
    NativeScanner,
    RouteHeader,
)
from gossiprouter.protocol.scan import HeaderCache, same_frames

MAX_FRAME = 70_000
ROUTE = bytes(wire.ROUTE_START)  # how a ROUTE body starts: fixarray of 5, type 6
PUBLISH = bytes(wire.PUBLISH_START)


def _framed(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def _bin(b: bytes, wide: bool) -> bytes:
    """A msgpack bin: minimal, or (``wide``) always bin 32."""
    if wide:
        return b"\xc6" + struct.pack(">I", len(b)) + b
    packed: bytes = msgpack.packb(b, use_bin_type=True)
    return packed


@dataclass(frozen=True)
class Ref:
    """One frame of the reference stream and what it is, known from how it was built."""

    kind: int  # RUN (a relayed ROUTE), PUBLICATIONS, CONTROL, MALFORMED or TOO_LARGE
    frame: bytes
    key: bytes = b""  # the bytes a run shares: ROUTE header; PUBLISH everything but the payload
    route: RouteHeader | None = None


def _route(group: str, dest: bytes | None, sender: bytes, payload: bytes, wide_group: bool,
           wide_payload: bool) -> Ref:
    g = group.encode()
    group_b = (b"\xd9" + bytes([len(g)]) + g) if wide_group else msgpack.packb(group)
    dest_b = b"\xc0" if dest is None else _bin(dest, False)
    header = ROUTE + group_b + dest_b + _bin(sender, False)
    frame = _framed(header + _bin(payload, wide_payload))
    return Ref(RUN, frame, header, (group, dest, sender))


def _publish(group: str, sender: bytes, flags: int, payload: bytes) -> Ref:
    frame = wire.encode_publish(group, sender, "p", "b", ("eu",), flags, payload)
    return Ref(PUBLICATIONS, frame, frame[: len(frame) - len(payload)])


routes = st.builds(
    _route,
    st.sampled_from(["g", "h", "ü"]),
    st.sampled_from([None, b"R1", b"S2"]),
    st.sampled_from([b"S1", b"S2", b"S3", b"S4"]),
    st.sampled_from([0, 1, 2, 5, 100, 255, 256, 300]).map(lambda n: b"x" * n),
    st.booleans(),
    st.booleans(),
)
publications = st.builds(
    _publish, st.sampled_from(["g", "h"]), st.sampled_from([b"S1", b"S2"]),
    st.sampled_from([0, 1]), st.sampled_from([b"", b"ab", b"cd", b"abc", b"y" * 300]),
)
controls = st.one_of(
    st.integers(0, 2**40).map(lambda i: Ref(CONTROL, wire.encode(wire.Ping(i)))),
    # A ROUTE with a non-minimal array header is not relayed on the fast path.
    routes.map(lambda r: Ref(CONTROL, _framed(b"\xdc\x00\x05" + r.frame[5:]))),
)
# Frames that end a connection: a ROUTE / PUBLISH that does not parse, a frame too large.
enders = st.one_of(
    routes.map(lambda r: Ref(MALFORMED, _framed(r.frame[4:] + b"!"))),  # trailing byte
    routes.map(lambda r: Ref(MALFORMED, _framed(r.frame[4:].replace(ROUTE, ROUTE + b"\x01", 1)))),
    # (above: a number where the group should be)
    st.just(Ref(MALFORMED, _framed(PUBLISH + b"\xa1g"))),  # a PUBLISH cut short
    st.just(Ref(TOO_LARGE, struct.pack(">I", MAX_FRAME + 1) + ROUTE)),
)
streams = st.tuples(
    st.lists(st.one_of(routes, routes, routes, publications, controls), max_size=50),
    st.none() | enders,
)


def _scan_in_pieces(scanner: NativeScanner, stream: bytes,
                    cuts: list[int]) -> list[tuple[bytes, list[Item]]]:
    """Feed ``stream`` cut at ``cuts`` as the session does: a frame cut by the end of a piece
    is kept and completed by the next pieces. Returns each scanned buffer and its items."""
    out: list[tuple[bytes, list[Item]]] = []
    rest, need = b"", 0
    prev = 0
    for c in [*sorted(cuts), len(stream)]:
        piece, prev = stream[prev:c], c
        data = rest + piece
        if len(data) < need or not data:
            rest = data
            continue
        items = list(scanner.scan(data))
        out.append((data, items))
        rest, need = b"", 0
        if items and items[-1][0] == PARTIAL:
            rest, need = data[items[-1][1] :], items[-1][3]
        if items and items[-1][0] in (MALFORMED, TOO_LARGE):
            break
    return out


def _frames(data: bytes, start: int, end: int) -> list[bytes]:
    out = []
    while start < end:
        stop = start + 4 + struct.unpack_from(">I", data, start)[0]
        out.append(data[start:stop])
        start = stop
    assert start == end, "an item must hold whole frames"
    return out


@settings(max_examples=400, deadline=None)
@given(streams, st.data())
def test_scanner_matches_the_reference(stream_spec: tuple[list[Ref], Ref | None],
                                       data: st.DataObject) -> None:
    refs, ender = stream_spec
    if ender is not None:
        refs = [*refs, ender]
    stream = b"".join(r.frame for r in refs)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8))
    scanner = NativeScanner(MAX_FRAME, relay=True)
    got: list[tuple[int, bytes, RouteHeader | None]] = []  # (kind, frame, route) per frame
    where: list[tuple[int, int]] = []  # per frame: (which scan, which item)
    for nscan, (buf, items) in enumerate(_scan_in_pieces(scanner, stream, cuts)):
        for nitem, item in enumerate(items):
            kind, start, end, count = item[0], item[1], item[2], item[3]
            if kind == PARTIAL:
                assert nitem == len(items) - 1 and end == len(buf)
                assert count == (4 + struct.unpack_from(">I", buf, start)[0]
                                 if len(buf) - start >= 4 else 4)
                continue
            if kind in (MALFORMED, TOO_LARGE):
                assert nitem == len(items) - 1
                if kind == MALFORMED:
                    assert isinstance(item[4], ProtocolError)
                else:
                    assert count > MAX_FRAME
                frames = [buf[start:end] if kind == MALFORMED else b""]
            else:
                frames = _frames(buf, start, end)
                assert len(frames) == count >= 1
            if item[0] == PUBLICATIONS:
                assert item[4] == wire.frame_from_body(frames[0][4:])
            route = item[4] if item[0] == RUN else None
            got += [(kind, f, route) for f in frames]
            where += [(nscan, nitem)] * len(frames)
    assert got == [(r.kind, r.frame if r.kind != TOO_LARGE else b"", r.route) for r in refs]
    # Runs are as long as the bytes scanned at once allow: two neighbouring frames of one scan
    # are in one item exactly when they share their run's bytes.
    for i in range(len(refs) - 1):
        a, b = refs[i], refs[i + 1]
        if where[i][0] == where[i + 1][0] and a.kind == b.kind and a.kind in (RUN, PUBLICATIONS):
            assert (where[i] == where[i + 1]) == (a.key == b.key), (i, a, b)


def test_same_size_run_stops_at_a_different_header() -> None:
    to_a = wire.encode_route("g", b"A", b"S", b"x" * 10)
    to_b = wire.encode_route("g", b"B", b"S", b"x" * 10)  # same size, differs in one byte
    data = to_a * 50 + to_b + to_a * 3
    items = list(NativeScanner(MAX_FRAME, relay=True).scan(data))
    step = len(to_a)
    assert items == [(RUN, 0, 50 * step, 50, ("g", b"A", b"S")),
                     (RUN, 50 * step, 51 * step, 1, ("g", b"B", b"S")),
                     (RUN, 51 * step, 54 * step, 3, ("g", b"A", b"S"))]


def test_interleaved_senders_each_frame_a_run_from_the_cache() -> None:
    """Four senders in turn: every frame is a run of one, its header found by its bytes."""
    frames = [wire.encode_route("g", b"R", b"S%d" % i, b"x" * 20) for i in range(4)]
    scanner = NativeScanner(MAX_FRAME, relay=True)
    data = b"".join(frames) * 10
    items = list(scanner.scan(data))
    assert [(i[0], i[3], i[4]) for i in items] == [
        (RUN, 1, ("g", b"R", b"S%d" % (k % 4))) for k in range(40)]
    assert len(scanner._routes.entries) == 4


def test_a_cached_header_with_a_bad_payload_is_malformed() -> None:
    good = wire.encode_route("g", None, b"S", b"abc")
    bad = _framed(good[4:-5] + b"\xa3abc")  # the same header, the payload a string
    scanner = NativeScanner(MAX_FRAME, relay=True)
    assert [i[0] for i in scanner.scan(good)] == [RUN]  # the header is now cached
    items = list(scanner.scan(good + bad))
    assert [i[:4] for i in items] == [(RUN, 0, len(good), 1),
                                      (MALFORMED, len(good), len(good) + len(bad), 0)]
    err = items[1][4]
    assert isinstance(err, ProtocolError) and "payload must be binary" in str(err)


@pytest.mark.parametrize("cut", [b"\xc4", b"\xc5\x00", b"\xc6\x00\x00"])
def test_a_payload_header_cut_by_the_end_of_the_chunk_is_malformed(cut: bytes) -> None:
    """A run's next frame ending inside its payload's bin header, at the very end of the
    received bytes, is refused as malformed (before: IndexError / struct.error escaped the
    hot loop and the connection was closed as an internal error)."""
    good = wire.encode_route("g", b"R", b"S", b"xy")
    bad = _framed(good[4:-4] + cut)
    items = list(NativeScanner(MAX_FRAME, relay=True).scan(good + bad))
    assert [i[0] for i in items] == [RUN, MALFORMED]
    assert items[0][3] == 1


def test_max_frame_applies_inside_a_run() -> None:
    """A frame with the run's header but above max_frame ends the run: TOO_LARGE (before, a
    run's later frames were not checked against max_frame)."""
    small = wire.encode_route("g", b"R", b"S", b"x" * 10)
    big = wire.encode_route("g", b"R", b"S", b"x" * 200)
    scanner = NativeScanner(100, relay=True)
    items = list(scanner.scan(small * 20 + big))
    assert [i[0] for i in items] == [RUN] * len(items[:-1]) + [TOO_LARGE]
    assert sum(i[3] for i in items[:-1]) == 20
    assert items[-1][1:4] == (20 * len(small), 20 * len(small) + len(big), len(big) - 4)


def test_runs_longer_than_max_frame_cover_every_frame() -> None:
    """With a max_frame below the chunk's size, runs are cut every max_frame bytes or so (each
    frame then checked against it) and go on: every frame is still relayed, in order."""
    frames = [wire.encode_route("g", b"R", b"S", b"x" * (i % 7)) for i in range(200)]
    data = b"".join(frames)
    items = list(NativeScanner(100, relay=True).scan(data))
    assert {i[0] for i in items} == {RUN}
    assert [f for i in items for f in _frames(data, i[1], i[2])] == frames
    assert sum(i[3] for i in items) == 200
    assert len(items) < len(frames) / 2  # runs, not single frames


def test_settings_change_after_a_control_frame() -> None:
    """The scanner stops after each control frame: a HELLO handled there can raise max_frame
    and turn the relay on for the very next frame of the same chunk."""
    hello = wire.encode(wire.Hello((1,), "t"))
    route = wire.encode_route("g", None, b"S", b"x" * 200)
    scanner = NativeScanner(64)
    items = scanner.scan(hello + route + route)
    assert next(items) == (CONTROL, 0, len(hello), 1, None)
    scanner.max_frame, scanner.relay = 1000, True
    assert next(items) == (RUN, len(hello), len(hello) + 2 * len(route), 2, ("g", None, b"S"))
    assert next(items, None) is None
    # Without the relay a ROUTE is a control frame like any other, and max_frame holds.
    before = NativeScanner(64)
    assert [i[0] for i in before.scan(hello + route)] == [CONTROL, TOO_LARGE]
    assert [i[0] for i in NativeScanner(1000).scan(route)] == [CONTROL]


def test_invalid_route_headers_are_malformed() -> None:
    for frame, message in [
        (wire.encode_route("g", None, b"S" * 256, b""), "255 bytes"),
        (_framed(ROUTE + b"\xa2\xff\xfe\xc0\xc4\x01S\xc4\x00"), "not UTF-8"),
        (_framed(ROUTE + b"\xa0\xc0\xc4\x01S\xc4\x00"), "1 to 1024 bytes"),
    ]:
        items = list(NativeScanner(MAX_FRAME, relay=True).scan(frame))
        assert [i[0] for i in items] == [MALFORMED]
        assert message in str(items[0][4])


# --------------------------------------------------------------------------- shared pieces


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([b"aaaa", b"aaab", b"baaa"]), st.integers(1, 40)),
                min_size=1, max_size=8),
       st.integers(0, 4), st.binary(max_size=3))
def test_same_frames_matches_a_frame_by_frame_count(runs: list[tuple[bytes, int]], plen: int,
                                                    tail: bytes) -> None:
    """Runs shorter and longer than the first round, and chunks ending with a cut frame."""
    frames = [f for f, n in runs for _ in range(n)]
    data = b"".join(frames) + tail
    k = 1
    while k < len(frames) and frames[k][:plen] == frames[0][:plen]:
        k += 1
    assert same_frames(data, 0, 4, plen, len(data)) == k


def test_header_cache_is_bounded() -> None:
    cache: HeaderCache[int] = HeaderCache(max_entries=8, max_lengths=3)
    for i in range(20):
        header = b"h" * (1 + i % 5) + bytes([i])
        cache.add(header, i)
        assert cache.find(header + b"payload", 0) == i
        assert len(cache.entries) <= 8 and len(cache.lengths) <= 3
    assert cache.find(b"nothing known", 0) is None
