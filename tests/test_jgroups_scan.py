"""The JGroups scanners (``jgroups5_scan.Scanner``, ``jgroups2_scan.Scanner``) vs naive references.

The scanners cut received chunks into runs of same-header MESSAGEs (handed to a callback) and
other items, with header caches and bulk counting of same-size frames. These property tests
feed random mixes of headers, sizes, control frames, bad and oversized frames, split at random
points, and check that the items match, frame by frame and byte for byte, what a naive
reference finds by decoding the whole stream one frame at a time with the codec's full
decoder; and that runs are maximal (two runs in a row of one chunk never share a header). The
end-to-end tests check the sessions on top: every receiver gets exactly the bytes a naive
router would have queued.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gossiprouter.core.config import Config
from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups2_scan as j2scan
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol import jgroups5_scan as j5scan
from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.jgroups_address import V2, V5, JAddress
from gossiprouter.protocol.jgroups_scan import (
    CACHE_MAX,
    CLOSED,
    CONTROL,
    ERROR,
    HELD,
    LENGTHS_MAX,
    OVERSIZED,
    PARTIAL,
)
from gossiprouter.sessions.base import Hub
from gossiprouter.sessions.jgroups2 import JGroups2Session
from gossiprouter.sessions.jgroups5 import JGroups5Session

MAX = 300  # the scanners' max_frame in the property tests: some frames are above it


def _a(i: int, version: int) -> JAddress:
    return JAddress.from_uuid(0x10 + i, 0x20 + i, version=version)


def _ext5(i: int) -> JAddress:
    """A 5.x address of another class than UUID (a longer header, another cached length)."""
    return JAddress.from_ip("10.0.0.1", 7800 + i, version=V5)


def _cuts(draw: st.DataObject, size: int) -> list[int]:
    cuts = sorted(draw.draw(st.lists(st.integers(0, size), max_size=8)))
    return [*cuts, size]


# --------------------------------------------------------------------------- 5.x

frames5 = st.one_of(
    # MESSAGEs in a row with one header: group, destination (None: the group), sender, and
    # their payload sizes. Sizes near MAX cross it; equal sizes in a row take the bulk
    # (same_frames) path, a different size after them must end it.
    st.tuples(st.just("msg"), st.sampled_from(["g", "h"]),
              st.sampled_from([None, 1, 2, 9]), st.sampled_from([0, 1, 7]),
              st.lists(st.sampled_from([0, 1, 5, 5, 5, 40, 240, 290, 400]), min_size=1,
                       max_size=5)),
    st.tuples(st.just("heartbeat")),
    st.tuples(st.just("register"), st.integers(0, 3)),
    st.tuples(st.just("empty")),                 # a zero-length frame: Malformed
    st.tuples(st.just("short_payload")),         # a MESSAGE whose payload length lies
    st.tuples(st.just("no_sender")),             # a MESSAGE with a null sender
)


def _frame5(spec: tuple[Any, ...], i: int) -> bytes:
    kind = spec[0]
    if kind == "msg":
        _, group, dest, sender, sizes = spec
        d = None if dest is None else _a(dest, V5)
        s = _ext5(sender) if sender == 7 else _a(sender, V5)
        return b"".join(j5.message(group, d, s, bytes([(i + k) % 251]) * size)
                        for k, size in enumerate(sizes))
    if kind == "heartbeat":
        return j5.heartbeat()
    if kind == "register":
        return j5.register("g", _a(spec[1], V5), "n", None)
    if kind == "empty":
        return b"\x00\x00\x00\x00"
    if kind == "no_sender":
        return j5.message("g", _a(1, V5), None, b"xy")
    good = j5.message("g", _a(1, V5), _a(0, V5), b"abcdef")
    body = good[4:-10] + struct.pack(">I", 99) + b"abcdef"  # declares more than it holds
    return struct.pack(">I", len(body)) + body


def _reference5(stream: bytes) -> list[tuple[Any, ...]]:
    """Frame by frame, with the full decoder: what each frame is to the router."""
    out: list[tuple[Any, ...]] = []
    pos = 0
    while pos < len(stream):
        n = int.from_bytes(stream[pos : pos + 4], "big")
        frame = stream[pos : pos + 4 + n]
        if n > MAX:
            out.append(("oversized", n))
        else:
            dec = j5.Decoder(MAX)
            dec.feed(frame)
            ev = dec.next_event()
            if isinstance(ev, j5.Message) and ev.group is not None and ev.sender is not None:
                g = "jgroups5:" + ev.group
                dest = None if ev.dest is None else ev.dest.key
                out.append(("msg", (g, dest, (g, ev.sender.key)), frame))
            else:
                out.append(("control", frame))
        pos += 4 + n
    return out


RUN = -1  # what _drive reports for a run: (RUN, head, frames, count)


def _items_while(scanner: j5scan.Scanner | j2scan.Scanner, data: bytes
                 ) -> Iterator[tuple[Any, ...]]:
    """Everything the scanner reports for ``data``, runs (``(RUN, head, frames, count)``)
    included, in stream order, one at a time: the caller acts on each before the next is
    read."""
    runs: list[tuple[Any, ...]] = []

    def on_run(head: Any, frames: bytes, count: int) -> bool:
        runs.append((RUN, head, frames, count))
        return False

    for item in scanner.scan(data, on_run):
        yield from runs
        runs.clear()
        yield item
    yield from runs


def _items(scanner: j5scan.Scanner | j2scan.Scanner, data: bytes) -> list[tuple[Any, ...]]:
    """Everything the scanner reports for ``data``, runs included, in stream order."""
    return list(_items_while(scanner, data))


def _drive(scanner: j5scan.Scanner | j2scan.Scanner, stream: bytes, cuts: list[int]
           ) -> Iterator[tuple[bytes, tuple[Any, ...]]]:
    """Feed ``stream`` in the pieces ``cuts`` makes, as the sessions do: the start of a frame
    the chunk does not complete is kept for the next one, the rest of an oversized frame is
    skipped. Yields (the data scanned, item or run); checks that runs are maximal."""
    rest = b""
    skip = 0
    prev = 0
    for c in cuts:
        chunk = stream[prev:c]
        prev = c
        if skip:
            k = min(skip, len(chunk))
            skip -= k
            chunk = chunk[k:]
        data = rest + chunk
        rest = b""
        if not data:
            continue
        last: Any = None  # the header of the run just before, in this chunk
        for item in _items(scanner, data):
            yield data, item
            kind = item[0]
            # Runs are maximal: two in a row never have the same header (the same header bytes
            # are one cached header).
            assert kind != RUN or item[1] is not last
            last = item[1] if kind == RUN else None
            if kind == PARTIAL:
                rest = data[item[1] :]
            elif kind == OVERSIZED and item[2] > len(data):
                skip = item[2] - len(data)
    assert not rest and not skip


def _check(scanner: j5scan.Scanner | j2scan.Scanner, stream: bytes, cuts: list[int],
           expect: list[tuple[Any, ...]], skip: int) -> None:
    """What the scanner reports for ``stream`` cut at ``cuts``, one entry per frame as the
    references write them, is ``expect``. Every frame of a run starts with the run's header
    bytes, found after the first ``skip`` bytes of a frame (5.x: its length prefix)."""
    got: list[tuple[Any, ...]] = []
    for data, item in _drive(scanner, stream, cuts):
        kind = item[0]
        if kind == RUN:
            _, head, frames, count = item
            hdr = frames[skip : skip + head[0]] if skip else head[3]
            pos = 0
            for _ in range(count):  # split the run naively
                assert frames.startswith(hdr, pos + skip)
                q = pos + skip + len(hdr)
                end = q + 4 + int.from_bytes(frames[q : q + 4], "big")
                got.append(("msg", head[1:4], frames[pos:end]))
                pos = end
            assert pos == len(frames)
        elif kind == CONTROL:
            head = item[4]  # 2.12: the decoded object; 5.x: the frame
            got.append(("control", data[item[1] : item[2]] if head is None else head))
        elif kind == OVERSIZED:
            got.append(("oversized", item[3]))
        else:
            assert kind in (PARTIAL, HELD)
    assert got == expect


def test_jgroups5_scanner_close_marker_and_negative_lengths() -> None:
    msg = j5.message("g", None, _a(0, V5), b"x")
    items = _items(j5scan.Scanner("p:", MAX), msg + j5.CLOSE_MARKER + msg)
    assert [i[0] for i in items] == [RUN, CLOSED]  # nothing after the marker
    assert items[1][1:3] == (len(msg), len(msg) + 4)
    items = _items(j5scan.Scanner("p:", MAX), msg + b"\xff\xff\xff\xfe" + msg)
    assert [i[0] for i in items] == [RUN, ERROR]
    err = items[1][4]
    assert isinstance(err, ProtocolError) and str(err) == "negative frame length -2"


def test_jgroups5_scanner_reads_max_frame_again_after_a_control_frame() -> None:
    """The session raises max_frame while it handles the first REGISTER: the frame after it
    is measured against the new limit."""
    big = j5.message("g", None, _a(0, V5), bytes(500))
    scanner = j5scan.Scanner("p:", MAX)
    kinds = []
    for item in _items_while(scanner, j5.register("g", _a(0, V5), "n", None) + big):
        kinds.append(item[0])
        if item[0] == CONTROL:
            scanner.registered(1000)
    assert kinds == [CONTROL, RUN]
    assert [i[0] for i in _items(j5scan.Scanner("p:", MAX), big)] == [OVERSIZED]


def test_scanners_stop_when_the_run_callback_says_so() -> None:
    """The session's connection closed while routing a run: nothing after it is read."""
    for scanner, msg, other in (
            (j5scan.Scanner("p:", MAX), j5.message("g", None, _a(0, V5), b"x"), j5.heartbeat()),
            (j2scan.Scanner("p:", MAX), j2.message("g", None, b"x"), j2.ping())):
        seen: list[int] = []

        def stop(head: Any, frames: bytes, count: int, seen: list[int] = seen) -> bool:
            seen.append(count)
            return True

        assert list(scanner.scan(msg * 3 + other + msg, stop)) == []
        assert seen == [3]


def test_jgroups5_header_cache_is_bounded() -> None:
    scanner = j5scan.Scanner("p:", MAX)
    for i in range(CACHE_MAX + 5):
        _items(scanner, j5.message("g", _a(i, V5), _a(0, V5), b"x"))
    assert 0 < len(scanner.entries) <= CACHE_MAX
    for i in range(LENGTHS_MAX + 3):  # group names of new lengths: new header lengths
        _items(scanner, j5.message("g" * (i + 1), None, _a(0, V5), b"x"))
    assert len(scanner.lengths) == LENGTHS_MAX


# --------------------------------------------------------------------------- 2.12

frames2 = st.one_of(
    st.tuples(st.just("msg"), st.sampled_from(["g", "h"]), st.sampled_from([None, 1, 2, 9]),
              st.lists(st.sampled_from([1, 5, 5, 5, 40, 200, 290, 400]), min_size=1,
                       max_size=5)),
    st.tuples(st.just("ping")),
    st.tuples(st.just("gossip_get")),
    st.tuples(st.just("empty_msg")),         # an empty buffer: the decoder's (dropped)
    st.tuples(st.just("null_buffer_msg")),   # a null buffer: the decoder's too
)


def _frame2(spec: tuple[Any, ...], i: int) -> bytes:
    kind = spec[0]
    if kind == "msg":
        _, group, dest, sizes = spec
        return b"".join(j2.message(group, None if dest is None else _a(dest, V2),
                                   bytes([(i + k) % 251]) * size)
                        for k, size in enumerate(sizes))
    if kind == "ping":
        return j2.ping()
    if kind == "gossip_get":
        return j2.gossip_get("g")
    if kind == "empty_msg":
        return j2.message("g", None, b"")
    return j2.message("g", None, b"")[:-5] + b"\x00"  # presence byte 0, no length


def _reference2(stream: bytes) -> list[tuple[Any, ...]]:
    """Object by object, with the full decoder."""
    out: list[tuple[Any, ...]] = []
    dec = j2.Decoder(1 << 20)
    dec.feed(stream)
    pos = 0
    while (ev := dec.next_event()) is not None:
        end = len(stream) - dec.buffered
        if isinstance(ev, j2.Message) and ev.group is not None and ev.payload:
            if end - pos > MAX:
                out.append(("oversized", end - pos))
            else:
                head = j2.message_to_client(ev.dest, b"")[:-4]  # the re-wrapped header
                out.append(("msg", ("jgroups2:" + ev.group,
                                    None if ev.dest is None else ev.dest.key, head),
                            j2.message_to_client(ev.dest, ev.payload)))
        else:
            out.append(("control", ev))
        pos = end
    assert pos == len(stream)
    return out


@pytest.mark.parametrize("version", [2, 5])
@settings(max_examples=300, deadline=None)
@given(st.data())
def test_scanner_matches_the_reference(version: int, draw: st.DataObject) -> None:
    if version == 5:
        specs = draw.draw(st.lists(frames5, min_size=1, max_size=40))
        stream = b"".join(_frame5(s, i) for i, s in enumerate(specs))
        _check(j5scan.Scanner("jgroups5:", MAX), stream, _cuts(draw, len(stream)),
               _reference5(stream), skip=4)
        return
    specs = draw.draw(st.lists(frames2, min_size=1, max_size=40))
    stream = b"".join(_frame2(s, i) for i, s in enumerate(specs))
    scanner = j2scan.Scanner("jgroups2:", MAX)
    scanner.registered(MAX)  # oversized messages are skipped, not refused
    _check(scanner, stream, _cuts(draw, len(stream)), _reference2(stream), skip=0)
    assert not scanner.holding


def test_jgroups2_scanner_refuses_an_oversized_message_before_registration() -> None:
    big = j2.message("g", None, bytes(MAX))
    items = _items(j2scan.Scanner("p:", MAX), big)
    assert [(i[0], i[4].code) for i in items] == [(ERROR, "frame_too_large")]
    scanner = j2scan.Scanner("p:", MAX)
    scanner.registered(MAX)
    assert [(i[0], i[3]) for i in _items(scanner, big)] == [(OVERSIZED, len(big))]


def test_jgroups2_scanner_holds_an_incomplete_object_across_chunks() -> None:
    get = j2.gossip_get("a-group-name")
    msg = j2.message("g", None, b"x")
    scanner = j2scan.Scanner("p:", MAX)
    items = _items(scanner, msg + get[:5])
    assert [i[0] for i in items] == [RUN, HELD]
    assert items[1][3] == 5 and scanner.holding
    items = _items(scanner, get[5:] + msg)
    assert [i[0] for i in items] == [CONTROL, RUN]
    assert items[0][4] == j2.GossipGet("a-group-name") and items[0][2] == len(get) - 5
    assert not scanner.holding


def test_jgroups2_scanner_partial_header_and_body() -> None:
    msg = j2.message("g", None, b"0123456789")
    scanner = j2scan.Scanner("p:", MAX)
    _items(scanner, msg)  # the header is known now
    # Cut in the payload: the whole message's length is known, it may be skipped (count 1).
    assert _items(scanner, msg[:-3]) == [(PARTIAL, 0, len(msg), 1, None)]
    # Cut in the payload length: only the bytes up to it are known (count 0).
    hlen = len(msg) - 14
    assert _items(scanner, msg[: hlen + 2]) == [(PARTIAL, 0, hlen + 4, 0, None)]


# --------------------------------------------------------------------------- end to end

@pytest.mark.parametrize("version", [2, 5])
@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([None, "R1", "R2", "S2", "X"]),   # destination
                          st.sampled_from(["S1", "S2", "U"]),               # sender
                          st.sampled_from(["g", "h"]),                      # group
                          st.sampled_from([1, 5, 5, 120]),                  # payload size
                          st.booleans(),                                    # a control after it
                          st.integers(1, 3)),                               # times in a row
                min_size=1, max_size=25), st.data())
def test_sessions_route_like_a_naive_router(
    version: int, specs: list[tuple[str | None, str, str, int, bool, int]], draw: st.DataObject
) -> None:
    """Every receiver gets exactly the bytes a frame-by-frame router would have queued, and
    the drop counters count every message a naive router drops."""
    hub = Hub(Config(port=0))
    v = V2 if version == 2 else V5
    ids = {"S1": 0, "S2": 1, "R1": 2, "R2": 3, "X": 8, "U": 9}
    cls = JGroups2Session if version == 2 else JGroups5Session
    sender, r1, r2 = cls(hub, "sender"), cls(hub, "r1"), cls(hub, "r2")
    for session, names in ((sender, ("S1", "S2")), (r1, ("R1",)), (r2, ("R2",))):
        for name in names:
            a = _a(ids[name], v)
            session.on_data(j2.connect("g", a, name, None) if version == 2
                            else j5.register("g", a, name, None), 0.0)
        session.outbox.take()
    stream = b""
    expect: dict[str, bytes] = {"sender": b"", "r1": b"", "r2": b""}
    not_member = unknown = 0
    flat = [s[:5] for s in specs for _ in range(s[5])]  # repeated in a row: runs form
    for i, (dest, snd, group, size, control) in enumerate(flat):
        d = None if dest is None else _a(ids[dest], v)
        payload = bytes([i % 251]) * size
        if version == 2:
            stream += j2.message(group, d, payload)
            out = j2.message_to_client(d, payload)
            member = group == "g"  # 2.12 has no sender: the connection's membership counts
        else:
            out = j5.message(group, d, _a(ids[snd], v), payload)
            stream += out
            member = group == "g" and snd != "U"
        if not member:
            not_member += 1
        elif dest is None:
            for k in expect:  # the sender's connection gets its own multicasts, as in JGroups
                expect[k] += out
        elif dest == "X":
            unknown += 1
        else:
            expect[{"S2": "sender", "R1": "r1", "R2": "r2"}[dest]] += out
        if control:
            if version == 2:
                stream += j2.ping()  # no answer
            else:
                stream += j5.heartbeat()
                expect["sender"] += j5.heartbeat()  # echoed
    cuts = _cuts(draw, len(stream))
    prev = 0
    for c in cuts:
        sender.on_data(stream[prev:c], 0.0)
        prev = c
    got = {s.peer: b"".join(s.outbox.take()) for s in (sender, r1, r2)}
    assert got == expect
    assert hub.counters.routed == len(flat) - not_member
    assert hub.counters.drops.get("not_member", 0) == not_member
    assert hub.counters.drops.get("unknown_destination", 0) == unknown
    assert not sender.outbox.closed
