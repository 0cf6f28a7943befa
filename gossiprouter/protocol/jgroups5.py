"""JGroups 3.6.5+ / 4.x / 5.x GossipRouter wire protocol (TUNNEL / TCPGOSSIP / RouterStub), sans-IO.

Every frame, in both directions, is a big-endian ``int32`` length followed by that many bytes of
``GossipData``; the length ``-5`` (``ff ff ff fb``) alone is the graceful-close marker. The
GossipData body is::

    byte type | writeString group | writeAddress addr | writeAddress sender
    [type != MESSAGE: writeString logical_name | short n | n x PingData | writeAddress physical]
    | int length | length bytes payload

* :class:`Decoder` serves both directions (the router and clients): it checks the length prefix
  against ``max_frame`` before buffering the body, then parses the body *within* the frame, so a
  body that does not parse becomes a :class:`Malformed` event and the next frame is still found.
* MESSAGE, the hot path, only has its header parsed (group, dest, sender); the event carries the
  exact frame bytes (``raw``, length prefix included) to be forwarded unchanged. HEARTBEAT too
  carries its frame, to be echoed.
* The router's zero-copy reader of a client's frames, runs of MESSAGEs with one header and the
  other frames, is :mod:`gossiprouter.protocol.jgroups5_scan` (the sessions' hot loop builds on
  it).
* Encoders for every frame type, and :func:`encode` for any event.

Byte layouts are documented in the reference notes, section 2.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.jgroups_address import (
    V5,
    JAddress,
    read_address,
    read_addresses,
    write_address,
    write_addresses,
)
from gossiprouter.protocol.jgroups_buffer import StreamBuffer
from gossiprouter.protocol.jgroups_reader import (
    Buffer,
    NeedMore,
    Reader,
    copy_bytes,
    encode_utf,
    write_string,
)

__all__ = [
    "ALL_GROUPS",
    "CLOSE_MARKER",
    "GET_MBRS",
    "GET_MBRS_RSP",
    "GET_MBRS_RSP_LAST",
    "HEARTBEAT",
    "MESSAGE",
    "REGISTER",
    "SUSPECT",
    "UNREGISTER",
    "CloseMarker",
    "Decoder",
    "Event",
    "GetMembers",
    "Heartbeat",
    "Malformed",
    "Member",
    "MembersReply",
    "Message",
    "Register",
    "Suspect",
    "Unregister",
    "close_marker",
    "encode",
    "get_members",
    "get_members_reply",
    "heartbeat",
    "message",
    "register",
    "suspect",
    "unregister",
    "writable",
]

# GossipType ordinals.
REGISTER = 0
UNREGISTER = 1
GET_MBRS = 2
GET_MBRS_RSP = 3
MESSAGE = 4
HEARTBEAT = 5
SUSPECT = 6
GET_MBRS_RSP_LAST = 7

#: ``Connection.GRACEFUL_CLOSE``: a length of -5, then FIN.
CLOSE_MARKER = b"\xff\xff\xff\xfb"
# ``Global.ALL_GROUPS``: the group of the replies to a GET_MBRS for every group (5.4.4+), which
# write each group as ``<<all-groups>>:name``.
ALL_GROUPS = "<<all-groups>>"
_GRACEFUL_CLOSE = -5

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Register:
    """REGISTER ``addr`` in ``group``, with its logical name and physical address. No reply."""

    group: str | None
    addr: JAddress | None
    name: str | None
    physical: JAddress | None


@dataclass(frozen=True, slots=True)
class Unregister:
    group: str | None
    addr: JAddress | None


@dataclass(frozen=True, slots=True)
class GetMembers:
    """GET_MBRS; ``group`` None asks for every group (5.4.4+)."""

    group: str | None


@dataclass(frozen=True, slots=True)
class Message:
    """MESSAGE; ``dest`` None = multicast. ``raw`` is the whole frame, length prefix included.

    ``payload_offset`` is where the payload starts inside ``raw``.
    """

    group: str | None
    dest: JAddress | None
    sender: JAddress | None
    raw: bytes
    payload_offset: int = field(repr=False)

    @property
    def payload(self) -> bytes:
        """A copy of the payload (the router never needs it; it forwards ``raw``)."""
        return self.raw[self.payload_offset :]

    def payload_view(self) -> memoryview:
        """The payload without copying."""
        return memoryview(self.raw)[self.payload_offset :]


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """HEARTBEAT; ``raw`` is the whole frame, which the router echoes back unchanged."""

    raw: bytes


@dataclass(frozen=True, slots=True)
class CloseMarker:
    """The graceful-close length ``-5``: the peer is about to close the connection."""


@dataclass(frozen=True, slots=True)
class Malformed:
    """A frame whose body did not parse (it has been skipped; the stream is still in sync)."""

    reason: str
    body_len: int


@dataclass(frozen=True, slots=True)
class Member:
    """One ``PingData`` (5.x): ``flags`` is_server=1, is_coord=2; ``mbrs`` is always null from
    the router."""

    addr: JAddress | None
    name: str | None
    physical: JAddress | None
    flags: int = 1
    mbrs: tuple[JAddress, ...] | None = None


@dataclass(frozen=True, slots=True)
class MembersReply:
    """GET_MBRS_RSP (``last`` False) or GET_MBRS_RSP_LAST (``last`` True)."""

    group: str | None
    members: tuple[Member, ...]
    last: bool


@dataclass(frozen=True, slots=True)
class Suspect:
    """SUSPECT: ``addr`` left ``group`` without unregistering."""

    group: str | None
    addr: JAddress | None


Event = (
    Register
    | Unregister
    | GetMembers
    | Message
    | Heartbeat
    | CloseMarker
    | Malformed
    | MembersReply
    | Suspect
)


# --------------------------------------------------------------------------- decoding


def _read_member(r: Reader) -> Member:
    """``PingData.readFrom`` (5.x)."""
    addr = read_address(r, V5)
    flags = r.u8()
    name = r.string()
    physical = read_address(r, V5)
    mbrs = read_addresses(r, V5)
    return Member(addr, name, physical, flags, mbrs)


def _parse_body(buf: bytearray, start: int, end: int) -> Event:
    """Parse the frame ``buf[start:end]`` (``start`` is at the length prefix)."""
    r = Reader(buf, start + 4, end)
    t = r.u8()
    group = r.string()
    addr = read_address(r, V5)
    sender = read_address(r, V5)
    if t == MESSAGE:
        n = r.i32()
        if n < 0:
            raise ProtocolError(f"negative payload length {n}")
        payload_start = r.pos
        r.skip(n)
        if r.pos != end:
            raise ProtocolError(f"{end - r.pos} bytes after the payload")
        return Message(group, addr, sender, copy_bytes(buf, start, end), payload_start - start)
    if t > GET_MBRS_RSP_LAST:
        raise ProtocolError(f"unknown type {t}")
    name = r.string()
    count = r.i16()  # JGroups treats n <= 0 as "no PingData"
    members = tuple(_read_member(r) for _ in range(count)) if count > 0 else ()
    physical = read_address(r, V5)
    n = r.i32()
    if n < 0:
        raise ProtocolError(f"negative payload length {n}")
    r.skip(n)  # no request but MESSAGE carries a payload; ignore one if present
    if r.pos != end:
        raise ProtocolError(f"{end - r.pos} bytes after the payload")
    if t == REGISTER:
        return Register(group, addr, name, physical)
    if t == UNREGISTER:
        return Unregister(group, addr)
    if t == GET_MBRS:
        return GetMembers(group)
    if t == HEARTBEAT:
        return Heartbeat(copy_bytes(buf, start, end))
    if t == SUSPECT:
        return Suspect(group, addr)
    return MembersReply(group, members, t == GET_MBRS_RSP_LAST)


class Decoder(StreamBuffer):
    """Length-framed GossipData decoder, for either direction.

    :meth:`feed` bytes as they arrive (split anywhere); call :meth:`next_event` until it returns
    None. A length prefix above ``max_frame`` or negative (other than the close marker) raises
    ProtocolError at once (``frame_too_large`` / ``protocol``); the stream cannot continue after
    that, and later calls raise again. A bad body only yields :class:`Malformed`.
    """

    def next_event(self) -> Event | None:
        """The next event, or None until more bytes are fed."""
        self._check()
        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        if avail < 4:
            self._compact()
            return None
        n = int(_I32.unpack_from(buf, pos)[0])
        if n < 0:
            if n == _GRACEFUL_CLOSE:
                self._pos = pos + 4
                return CloseMarker()
            self._error = ProtocolError(f"negative frame length {n}")
            raise self._error
        if n > self.max_frame:
            self._error = ProtocolError(
                f"frame length {n} exceeds the limit of {self.max_frame}", code="frame_too_large"
            )
            raise self._error
        end = pos + 4 + n
        if end > len(buf):
            self._compact()
            return None
        self._pos = end
        if n == 0:
            return Malformed("empty frame", 0)
        try:
            return _parse_body(buf, pos, end)
        except NeedMore:
            return Malformed("truncated body", n)
        except ProtocolError as e:
            return Malformed(str(e), n)


# --------------------------------------------------------------------------- encoding


def _v5(addr: JAddress | None) -> bytes:
    return write_address(addr, V5)


def _frame(parts: list[bytes]) -> bytes:
    body_len = sum(len(p) for p in parts)
    return b"".join([_I32.pack(body_len), *parts])


def _request(
    type_byte: int,
    group: str | None,
    addr: JAddress | None = None,
    name: str | None = None,
    members: Sequence[Member] = (),
    physical: JAddress | None = None,
) -> bytes:
    """A non-MESSAGE frame (sender null, no payload), as JGroups writes them."""
    if len(members) > 0x7FFF:
        raise ProtocolError(f"too many members for one frame: {len(members)}")
    parts = [
        bytes([type_byte]),
        write_string(group),
        _v5(addr),
        b"\x01",  # sender: null outside MESSAGE
        write_string(name),
        _I16.pack(len(members)),
    ]
    for m in members:
        if m.mbrs is not None:
            for a in m.mbrs:
                _v5(a)
        parts += [
            _v5(m.addr),
            bytes([m.flags & 0xFF]),
            write_string(m.name),
            _v5(m.physical),
            write_addresses(m.mbrs),
        ]
    parts += [_v5(physical), b"\x00\x00\x00\x00"]
    return _frame(parts)


def register(
    group: str | None, addr: JAddress | None, name: str | None, physical: JAddress | None
) -> bytes:
    """Client: REGISTER."""
    return _request(REGISTER, group, addr, name, (), physical)


def unregister(group: str | None, addr: JAddress | None) -> bytes:
    """Client: UNREGISTER."""
    return _request(UNREGISTER, group, addr)


def get_members(group: str | None) -> bytes:
    """Client: GET_MBRS (``group`` None = all groups, 5.4.4+)."""
    return _request(GET_MBRS, group)


def message(
    group: str | None, dest: JAddress | None, sender: JAddress | None, payload: Buffer
) -> bytes:
    """MESSAGE (``dest`` None = multicast)."""
    header = b"".join(
        [
            bytes([MESSAGE]),
            write_string(group),
            _v5(dest),
            _v5(sender),
            _I32.pack(len(payload)),
        ]
    )
    return b"".join([_I32.pack(len(header) + len(payload)), header, payload])


def heartbeat() -> bytes:
    """HEARTBEAT, as TUNNEL sends it (and the router echoes it)."""
    return _request(HEARTBEAT, None)


def close_marker() -> bytes:
    """The graceful-close marker, sent just before closing the connection."""
    return CLOSE_MARKER


def writable(group: str, name: str | None) -> str | None:
    """Why a 5.x member of ``group`` named ``name`` could not be written back (None if it can).

    SUSPECT and GET_MBRS_RSP write the group, the all-groups reply writes
    ``<<all-groups>>:group``, member lists write the name: each a ``writeUTF``, at most 65,535
    bytes of modified UTF-8 (where NUL and characters outside the BMP take more bytes than
    they came in). Checked at registration, so that no query can fail later.
    """
    for what, s in (("group", f"{ALL_GROUPS}:{group}"), ("logical name", name)):
        if s is not None:
            try:
                encode_utf(s)
            except ProtocolError as e:
                return f"{what} cannot be written back: {e}"
    return None


def get_members_reply(group: str | None, members: Sequence[Member], last: bool) -> bytes:
    """Router: GET_MBRS_RSP (``last`` False) or GET_MBRS_RSP_LAST (``last`` True).

    Clients before 5.4.4 only know type 3; answer per-group queries with ``last=False`` for them.
    """
    return _request(GET_MBRS_RSP_LAST if last else GET_MBRS_RSP, group, None, None, members)


def suspect(group: str | None, addr: JAddress | None) -> bytes:
    """Router: SUSPECT ``addr`` to the remaining members of ``group``."""
    return _request(SUSPECT, group, addr)


def encode(event: Event) -> bytes:
    """Encode any event of this module in its canonical form (the inverse of the decoder)."""
    match event:
        case Message(group, dest, sender):
            return message(group, dest, sender, event.payload_view())
        case Register(group, addr, name, physical):
            return register(group, addr, name, physical)
        case Unregister(group, addr):
            return unregister(group, addr)
        case GetMembers(group):
            return get_members(group)
        case Heartbeat():
            return heartbeat()
        case CloseMarker():
            return close_marker()
        case MembersReply(group, members, last):
            return get_members_reply(group, members, last)
        case Suspect(group, addr):
            return suspect(group, addr)
        case Malformed():
            raise ValueError("a Malformed event has no encoding")
    raise TypeError(f"not a jgroups5 event: {event!r}")
