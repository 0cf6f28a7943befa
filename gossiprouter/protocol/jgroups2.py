"""JGroups 2.12 GossipRouter wire protocol (TUNNEL / TCPGOSSIP clients of JGroups 2.x), sans-IO.

2.12 has no framing: each request is a self-delimiting ``GossipData`` object written straight onto
the socket, usually split over several TCP segments (the client's stream is unbuffered). Every
GossipData has the same seven fields, whatever its type::

    byte type | writeString group | writeAddress addr | writeString logical_name
    | writeAddresses mbrs | writeAddresses physical_addrs | writeByteBuffer buffer

Some replies are not GossipData at all: CONNECT is answered with one raw status byte and
GOSSIP_GET with a raw ``short`` count of ``PingData``; a SUSPECT is a GossipData followed by an
extra address. Their shape is implied by the request, so the client-side decoder must be told
what to expect (:meth:`ClientDecoder.expect_connect_reply`,
:meth:`ClientDecoder.expect_members_reply`).

* :class:`Decoder`: what the router reads (client -> router).
* :class:`ClientDecoder`: what a client reads (router -> client).
* The router's zero-copy reader of a client's stream, runs of MESSAGEs with one header and the
  other objects, decoded by :class:`Decoder`, is :mod:`gossiprouter.protocol.jgroups2_scan`
  (the sessions' hot loop builds on it).
* Encoders for both directions, and :func:`encode` for any event.

Since nothing delimits objects, a parse error leaves the stream unusable; decoders raise
:class:`~gossiprouter.protocol.errors.ProtocolError` and keep raising it, and the router closes
the connection. Byte layouts are documented in the reference notes, section 1.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.jgroups_address import (
    V2,
    JAddress,
    read_address,
    read_addresses,
    write_address,
    write_addresses,
)
from gossiprouter.protocol.jgroups_buffer import DEFAULT_MAX_FRAME, StreamBuffer
from gossiprouter.protocol.jgroups_reader import Buffer, NeedMore, Reader, encode_utf, write_string

__all__ = [
    "CLOSE",
    "CONNECT",
    "CONNECT_OK",
    "DISCONNECT",
    "DISCONNECT_OK",
    "GOSSIP_GET",
    "MESSAGE",
    "OP_FAIL",
    "PING",
    "SUSPECT",
    "ClientDecoder",
    "ClientEvent",
    "Close",
    "Connect",
    "ConnectReply",
    "Decoder",
    "Disconnect",
    "DisconnectOk",
    "Event",
    "GossipGet",
    "Member",
    "MembersReply",
    "Message",
    "OpFail",
    "Ping",
    "ServerEvent",
    "Suspect",
    "Unknown",
    "close",
    "connect",
    "connect_ok",
    "disconnect",
    "disconnect_ok",
    "encode",
    "encode_gossip_data",
    "gossip_get",
    "gossip_get_reply",
    "message",
    "message_to_client",
    "op_fail",
    "ping",
    "suspect",
    "writable",
]

# GossipRouter type codes (2.12); there is no 3 or 5-9.
CONNECT = 0x01
DISCONNECT = 0x02
GOSSIP_GET = 0x04
MESSAGE = 0x0A
SUSPECT = 0x0B
PING = 0x0C
CLOSE = 0x0D
CONNECT_OK = 0x0E
OP_FAIL = 0x0F
DISCONNECT_OK = 0x10

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")

# The tail of a GossipData whose addr, logical_name, mbrs, physical_addrs are all null.
_NULL_ADDR_TO_END = b"\x01\x00\xff\xff\xff\xff"


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Connect:
    """CONNECT: register ``addr`` in ``group``. ``physical`` is None when the list was null."""

    group: str | None
    addr: JAddress | None
    name: str | None
    physical: tuple[JAddress, ...] | None


@dataclass(frozen=True, slots=True)
class Disconnect:
    group: str | None
    addr: JAddress | None


@dataclass(frozen=True, slots=True)
class GossipGet:
    group: str | None


@dataclass(frozen=True, slots=True)
class Message:
    """MESSAGE in either direction; ``dest`` None = multicast.

    Router -> client messages have ``group`` None (the router rewrites it). A null buffer
    decodes as ``b""`` (the router drops both alike).
    """

    group: str | None
    dest: JAddress | None
    payload: bytes


@dataclass(frozen=True, slots=True)
class Ping:
    """Keep-alive; no reply."""


@dataclass(frozen=True, slots=True)
class Close:
    """The client is leaving; the router closes the socket without SUSPECTs."""


@dataclass(frozen=True, slots=True)
class Unknown:
    """A GossipData with a type the receiver does not handle; it was parsed and is ignored."""

    type_byte: int


@dataclass(frozen=True, slots=True)
class ConnectReply:
    """The raw status byte answering CONNECT: ``0e`` CONNECT_OK or ``0f`` OP_FAIL."""

    status: int

    @property
    def ok(self) -> bool:
        return self.status == CONNECT_OK


@dataclass(frozen=True, slots=True)
class Member:
    """One ``PingData`` of a GOSSIP_GET reply (view and view_id are always null)."""

    addr: JAddress | None
    name: str | None
    physical: tuple[JAddress, ...] | None
    is_server: bool = True


@dataclass(frozen=True, slots=True)
class MembersReply:
    """The GOSSIP_GET reply: a raw short count + PingData list, no type byte."""

    members: tuple[Member, ...]


@dataclass(frozen=True, slots=True)
class Suspect:
    """SUSPECT: the suspected address follows the (all-null) GossipData as an extra address."""

    addr: JAddress | None


@dataclass(frozen=True, slots=True)
class DisconnectOk:
    """DISCONNECT_OK, a full GossipData with every field null."""


@dataclass(frozen=True, slots=True)
class OpFail:
    """OP_FAIL sent as a full GossipData (the router's answer to a failed DISCONNECT)."""


ServerEvent = Connect | Disconnect | GossipGet | Message | Ping | Close | Unknown
ClientEvent = ConnectReply | MembersReply | Message | Suspect | DisconnectOk | OpFail | Unknown
Event = ServerEvent | ClientEvent


# --------------------------------------------------------------------------- parsing


def _read_gossip(
    r: Reader,
) -> tuple[int, str | None, JAddress | None, str | None, tuple[JAddress, ...] | None, bytes | None]:
    """One GossipData: (type, group, addr, logical_name, physical_addrs, buffer)."""
    t = r.u8()
    group = r.string()
    addr = read_address(r, V2)
    name = r.string()
    read_addresses(r, V2)  # mbrs: never set by RouterStub, unused by the router
    physical = read_addresses(r, V2)
    payload = None
    if r.presence("byte buffer"):
        n = r.i32()
        if n < 0:
            raise ProtocolError(f"negative byte buffer length {n}")
        payload = r.take(n)  # refused at once by the Reader's limit if n > max_frame
    return t, group, addr, name, physical, payload


def _read_member(r: Reader) -> Member:
    """``PingData.readFrom`` (2.12)."""
    addr = read_address(r, V2)
    if r.boolean():
        # A View needs the whole View/MergeView serialization; routers never send one.
        raise ProtocolError("PingData with a view is not supported")
    if r.boolean():  # view_id: writeAddress coordinator + long id
        read_address(r, V2)
        r.i64()
    is_server = r.boolean()
    name = r.string()
    physical = read_addresses(r, V2)
    return Member(addr, name, physical, is_server)


_E = TypeVar("_E", ServerEvent, ClientEvent)


class _StreamDecoder(StreamBuffer, Generic[_E]):
    """Retry logic shared by both directions."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        super().__init__(max_frame)
        self._need = 0  # buffer length required before a retry can succeed
        self._base = 0  # stream offset of self._buf[0]

    def next_event(self) -> _E | None:
        """The next complete event, or None until more bytes are fed.

        Raises ProtocolError on bad input; the stream is then unusable and every later call
        raises again.
        """
        self._check()
        if len(self._buf) < self._need or self._pos == len(self._buf):
            self._compact()
            return None
        # max_frame bounds one whole object: a huge declared length fails here at once.
        r = Reader(self._buf, self._pos, len(self._buf), self._pos + self.max_frame)
        try:
            ev = self._parse(r)
        except NeedMore as e:
            self._need = e.needed
            self._compact()
            return None
        except ProtocolError as e:
            self._error = ProtocolError(str(e), e.code)
            raise
        self._pos = r.pos
        self._need = 0
        return ev

    @property
    def received(self) -> int:
        """Total bytes fed so far (the stream offset of the next byte to arrive)."""
        return self._base + len(self._buf)

    def _compact(self) -> None:
        if self._pos:
            self._need = max(0, self._need - self._pos)
            self._base += self._pos
            super()._compact()

    def _parse(self, r: Reader) -> _E:
        raise NotImplementedError


class Decoder(_StreamDecoder[ServerEvent]):
    """Client -> router stream decoder (what the router reads).

    ``max_frame`` caps the encoded size of one GossipData; a larger declared buffer or string
    length raises ``ProtocolError(code="frame_too_large")`` before the bytes arrive.
    """

    def _parse(self, r: Reader) -> ServerEvent:
        t, group, addr, name, physical, payload = _read_gossip(r)
        if t == MESSAGE:
            return Message(group, addr, b"" if payload is None else payload)
        if t == CONNECT:
            return Connect(group, addr, name, physical)
        if t == DISCONNECT:
            return Disconnect(group, addr)
        if t == GOSSIP_GET:
            return GossipGet(group)
        if t == PING:
            return Ping()
        if t == CLOSE:
            return Close()
        return Unknown(t)


class ClientDecoder(_StreamDecoder[ClientEvent]):
    """Router -> client stream decoder (what a RouterStub reads).

    Call :meth:`expect_connect_reply` when sending CONNECT and :meth:`expect_members_reply`
    when sending GOSSIP_GET, before feeding any byte received after the request went out. The
    first object that starts at or after the stream offset reached at that moment is read as
    the reply (an object already partly received, e.g. a MESSAGE, is not). Expectations queue
    up in order. Everything else is a type-byte GossipData.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        super().__init__(max_frame)
        # (reply kind, first stream offset the reply can start at)
        self._expect: deque[tuple[Literal["connect", "members"], int]] = deque()

    def expect_connect_reply(self) -> None:
        self._expect.append(("connect", self.received))

    def expect_members_reply(self) -> None:
        self._expect.append(("members", self.received))

    def _parse(self, r: Reader) -> ClientEvent:
        if self._expect and self._expect[0][1] <= self._base + r.pos:
            if self._expect[0][0] == "connect":
                ev: ClientEvent = ConnectReply(r.u8())
            else:
                n = r.i16()  # RouterStub reads no entries for a negative count
                ev = MembersReply(tuple(_read_member(r) for _ in range(max(n, 0))))
            self._expect.popleft()  # only once the whole reply has been read
            return ev
        t, group, addr, _name, _physical, payload = _read_gossip(r)
        if t == MESSAGE:
            return Message(group, addr, b"" if payload is None else payload)
        if t == SUSPECT:
            return Suspect(read_address(r, V2))
        if t == DISCONNECT_OK:
            return DisconnectOk()
        if t == OP_FAIL:
            return OpFail()
        return Unknown(t)


# --------------------------------------------------------------------------- encoding


def _v2(addr: JAddress | None) -> bytes:
    return write_address(addr, V2)


def _v2_list(addrs: Sequence[JAddress] | None) -> bytes:
    return write_addresses(addrs, V2)


def encode_gossip_data(
    type_byte: int,
    group: str | None = None,
    addr: JAddress | None = None,
    name: str | None = None,
    mbrs: Sequence[JAddress] | None = None,
    physical: Sequence[JAddress] | None = None,
    payload: Buffer | None = None,
) -> bytes:
    """``GossipData.writeTo`` (2.12) with every field explicit."""
    parts = [
        bytes([type_byte]),
        write_string(group),
        _v2(addr),
        write_string(name),
        _v2_list(mbrs),
        _v2_list(physical),
    ]
    if payload is None:
        parts.append(b"\x00")
    else:
        parts.append(b"\x01" + _I32.pack(len(payload)))
        parts.append(bytes(payload) if not isinstance(payload, bytes) else payload)
    return b"".join(parts)


def connect(
    group: str | None,
    addr: JAddress | None,
    name: str | None,
    physical: Sequence[JAddress] | None,
) -> bytes:
    """Client: CONNECT (expect a one-byte reply)."""
    return encode_gossip_data(CONNECT, group, addr, name, None, physical)


def disconnect(group: str | None, addr: JAddress | None) -> bytes:
    """Client: DISCONNECT (the router answers DISCONNECT_OK)."""
    return encode_gossip_data(DISCONNECT, group, addr)


def gossip_get(group: str | None) -> bytes:
    """Client: GOSSIP_GET (expect a member list without a type byte)."""
    return encode_gossip_data(GOSSIP_GET, group)


def message(group: str | None, dest: JAddress | None, payload: Buffer) -> bytes:
    """MESSAGE (``dest`` None = multicast); ``group`` None is the router -> client form."""
    return encode_gossip_data(MESSAGE, group, dest, None, None, None, payload)


def ping() -> bytes:
    """Client: PING keep-alive."""
    return bytes([PING]) + b"\x00" + _NULL_ADDR_TO_END + b"\x00"


def close() -> bytes:
    """Client: CLOSE."""
    return bytes([CLOSE]) + b"\x00" + _NULL_ADDR_TO_END + b"\x00"


def connect_ok() -> bytes:
    """Router: the raw CONNECT_OK status byte."""
    return bytes([CONNECT_OK])


def op_fail() -> bytes:
    """Router: the raw OP_FAIL status byte (the answer to a bad CONNECT)."""
    return bytes([OP_FAIL])


def disconnect_ok() -> bytes:
    """Router: DISCONNECT_OK, a GossipData with every field null."""
    return bytes([DISCONNECT_OK]) + b"\x00" + _NULL_ADDR_TO_END + b"\x00"


def writable(name: str | None) -> str | None:
    """Why a 2.12 member named ``name`` could not be written back (None if it can).

    2.12 writes back only the logical name (GOSSIP_GET replies; SUSPECT and forwarded
    MESSAGEs carry a null group), as a ``writeUTF`` of at most 65,535 bytes of modified UTF-8,
    where a NUL read as one byte is written as two. Checked at registration.
    """
    if name is not None:
        try:
            encode_utf(name)
        except ProtocolError as e:
            return f"logical name cannot be written back: {e}"
    return None


def gossip_get_reply(members: Sequence[Member]) -> bytes:
    """Router: the GOSSIP_GET reply, a raw short count + one PingData per member."""
    if len(members) > 0x7FFF:
        raise ProtocolError(f"too many members for one reply: {len(members)}")
    parts = [_I16.pack(len(members))]
    for m in members:
        parts.append(_v2(m.addr))
        parts.append(b"\x00\x00")  # view null, view_id null
        parts.append(b"\x01" if m.is_server else b"\x00")
        parts.append(write_string(m.name))
        parts.append(_v2_list(m.physical))
    return b"".join(parts)


def message_to_client(dest: JAddress | None, payload: Buffer) -> bytes:
    """Router: forward a MESSAGE to a member (the group is rewritten to null, as 2.12 does)."""
    return message(None, dest, payload)


def suspect(addr: JAddress | None) -> bytes:
    """Router: SUSPECT, an all-null GossipData followed by the suspected address."""
    return bytes([SUSPECT]) + b"\x00" + _NULL_ADDR_TO_END + b"\x00" + _v2(addr)


def encode(event: Event) -> bytes:
    """Encode any event of this module in its canonical form (the inverse of the decoders)."""
    match event:
        case Message(group, dest, payload):
            return message(group, dest, payload)
        case Connect(group, addr, name, physical):
            return connect(group, addr, name, physical)
        case Disconnect(group, addr):
            return disconnect(group, addr)
        case GossipGet(group):
            return gossip_get(group)
        case Ping():
            return ping()
        case Close():
            return close()
        case Unknown(type_byte):
            return encode_gossip_data(type_byte)
        case ConnectReply(status):
            return bytes([status])
        case MembersReply(members):
            return gossip_get_reply(members)
        case Suspect(addr):
            return suspect(addr)
        case DisconnectOk():
            return disconnect_ok()
        case OpFail():
            return encode_gossip_data(OP_FAIL)
    raise TypeError(f"not a jgroups2 event: {event!r}")
