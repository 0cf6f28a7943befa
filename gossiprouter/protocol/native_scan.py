"""The native protocol's zero-copy scanner: a received chunk cut into runs and control frames.

The router relays ROUTE frames as the exact bytes it received, so its hot loop never decodes
them; what it needs from a chunk is where each frame starts and ends, which consecutive frames
share a header (and so one routing decision), and the header itself. :class:`NativeScanner`
says exactly that, as offsets into the chunk, and nothing else: it holds no routing table, no
session, no I/O. The session (``gossiprouter.sessions.native``) decides what happens to each
item; every frame that is not relayed byte for byte goes, whole, to the validating decoder
(:func:`gossiprouter.protocol.native_frames.frame_from_body`).

An item is a tuple ``(kind, start, end, count, head)``; for the first four kinds
``data[start:end]`` is whole frames, length prefixes included:

* ``RUN``: ``count`` ROUTE frames with byte-identical headers; ``head`` is their
  :data:`RouteHeader` ``(group, dest, sender)``, checked as the decoder would (UTF-8 group of
  1 to 1024 bytes, addresses of at most 255).
* ``PUBLICATIONS``: ``count`` PUBLISH frames of one size with the same header (group, sender,
  topic, flags, payload length); ``head`` is the first frame decoded (:class:`Publish`).
* ``CONTROL``: one frame for the validating decoder. The scan stops after it until the caller
  asks for the next item, so a HELLO can change :attr:`NativeScanner.max_frame` and
  :attr:`NativeScanner.relay` before the next frame is read.
* ``MALFORMED``: a ROUTE or PUBLISH that does not parse; ``head`` is the
  :class:`ProtocolError`. Last item.
* ``TOO_LARGE``: a length prefix above ``max_frame``; ``count`` is that length. Last item.
* ``PARTIAL``: the chunk ends inside a frame that starts at ``start``; ``count`` is how many
  bytes that frame needs (its length prefix included; 4 while the prefix itself is cut). Last.

Items come one at a time from a generator: the caller may stop anywhere (a closed connection,
a spent control budget) and scan the rest later from the end of the last item it handled.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Final, Literal

from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.native_frames import (
    MAX_ADDR,
    MAX_GROUP,
    PUBLISH_START,
    ROUTE_START,
    Publish,
    frame_from_body,
)
from gossiprouter.protocol.scan import HeaderCache, same_frames

__all__ = [
    "CONTROL",
    "MALFORMED",
    "PARTIAL",
    "PUBLICATIONS",
    "RUN",
    "TOO_LARGE",
    "Item",
    "NativeScanner",
    "RouteHeader",
    "route_header",
]

RUN: Final = 0
PUBLICATIONS: Final = 1
CONTROL: Final = 2
MALFORMED: Final = 3
TOO_LARGE: Final = 4
PARTIAL: Final = 5

RouteHeader = tuple[str, bytes | None, bytes]  # group, dest (None: the whole group), sender

Item = (
    tuple[Literal[0], int, int, int, RouteHeader]
    | tuple[Literal[1], int, int, int, Publish]
    | tuple[Literal[2], int, int, int, None]
    | tuple[Literal[3], int, int, int, ProtocolError]
    | tuple[Literal[4], int, int, int, None]
    | tuple[Literal[5], int, int, int, None]
)

# Distinct ROUTE headers and header lengths remembered per connection (see HeaderCache).
ROUTE_CACHE_MAX = 4096
ROUTE_LENGTHS_MAX = 16

_LEN = struct.Struct(">I")
_ROUTE0, _ROUTE1 = ROUTE_START
_PUB0, _PUB1 = PUBLISH_START
# msgpack's bin 8 / 16 / 32 markers: the only payload encodings a relayed frame may use.
_BIN8, _BIN16, _BIN32 = 0xC4, 0xC5, 0xC6
_BINS = (_BIN8, _BIN16, _BIN32)


class NativeScanner:
    """Cuts received native frames (after the preamble) into :data:`Item`\\ s; one per connection.

    Parsing state only: the ROUTE header cache, and two settings the connection's state
    decides, read again after every ``CONTROL`` item: :attr:`max_frame` (the largest frame
    accepted) and :attr:`relay` (whether ROUTE and PUBLISH frames are relayed on the fast path;
    until then, before HELLO, they are control frames like any other).
    """

    __slots__ = ("_routes", "max_frame", "relay")

    def __init__(self, max_frame: int, relay: bool = False) -> None:
        self.max_frame = max_frame
        self.relay = relay
        # ROUTE header bytes -> (those bytes, their parsed and checked header)
        self._routes: HeaderCache[tuple[bytes, RouteHeader]] = HeaderCache(
            ROUTE_CACHE_MAX, ROUTE_LENGTHS_MAX)

    def header(self, data: bytes, body: int) -> bytes | None:
        """The exact bytes of the remembered ROUTE header that the frame body at ``body``
        starts with (a RUN's frames were all found or learned by it), or None."""
        hit = self._routes.find(data, body)
        return None if hit is None else hit[0]

    def scan(self, data: bytes, pos: int = 0) -> Iterator[Item]:
        """The items of ``data[pos:]``, in order (see the module docstring).

        Consecutive ROUTE frames whose headers are byte-identical form a run: the first frame's
        header is parsed and checked (or found in the cache by its exact bytes), each following
        frame is compared with those header bytes (one C-level ``startswith``) and its payload
        length checked; frames of the same size are counted column-wise (:func:`same_frames`).
        """
        size = len(data)
        max_frame = self.max_frame
        relay = self.relay
        unpack = _LEN.unpack_from
        find = self._routes.find
        # The current run: its header bytes ("" = none), where its frames' payloads start
        # (from the length prefix on), where its frames must end, its parsed header, where it
        # starts, how many frames. Ending within max_frame + 4 bytes of the run's start keeps
        # every frame within max_frame without a check per frame; a longer run (only with a
        # max_frame below the chunk's size) is cut there and goes on as a new run.
        run_hdr = b""
        hl = lim = 0
        route: RouteHeader = ("", None, b"")
        run_start = run_n = 0
        while size - pos >= 4:
            n = unpack(data, pos)[0]
            end = pos + 4 + n
            if run_hdr and end <= lim and data.startswith(run_hdr, pos + 4, end):
                # Same header as the run: the frame is valid if its payload is one bin value
                # ending with the frame. (A frame too short for its bin header cannot pass the
                # length check, and one cut by the end of the chunk raises.)
                p = pos + hl
                try:
                    m = data[p]
                    if m == _BIN8:
                        plen = p + 2
                        ok = plen + data[p + 1] == end
                    elif m == _BIN16:
                        plen = p + 3
                        ok = plen + ((data[p + 1] << 8) | data[p + 2]) == end
                    elif m == _BIN32:
                        plen = p + 5
                        ok = plen + unpack(data, p + 1)[0] == end
                    else:
                        ok = False
                except (IndexError, struct.error):
                    ok = False
                if ok:
                    # The next frame starts with the same prefix (length, header, payload
                    # length): count the bulk of such frames at C speed.
                    if data[end : end - pos + plen] == data[pos:plen]:
                        k = same_frames(data, pos, end - pos, plen - pos, size)
                        run_n += k
                        pos += k * (end - pos)
                    else:
                        run_n += 1
                        pos = end
                    continue
            if run_n:
                yield (RUN, run_start, pos, run_n, route)
                run_n = 0
                run_hdr = b""
            if n > max_frame:
                yield (TOO_LARGE, pos, end, n, None)
                return
            if end > size:
                break
            body = pos + 4
            if relay and n > 2 and data[body] == _ROUTE0 and data[body + 1] == _ROUTE1:
                lim = pos + 4 + max_frame
                if lim > size:
                    lim = size
                # A remembered header starts a run with no frame yet: the check above then
                # takes this frame too. If it fails (run_hdr still set, run_n 0), the frame is
                # parsed in full below for a precise error.
                hit = None if run_hdr else find(data, body)
                if hit is not None:
                    run_hdr, route = hit
                    hl = 4 + len(run_hdr)
                    run_start = pos
                    continue
                try:
                    run_hdr, route = self._learn(data, body, end)
                except ProtocolError as e:
                    yield (MALFORMED, pos, end, 0, e)
                    return
                hl = 4 + len(run_hdr)
                run_start, run_n = pos, 1
            elif relay and n > 2 and data[body] == _PUB0 and data[body + 1] == _PUB1:
                try:
                    f = frame_from_body(data[body:end])
                except ProtocolError as e:
                    yield (MALFORMED, pos, end, 0, e)
                    return
                assert isinstance(f, Publish)
                k = _publish_run(data, pos, end, size, len(f.payload))
                end = pos + k * (end - pos)
                yield (PUBLICATIONS, pos, end, k, f)
            else:
                yield (CONTROL, pos, end, 1, None)
                max_frame = self.max_frame  # HELLO raises it
                relay = self.relay
            pos = end
        if run_n:
            yield (RUN, run_start, pos, run_n, route)
        if pos < size:
            yield (PARTIAL, pos, size, 4 + unpack(data, pos)[0] if size - pos >= 4 else 4, None)

    def _learn(self, data: bytes, body: int, end: int) -> tuple[bytes, RouteHeader]:
        """Parse and check the header of the ROUTE body ``data[body:end]`` and remember it."""
        group_b, dest, sender, hlen = route_header(data, body, end)
        hdr = data[body : body + hlen]
        try:
            group = group_b.decode()
        except UnicodeDecodeError:
            raise ProtocolError("group is not UTF-8") from None
        if not group or len(group_b) > MAX_GROUP:
            raise ProtocolError("group must be 1 to 1024 bytes of UTF-8")
        if len(sender) > MAX_ADDR or (dest is not None and len(dest) > MAX_ADDR):
            raise ProtocolError("address longer than 255 bytes")
        hit = (hdr, (group, dest, sender))
        self._routes.add(hdr, hit)
        return hit


def _publish_run(data: bytes, pos: int, end: int, size: int, plen: int) -> int:
    """How many PUBLISH frames of the size of ``data[pos:end]`` (payload ``plen`` bytes), from
    ``pos`` on, share its prefix: length, header, payload length (at least 1)."""
    step = end - pos
    prefix = step - plen  # length prefix, header and the payload's bin header
    marker = _BIN8 if plen < 0x100 else _BIN16 if plen < 0x10000 else _BIN32
    bin_hdr = 2 if plen < 0x100 else 3 if plen < 0x10000 else 5
    # Only a minimally encoded payload length makes the prefix a fixed-size header.
    if end + step <= size and data[pos + prefix - bin_hdr] == marker:
        return same_frames(data, pos, step, prefix, size)
    return 1


# --------------------------------------------------------------------------- ROUTE header


def _read_str_or_bin(b: bytes | bytearray | memoryview, i: int, end: int) -> tuple[int, int]:
    """Return (start, stop) of a msgpack str or bin value at ``i``; -1 start for nil."""
    t = b[i]
    if 0xA0 <= t <= 0xBF:
        start, ln = i + 1, t & 0x1F
    elif t == _BIN8 or t == 0xD9:
        start, ln = i + 2, b[i + 1]
    elif t == _BIN16 or t == 0xDA:
        start, ln = i + 3, (b[i + 1] << 8) | b[i + 2]
    elif t == _BIN32 or t == 0xDB:
        start = i + 5
        ln = (b[i + 1] << 24) | (b[i + 2] << 16) | (b[i + 3] << 8) | b[i + 4]
    elif t == 0xC0:
        return -1, i + 1
    else:
        raise ProtocolError("bad field in ROUTE header")
    stop = start + ln
    if stop > end:
        raise ProtocolError("truncated ROUTE header")
    return start, stop


def route_header(
    buf: bytes | bytearray, start: int, end: int
) -> tuple[bytes, bytes | None, bytes, int]:
    """Parse the header of the ROUTE body ``buf[start:end]`` without copying the payload.

    Returns ``(group_utf8, dest, sender, header_len)``; ``header_len`` is the length of
    everything before the payload (so the header bytes can serve as a cache key). Raises
    :class:`ProtocolError` if the body is not a ROUTE as :func:`~gossiprouter.protocol.native.
    encode_route` writes it (minimal array header, bin addresses and payload).
    """
    try:
        if buf[start] != _ROUTE0 or buf[start + 1] != _ROUTE1:
            raise ProtocolError("not a ROUTE")
        i = start + 2
        if buf[i] not in (0xD9, 0xDA) and not 0xA0 <= buf[i] <= 0xBF:
            raise ProtocolError("group must be a string")
        gs, ge = _read_str_or_bin(buf, i, end)
        ds, de = _read_str_or_bin(buf, ge, end)
        if ds >= 0 and buf[ge] not in _BINS:
            raise ProtocolError("dest must be binary")
        if buf[de] not in _BINS:
            raise ProtocolError("sender must be binary")
        ss, se = _read_str_or_bin(buf, de, end)
        if buf[se] not in _BINS:
            raise ProtocolError("payload must be binary")
        _, pe = _read_str_or_bin(buf, se, end)
        if pe != end:
            raise ProtocolError("trailing bytes after ROUTE payload")
    except IndexError:
        raise ProtocolError("truncated ROUTE") from None
    group = bytes(buf[gs:ge])
    dest = None if ds < 0 else bytes(buf[ds:de])
    return group, dest, bytes(buf[ss:se]), se - start
