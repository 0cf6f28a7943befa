"""Java ``DataInput``/``DataOutput`` as the JGroups codecs (2.12 and 3.6.5+/5.x) use it, sans-IO.

JGroups writes everything with ``java.io.DataOutput``: big-endian integers, Java *modified*
UTF-8 strings (``writeUTF``), and its own address encoding (``Util.writeAddress``, in
:mod:`gossiprouter.protocol.jgroups_address`). This module holds:

* :func:`encode_utf` / :func:`decode_utf` / :func:`write_string`: ``writeUTF`` and
  ``Bits.writeString`` (``00`` for null, ``01`` + UTF otherwise).
* :class:`Reader`: a cursor over ``bytes``/``bytearray``/``memoryview`` that raises
  :class:`NeedMore` when the input ends early, so the stream decoders can simply retry once more
  bytes have arrived, and ``ProtocolError(code="frame_too_large")`` when a value would run past the
  caller's size limit, *before* waiting for (or allocating) those bytes.
* :func:`copy_bytes`: one copy of a slice, whatever the buffer type.

Everything that is not valid input raises :class:`~gossiprouter.protocol.errors.ProtocolError`.
"""

from __future__ import annotations

import re
import struct

from gossiprouter.protocol.errors import ProtocolError

__all__ = ["Buffer", "NeedMore", "Reader", "copy_bytes", "decode_utf", "encode_utf", "write_string"]

Buffer = bytes | bytearray | memoryview

_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class NeedMore(Exception):
    """The input ended before the value being read; ``needed`` is the absolute end offset required.

    Internal to the codecs: stream decoders catch it and wait for more bytes; frame decoders
    turn it into a "truncated frame" report. It never escapes the public decoder API.
    """

    __slots__ = ("needed",)

    def __init__(self, needed: int) -> None:
        super().__init__(needed)
        self.needed = needed


_SMALL_COPY = 512


def copy_bytes(buf: Buffer, start: int, end: int) -> bytes:
    """``bytes(buf[start:end])`` with exactly one copy, whatever the buffer type."""
    if isinstance(buf, bytes):
        return buf[start:end]
    if end - start <= _SMALL_COPY:
        # Copying a few bytes twice is cheaper than setting up and releasing a memoryview.
        return bytes(buf[start:end])
    # Slicing a bytearray would copy twice (bytearray slice, then bytes()); a memoryview slice
    # does not copy. Release the views at once so the bytearray can still be resized afterwards.
    with memoryview(buf) as mv, mv[start:end] as part:
        return bytes(part)


# --------------------------------------------------------------------------- modified UTF-8

_NON_BMP = re.compile("[\U00010000-\U0010ffff]")
# Java's readUTF rejects lead bytes 0xF0-0xFF (it has no 4-byte form); Python's UTF-8 codec would
# accept F0-F4, so they are screened out first.
_FOUR_BYTE_LEAD = re.compile(rb"[\xf0-\xff]")


def _split_surrogates(m: re.Match[str]) -> str:
    v = ord(m.group()) - 0x10000
    return chr(0xD800 + (v >> 10)) + chr(0xDC00 + (v & 0x3FF))


def encode_utf(s: str) -> bytes:
    """Java ``DataOutput.writeUTF``: u16 byte length, then modified UTF-8.

    NUL becomes ``C0 80`` and characters outside the BMP become a surrogate pair of 3 bytes each,
    as Java strings are UTF-16. More than 65535 encoded bytes is refused with ProtocolError.
    """
    if s.isascii() and "\x00" not in s:
        body = s.encode("ascii")
    else:
        body = (
            _NON_BMP.sub(_split_surrogates, s)
            .encode("utf-8", "surrogatepass")
            .replace(b"\x00", b"\xc0\x80")
        )
    if len(body) > 0xFFFF:
        raise ProtocolError(f"string too long for writeUTF: {len(body)} bytes")
    return _U16.pack(len(body)) + body


def decode_utf(data: Buffer) -> str:
    """Decode the body of a Java ``writeUTF`` string (modified UTF-8, without the length)."""
    raw = data if isinstance(data, bytes | bytearray) else bytes(data)
    if raw.isascii():
        return raw.decode("ascii")
    if _FOUR_BYTE_LEAD.search(raw):
        raise ProtocolError("invalid modified UTF-8: 4-byte sequence")
    # C0 can only ever be a lead byte (continuations are 80-BF), so this replacement cannot
    # touch anything but the 2-byte NUL form.
    raw = raw.replace(b"\xc0\x80", b"\x00")
    try:
        s = raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as e:
        raise ProtocolError(f"invalid modified UTF-8: {e.reason}") from None
    if b"\xed" in raw:
        # Surrogates came as separate 3-byte units: join valid pairs into one code point (a
        # UTF-16 round trip does exactly that), keep lone surrogates as Java would.
        s = s.encode("utf-16-be", "surrogatepass").decode("utf-16-be", "surrogatepass")
    return s


def write_string(s: str | None) -> bytes:
    """``Util.writeString`` / ``Bits.writeString``: ``00`` for null, else ``01`` + writeUTF."""
    if s is None:
        return b"\x00"
    return b"\x01" + encode_utf(s)


# --------------------------------------------------------------------------- reader


class Reader:
    """A position over a byte buffer, reading Java ``DataInput`` values.

    ``end`` is where the available data stops (reading past it raises :class:`NeedMore`);
    ``limit`` is where the caller's size budget stops (reading, or merely *declaring* a length,
    past it raises ``ProtocolError(code="frame_too_large")`` at once, without waiting).
    """

    __slots__ = ("buf", "end", "limit", "pos")

    def __init__(
        self, buf: Buffer, pos: int = 0, end: int | None = None, limit: int | None = None
    ) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end
        self.limit = limit

    def remaining(self) -> int:
        return self.end - self.pos

    def _advance(self, n: int) -> int:
        """Reserve ``n`` bytes; return where they start."""
        start = self.pos
        stop = start + n
        if self.limit is not None and stop > self.limit:
            raise ProtocolError(
                f"object larger than the limit ({stop - start} bytes wanted at offset {start})",
                code="frame_too_large",
            )
        if stop > self.end:
            raise NeedMore(stop)
        self.pos = stop
        return start

    def u8(self) -> int:
        return self.buf[self._advance(1)]

    def i8(self) -> int:
        b = self.buf[self._advance(1)]
        return b - 256 if b > 127 else b

    def boolean(self) -> bool:
        """Java ``readBoolean``: any non-zero byte is true."""
        return self.buf[self._advance(1)] != 0

    def presence(self, what: str) -> bool:
        """A 0/1 presence byte (writeString, writeByteBuffer); anything else is refused."""
        b = self.buf[self._advance(1)]
        if b > 1:
            raise ProtocolError(f"bad presence byte {b:#04x} for {what}")
        return b == 1

    def u16(self) -> int:
        return int(_U16.unpack_from(self.buf, self._advance(2))[0])

    def i16(self) -> int:
        return int(_I16.unpack_from(self.buf, self._advance(2))[0])

    def i32(self) -> int:
        return int(_I32.unpack_from(self.buf, self._advance(4))[0])

    def i64(self) -> int:
        return int(_I64.unpack_from(self.buf, self._advance(8))[0])

    def skip(self, n: int) -> None:
        self._advance(n)

    def take(self, n: int) -> bytes:
        start = self._advance(n)
        return copy_bytes(self.buf, start, start + n)

    def slice(self, start: int, end: int) -> bytes:
        """The bytes between two absolute offsets already read."""
        return copy_bytes(self.buf, start, end)

    def utf(self) -> str:
        n = self.u16()
        start = self._advance(n)
        # Strings are short: a slice (a copy for bytes/bytearray, a view for memoryview) is fine.
        return decode_utf(self.buf[start : start + n])

    def string(self) -> str | None:
        """``Util.readString``: presence byte, then writeUTF."""
        if not self.presence("string"):
            return None
        return self.utf()

    def int_compressed(self) -> int:
        """``Bits.readIntCompressed``: byte count (0-4), then that many little-endian bytes."""
        n = self.u8()
        if n > 4:
            raise ProtocolError(f"bad compressed int length {n}")
        start = self._advance(n)
        return int.from_bytes(bytes(self.buf[start : start + n]), "little")
