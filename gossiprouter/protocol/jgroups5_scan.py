"""The router's zero-copy reader of a JGroups 3.6.5+/5.x connection: MESSAGE runs and the rest.

Every 5.x frame is length-prefixed (see :mod:`gossiprouter.protocol.jgroups5`, the codec), so
:class:`Scanner` cuts a chunk into frames without copying a payload, finds consecutive MESSAGE
frames with one header, and leaves every other frame to the codec's validating
:class:`~gossiprouter.protocol.jgroups5.Decoder`. The items it reports and its base are in
:mod:`gossiprouter.protocol.jgroups_scan`; the session (``gossiprouter.sessions.jgroups5``)
builds its hot loop on it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from gossiprouter.protocol import jgroups_scan
from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.jgroups5 import CLOSE_MARKER, MESSAGE
from gossiprouter.protocol.jgroups_address import V5, read_address
from gossiprouter.protocol.jgroups_reader import NeedMore, Reader
from gossiprouter.protocol.jgroups_scan import CLOSED, CONTROL, ERROR, OVERSIZED, PARTIAL, U32, Item
from gossiprouter.protocol.scan import same_frames

__all__ = ["Route", "Scanner"]

#: A MESSAGE header as the scanner parsed it: (header length, ``prefix`` + group, destination key
#: or None for the whole group, (``prefix`` + group, sender key): the registration the router's
#: sender check looks for, the header's exact bytes: the cache key, by which the compiled fast
#: path learns routes).
Route = tuple[int, str, bytes | None, tuple[str, bytes], bytes]

_CLOSE = int.from_bytes(CLOSE_MARKER, "big")  # the length -5 read as unsigned
_NEGATIVE = 0x80000000


class Scanner(jgroups_scan.ScannerBase[Route]):
    """The router's zero-copy reader of a 5.x connection: runs of MESSAGEs, and the rest.

    :meth:`scan` cuts a received chunk into :data:`~gossiprouter.protocol.jgroups_scan.Item`
    tuples without copying a payload: consecutive MESSAGE frames with byte-identical headers
    (type, group, destination, sender) and a payload length that ends the frame exactly form one
    ``RUN``, forwarded as one slice, length prefixes included; anything else is a ``CONTROL``
    frame for the validating :class:`Decoder`. A header is parsed once, when first seen, and then
    found in the cache by its exact bytes, whatever address classes it holds (UUID,
    ExtendedUUID, SiteUUID...). Pure: it knows no routing table, session or I/O; what to do with
    a run (the sender check, routing), an oversized or partial frame, is the caller's policy.
    """

    def scan(self, data: bytes, on_run: Callable[[Route, bytes, int], bool]) -> Iterator[Item]:
        """The items of ``data``, a chunk that starts on a frame boundary, in order; its runs
        of MESSAGEs go to ``on_run`` (see ``jgroups_scan``).
        """
        size = len(data)
        routes = self.entries
        lengths = self.lengths
        max_frame = self.max_frame
        u32 = U32
        pos = 0
        # The current run: its header bytes (after the length prefix), their length, the
        # parsed header, where the run starts and how many frames it has.
        run_hdr = b""
        hlen = 0
        run: Route = (0, "", None, ("", b""), b"")
        run_start = run_n = 0
        while size - pos >= 4:
            n = u32(data, pos)[0]
            end = pos + 4 + n
            if run_n and n <= max_frame and end <= size and data.startswith(run_hdr, pos + 4):
                q = pos + 4 + hlen
                if q + 4 <= end and q + 4 + u32(data, q)[0] == end:
                    if data[end : end + 4] == data[pos : pos + 4]:
                        # The next frame has the same length: count the bulk at C speed.
                        k = same_frames(data, pos, end - pos, 8 + hlen, size)
                        run_n += k
                        pos += k * (end - pos)
                    else:
                        run_n += 1
                        pos = end
                    continue
            if run_n:
                if on_run(run, data[run_start:pos], run_n):
                    return
                run_n = 0
            if n >= _NEGATIVE:
                if n == _CLOSE:
                    yield CLOSED, pos, pos + 4, 0, None
                else:
                    err = ProtocolError(f"negative frame length {n - (1 << 32)}")
                    yield ERROR, pos, pos + 4, 0, err
                return
            if n > max_frame:
                yield OVERSIZED, pos, end, n, None
                if end > size:
                    return
                pos = end
                continue
            if end > size:
                break
            body = pos + 4
            if n and data[body] == MESSAGE:
                hit: Route | None = None
                for length in lengths:
                    hit = routes.get(data[body : body + length])
                    if hit is not None:
                        break
                if hit is None:
                    hit = self._learn(data, body, end)
                if hit is not None:
                    q = body + hit[0]
                    if q + 4 <= end and q + 4 + u32(data, q)[0] == end:
                        run = hit
                        hlen = hit[0]
                        run_hdr = data[body:q]
                        run_start = pos
                        run_n = 1
                        pos = end
                        continue
            yield CONTROL, pos, end, 0, None
            max_frame = self.max_frame  # raised by the first REGISTER
            pos = end
        if run_n and on_run(run, data[run_start:pos], run_n):
            return
        if pos < size:
            # The whole frame once its length is known; else just the length prefix.
            need = 4 + u32(data, pos)[0] if size - pos >= 4 else 4
            yield PARTIAL, pos, pos + need, 1, None

    def _learn(self, data: bytes, body: int, end: int) -> Route | None:
        """Parse and cache the header of the MESSAGE frame ``data[body:end]``; None when it does
        not parse or has no group or sender (the full decoder then deals with the frame)."""
        r = Reader(data, body, end)
        try:
            r.u8()  # the type, 4
            group = r.string()
            dest = read_address(r, V5)
            sender = read_address(r, V5)
        except (NeedMore, ProtocolError):
            return None
        if group is None or sender is None:
            return None
        full = self.prefix + group
        key = data[body : r.pos]
        route: Route = (r.pos - body, full, None if dest is None else dest.key,
                        (full, sender.key), key)
        self.add(key, route)
        return route
