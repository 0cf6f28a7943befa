"""The router's zero-copy reader of a JGroups 2.12 connection: runs of MESSAGEs, and the rest.

2.12 objects are not length-framed (see :mod:`gossiprouter.protocol.jgroups2`, the codec), so
:class:`Scanner` finds where a MESSAGE ends from its cached header and payload length, and hands
everything else to the codec's validating :class:`~gossiprouter.protocol.jgroups2.Decoder`,
which finds where it ends. The items it reports and its base are in
:mod:`gossiprouter.protocol.jgroups_scan`; the session (``gossiprouter.sessions.jgroups2``)
builds its hot loop on it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from gossiprouter.protocol import jgroups_scan
from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.jgroups2 import MESSAGE, Decoder, message_to_client
from gossiprouter.protocol.jgroups_address import V2, read_address, read_addresses
from gossiprouter.protocol.jgroups_reader import NeedMore, Reader
from gossiprouter.protocol.jgroups_scan import CONTROL, ERROR, HELD, OVERSIZED, PARTIAL, U32, Item
from gossiprouter.protocol.scan import same_frames

__all__ = ["Route", "Scanner"]

#: A MESSAGE header as the scanner parsed it: (header length, ``prefix`` + group, destination key
#: or None for the whole group, the re-wrapped message's first bytes up to and including the
#: buffer's presence byte: group null, as 2.12 does, the destination as received; the header's
#: exact bytes as received, the cache key (the compiled fast path learns routes by it).
Route = tuple[int, str, bytes | None, bytes, bytes]

# _learn's answer for an object that is not a MESSAGE with a group and a buffer, or does not
# parse: the full decoder handles it (or refuses it).
_DECODER = 0
# The decoder is handed the rest of a chunk in growing windows, so that a chunk of many small
# control objects is not copied once per object.
_FIRST_WINDOW = 256


class Scanner(jgroups_scan.ScannerBase[Route]):
    """The router's zero-copy reader of a 2.12 connection: runs of MESSAGEs, and the rest.

    :meth:`scan` cuts a received chunk into :data:`~gossiprouter.protocol.jgroups_scan.Item`
    tuples. A MESSAGE header (type, group, destination, logical name, member and physical lists,
    the buffer's presence byte) is parsed once, when first seen, and then found in the cache by
    its exact bytes; on a hit only the payload length is read. Consecutive MESSAGEs with
    byte-identical headers form one run, re-wrapped into one bytes object for the receivers.
    2.12 objects are not length-framed, so anything else goes through the validating
    :class:`Decoder` here, which finds where it ends: a ``CONTROL`` item carries the decoded
    event, an object the chunk does not complete stays in that decoder (``HELD``) until the next
    chunk, and a parse error (``ERROR``) leaves the stream unusable. Pure: no routing table,
    session or I/O.
    """

    def __init__(self, prefix: str, max_frame: int) -> None:
        super().__init__(prefix, max_frame)
        # Skip a MESSAGE above max_frame as it streams past (once the connection registered,
        # see registered()); before that, the decoder refuses it.
        self.skip_oversized = False
        # A decoder holding an object that is not complete yet.
        self._dec: Decoder | None = None

    def registered(self, max_frame: int) -> None:
        super().registered(max_frame)
        self.skip_oversized = True

    @property
    def holding(self) -> bool:
        """An incomplete object is held: the next chunk continues it (see ``HELD``)."""
        return self._dec is not None

    def reset(self) -> None:
        """Forget a held incomplete object (the connection is closing)."""
        self._dec = None

    def scan(self, data: bytes, on_run: Callable[[Route, bytes, int], bool]) -> Iterator[Item]:
        """The items of ``data``, in order, the rest of a held object first, if any; its runs
        of MESSAGEs go to ``on_run`` (see ``jgroups_scan``).
        """
        size = len(data)
        pos = 0
        dec = self._dec
        if dec is not None:
            dec.feed(data)
            try:
                ev = dec.next_event()
            except ProtocolError as e:
                self._dec = None
                yield ERROR, 0, size, 0, e
                return
            if ev is None:
                yield HELD, 0, size, dec.buffered, None
                return
            self._dec = None
            # The object ended inside ``data``: what the decoder still holds is the rest.
            pos = size - dec.buffered
            yield CONTROL, 0, pos, 0, ev
        routes = self.entries
        lengths = self.lengths
        max_frame = self.max_frame
        u32 = U32
        # The current run: its header bytes, their length, the parsed header, and the
        # (length + payload) part of each message.
        run_hdr = b""
        hlen = 0
        run: Route = (0, "", None, b"", b"")
        parts: list[bytes] = []
        while pos < size:
            if parts and data.startswith(run_hdr, pos):
                p = pos + hlen
                if p + 4 <= size:
                    n = u32(data, p)[0]
                    end = p + 4 + n
                    # n == 0 (the decoder's) and oversize (skipped or refused) end the run.
                    if n and end <= size and end - pos <= max_frame:
                        if data[end + hlen : end + hlen + 4] == data[p : p + 4]:
                            # The next one may have the same header and length: count the
                            # bulk at C speed.
                            step = end - pos
                            k = same_frames(data, pos, step, hlen + 4, size)
                            tail = step - hlen
                            parts += [data[a : a + tail] for a in range(p, p + k * step, step)]
                            pos += k * step
                        else:
                            parts.append(data[p:end])
                            pos = end
                        continue
            if parts:
                head = run[3]
                if on_run(run, head + head.join(parts) if len(parts) > 1 else head + parts[0],
                          len(parts)):
                    return
                parts = []
            if data[pos] == MESSAGE:
                hit: Route | int | None = None
                for length in lengths:
                    hit = routes.get(data[pos : pos + length])
                    if hit is not None:
                        break
                if hit is None:
                    hit = self._learn(data, pos, size, max_frame)
                if isinstance(hit, tuple):
                    p = pos + hit[0]
                    if p + 4 > size:
                        yield PARTIAL, pos, p + 4, 0, None
                        return
                    n = u32(data, p)[0]
                    end = p + 4 + n
                    if n and end - pos <= max_frame:
                        if end > size:
                            yield PARTIAL, pos, end, 1, None
                            return
                        run = hit
                        hlen = hit[0]
                        run_hdr = data[pos:p]
                        parts.append(data[p:end])
                        pos = end
                        continue
                    if n and self.skip_oversized:
                        # The buffer's length is known: the message streams past unbuffered
                        # and the stream stays in sync.
                        yield OVERSIZED, pos, end, end - pos, None
                        if end > size:
                            return
                        pos = end
                        continue
                elif hit:  # the header itself is incomplete: it needs ``hit`` bytes
                    yield PARTIAL, pos, pos + hit, 0, None
                    return
            dec = Decoder(max_frame)
            fed = pos
            window = _FIRST_WINDOW
            try:
                while True:
                    stop = min(size, fed + window)
                    dec.feed(data[fed:stop])
                    fed = stop
                    ev = dec.next_event()
                    if ev is not None:
                        break
                    if fed >= size:
                        self._dec = dec
                        yield HELD, pos, size, dec.buffered, None
                        return
                    window *= 4
            except ProtocolError as e:
                yield ERROR, pos, size, 0, e
                return
            end = fed - dec.buffered
            yield CONTROL, pos, end, 0, ev
            max_frame = self.max_frame  # raised by the first CONNECT
            pos = end
        if parts:
            head = run[3]
            on_run(run, head + head.join(parts) if len(parts) > 1 else head + parts[0],
                   len(parts))

    def _learn(self, data: bytes, pos: int, size: int, max_frame: int) -> Route | int:
        """Parse the header of the MESSAGE at ``pos`` and cache it.

        Returns the route; or the number of bytes the header needs when it is incomplete; or
        ``_DECODER`` when the object is not a MESSAGE with a group and a buffer, or does not
        parse (the full decoder then handles it, or refuses it).
        """
        r = Reader(data, pos, size, pos + max_frame)
        try:
            r.u8()  # the type, 0x0a
            group = r.string()
            dest = read_address(r, V2)
            r.string()  # logical_name: unused in a MESSAGE
            read_addresses(r, V2)  # mbrs: unused
            read_addresses(r, V2)  # physical_addrs: unused
            has_buffer = r.presence("byte buffer")
        except NeedMore as e:
            return e.needed - pos
        except ProtocolError:
            return _DECODER
        if group is None or not has_buffer:
            return _DECODER
        key = data[pos : r.pos]
        route: Route = (r.pos - pos, self.prefix + group, None if dest is None else dest.key,
                        message_to_client(dest, b"")[:-4], key)
        self.add(key, route)
        return route
