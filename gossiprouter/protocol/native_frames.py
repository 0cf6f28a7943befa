"""The native protocol's frames (version 1), sans-IO: what a frame is, and reading one.

* The frame types (:class:`FrameType`, the first element of every frame), one frozen dataclass
  per frame, the :data:`Frame` union and the limits every side checks (the preamble, the
  versions, the largest frame, address and group).
* The validating decoder: :func:`frame_from_body` decodes one frame body and checks every field
  (types, arities, ranges, the group and address limits); :class:`Decoder` cuts bytes split
  anywhere into frame bodies, checking ``max_frame`` on each length prefix before the body is
  buffered. Clients and tests use it; the router uses it for everything but the frames its
  scanner (:mod:`gossiprouter.protocol.native_scan`, which calls :func:`frame_from_body` for
  PUBLISH) relays byte for byte.

``docs/protocol.md`` is the normative description. The encoders are in
:mod:`gossiprouter.protocol.native`, the protocol's public module, which re-exports everything
here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import msgpack

from gossiprouter.protocol.errors import ProtocolError

PREAMBLE = b"GRTR"
SUPPORTED_VERSIONS = (1,)
DEFAULT_MAX_FRAME = 8 * 1024 * 1024
MAX_ADDR = 255
MAX_GROUP = 1024


class FrameType(IntEnum):
    """Frame type codes (the first element of every frame)."""

    HELLO = 1
    WELCOME = 2
    CONNECT = 3
    DISCONNECT = 4
    GET_MEMBERS = 5
    ROUTE = 6
    OK = 7
    ERROR = 8
    PING = 9
    PONG = 10
    EVENT = 11
    WATCH = 12
    UNWATCH = 13
    # Topic multicast (docs/protocol.md §11); numbered apart to leave room for other frames.
    SUBSCRIBE = 20
    UNSUBSCRIBE = 21
    PUBLISH = 22


# How encode() starts a ROUTE / PUBLISH body: a fixarray of 5 / 8 fields, then the type. The
# router's scanner (native_scan.py) recognises the frames it relays from these two bytes.
ROUTE_START = (0x95, int(FrameType.ROUTE))
PUBLISH_START = (0x98, int(FrameType.PUBLISH))

Physical = tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class Hello:
    versions: tuple[int, ...]
    client: str
    token: str | None = None


@dataclass(frozen=True, slots=True)
class Welcome:
    version: int
    router_id: str
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Connect:
    req: int
    group: str
    addr: bytes
    name: str | None = None
    physical: Physical = ()


@dataclass(frozen=True, slots=True)
class Disconnect:
    req: int
    group: str
    addr: bytes


@dataclass(frozen=True, slots=True)
class GroupRequest:
    """The fields of the requests about one group: GET_MEMBERS, WATCH, UNWATCH."""

    req: int
    group: str


@dataclass(frozen=True, slots=True)
class GetMembers(GroupRequest):
    pass


@dataclass(frozen=True, slots=True)
class Route:
    group: str
    dest: bytes | None
    sender: bytes
    payload: bytes


@dataclass(frozen=True, slots=True)
class MemberInfo:
    addr: bytes
    name: str | None
    physical: Physical


@dataclass(frozen=True, slots=True)
class Ok:
    """Answer to a request. ``members`` is set only for GET_MEMBERS.

    ``more`` marks a part of a member list too long for one frame: further OK frames with
    the same ``req`` follow, the last one without ``more`` (see :func:`encode_members`).
    """

    req: int
    members: tuple[MemberInfo, ...] | None = None
    more: bool = False


@dataclass(frozen=True, slots=True)
class Error:
    req: int | None
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Ping:
    nonce: int


@dataclass(frozen=True, slots=True)
class Pong:
    nonce: int


@dataclass(frozen=True, slots=True)
class Event:
    group: str
    kind: str
    addr: bytes
    name: str | None = None
    physical: Physical = ()


@dataclass(frozen=True, slots=True)
class Watch(GroupRequest):
    pass


@dataclass(frozen=True, slots=True)
class Unwatch(GroupRequest):
    pass


@dataclass(frozen=True, slots=True)
class TopicRequest:
    """The fields of SUBSCRIBE and UNSUBSCRIBE: the member ``addr`` of ``group`` and a
    pattern (see gossiprouter.core.topics)."""

    req: int
    group: str
    addr: bytes
    provider: str
    broadcast: str
    partition: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Subscribe(TopicRequest):
    pass


@dataclass(frozen=True, slots=True)
class Unsubscribe(TopicRequest):
    pass


# PUBLISH flags
PUB_GLOBAL = 0x01  # scope global: also to every other router of the federation
PUB_ECHO = 0x02  # the publisher's own member gets it too if one of its patterns matches


@dataclass(frozen=True, slots=True)
class Publish:
    """A publication to a multicast id, from a client and (same form) to a subscriber."""

    group: str
    sender: bytes
    provider: str
    broadcast: str
    partition: tuple[str, ...]
    flags: int
    payload: bytes

    @property
    def scope(self) -> str:
        return "global" if self.flags & PUB_GLOBAL else "local"


Frame = (
    Hello | Welcome | Connect | Disconnect | GetMembers | Route | Ok | Error | Ping | Pong | Event
    | Watch | Unwatch | Subscribe | Unsubscribe | Publish
)

EVENT_KINDS = ("join", "leave", "suspect")

# Which frames each side may send, and when: protocol/native_state.py (a table).


# --------------------------------------------------------------------------- decoding

_LEN = struct.Struct(">I")


def _bad(what: str) -> ProtocolError:
    return ProtocolError(what)


def _int(v: Any, what: str) -> int:
    if type(v) is not int:
        raise _bad(f"{what} must be an integer, got {type(v).__name__}")
    return v


def _req(v: Any) -> int:
    n = _int(v, "req")
    if not 0 <= n < 2**63:
        raise _bad("req out of range")
    return n


def _str(v: Any, what: str) -> str:
    if type(v) is not str:
        raise _bad(f"{what} must be a string, got {type(v).__name__}")
    return v


def _opt_str(v: Any, what: str) -> str | None:
    return None if v is None else _str(v, what)


def _group(v: Any) -> str:
    g = _str(v, "group")
    if not g:
        raise _bad("group must not be empty")
    if len(g) > MAX_GROUP // 4 and len(g.encode()) > MAX_GROUP:
        raise _bad(f"group longer than {MAX_GROUP} bytes")
    return g


def _addr(v: Any, what: str = "addr") -> bytes:
    if type(v) is not bytes:
        raise _bad(f"{what} must be binary, got {type(v).__name__}")
    if len(v) > MAX_ADDR:
        raise _bad(f"{what} longer than {MAX_ADDR} bytes")
    return v


def _physical(v: Any) -> Physical:
    if type(v) is not list:
        raise _bad("physical must be a list")
    out: list[tuple[str, int]] = []
    for item in v:
        if type(item) is not list or len(item) != 2:
            raise _bad("physical entries must be [host, port]")
        host = _str(item[0], "physical host")
        port = _int(item[1], "physical port")
        if not 0 <= port <= 65535:
            raise _bad("physical port out of range")
        out.append((host, port))
    return tuple(out)


def _partition(v: Any) -> tuple[str, ...]:
    # Only the shape is checked here; the topic rules (wildcards, limits) are the
    # router's to apply, with an ERROR that keeps the connection open.
    if type(v) is not list:
        raise _bad("partition must be a list of strings")
    for x in v:
        if type(x) is not str:
            raise _bad("partition elements must be strings")
    return tuple(v)


def _topic_request(a: list[Any], name: str) -> tuple[int, str, bytes, str, str, tuple[str, ...]]:
    _arity(a, 7, name)
    return (_req(a[1]), _group(a[2]), _addr(a[3]), _str(a[4], "provider"),
            _str(a[5], "broadcast"), _partition(a[6]))


def _member(v: Any) -> MemberInfo:
    if type(v) is not list or len(v) != 3:
        raise _bad("member entries must be [addr, name, physical]")
    return MemberInfo(_addr(v[0]), _opt_str(v[1], "name"), _physical(v[2]))


def _arity(a: list[Any], n: int, name: str) -> None:
    if len(a) != n:
        raise _bad(f"{name} takes {n - 1} fields, got {len(a) - 1}")


def frame_from_body(body: bytes | memoryview) -> Frame:
    """Decode and validate one frame body (without its length prefix)."""
    try:
        a = msgpack.unpackb(body, raw=False, use_list=True, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise _bad(f"body is not one msgpack value: {type(e).__name__}") from None
    except Exception as e:  # msgpack raises a few odd types on garbage
        raise _bad(f"body is not valid msgpack: {type(e).__name__}") from None
    if type(a) is not list or not a:
        raise _bad("frame must be a non-empty msgpack array")
    t = a[0]
    if type(t) is not int:
        raise _bad("frame type must be an integer")
    match t:
        case FrameType.ROUTE:
            _arity(a, 5, "ROUTE")
            dest = None if a[2] is None else _addr(a[2], "dest")
            payload = a[4]
            if type(payload) is not bytes:
                raise _bad("payload must be binary")
            return Route(_group(a[1]), dest, _addr(a[3], "sender"), payload)
        case FrameType.HELLO:
            _arity(a, 4, "HELLO")
            if type(a[1]) is not list or not a[1]:
                raise _bad("HELLO versions must be a non-empty list")
            versions = tuple(_int(v, "version") for v in a[1])
            return Hello(versions, _str(a[2], "client"), _opt_str(a[3], "token"))
        case FrameType.WELCOME:
            _arity(a, 4, "WELCOME")
            if type(a[3]) is not dict:
                raise _bad("WELCOME settings must be a map")
            return Welcome(_int(a[1], "version"), _str(a[2], "router_id"), a[3])
        case FrameType.CONNECT:
            _arity(a, 6, "CONNECT")
            return Connect(
                _req(a[1]), _group(a[2]), _addr(a[3]), _opt_str(a[4], "name"), _physical(a[5])
            )
        case FrameType.DISCONNECT:
            _arity(a, 4, "DISCONNECT")
            return Disconnect(_req(a[1]), _group(a[2]), _addr(a[3]))
        case FrameType.GET_MEMBERS:
            _arity(a, 3, "GET_MEMBERS")
            return GetMembers(_req(a[1]), _group(a[2]))
        case FrameType.OK:
            if len(a) != 4:
                _arity(a, 3, "OK")
            more = len(a) == 4 and a[3] is True
            if len(a) == 4 and type(a[3]) is not bool:
                raise _bad("OK continuation flag must be a boolean")
            if a[2] is None:
                if more:
                    raise _bad("OK continuation without a member list")
                return Ok(_req(a[1]), None)
            if type(a[2]) is not list:
                raise _bad("OK result must be nil or a member list")
            return Ok(_req(a[1]), tuple(_member(m) for m in a[2]), more)
        case FrameType.ERROR:
            _arity(a, 4, "ERROR")
            req = None if a[1] is None else _req(a[1])
            return Error(req, _str(a[2], "code"), _str(a[3], "message"))
        case FrameType.PING:
            _arity(a, 2, "PING")
            return Ping(_int(a[1], "nonce"))
        case FrameType.PONG:
            _arity(a, 2, "PONG")
            return Pong(_int(a[1], "nonce"))
        case FrameType.EVENT:
            _arity(a, 6, "EVENT")
            kind = _str(a[2], "kind")
            if kind not in EVENT_KINDS:
                raise _bad(f"unknown event kind {kind!r}")
            return Event(_group(a[1]), kind, _addr(a[3]), _opt_str(a[4], "name"), _physical(a[5]))
        case FrameType.WATCH:
            _arity(a, 3, "WATCH")
            return Watch(_req(a[1]), _group(a[2]))
        case FrameType.UNWATCH:
            _arity(a, 3, "UNWATCH")
            return Unwatch(_req(a[1]), _group(a[2]))
        case FrameType.SUBSCRIBE:
            return Subscribe(*_topic_request(a, "SUBSCRIBE"))
        case FrameType.UNSUBSCRIBE:
            return Unsubscribe(*_topic_request(a, "UNSUBSCRIBE"))
        case FrameType.PUBLISH:
            _arity(a, 8, "PUBLISH")
            flags = _int(a[6], "flags")
            if not 0 <= flags <= 255:
                raise _bad("PUBLISH flags out of range")
            if type(a[7]) is not bytes:
                raise _bad("payload must be binary")
            return Publish(_group(a[1]), _addr(a[2], "sender"), _str(a[3], "provider"),
                           _str(a[4], "broadcast"), _partition(a[5]), flags, a[7])
    raise _bad(f"unknown frame type {t}")


class Decoder:
    """Incremental frame decoder: feed bytes split anywhere, pull frames.

    The ``max_frame`` check is made on the 4-byte length prefix, before the
    body is buffered, so a peer claiming a 2 GiB frame costs nothing.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    @property
    def pending(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buf) - self._pos

    def next_body(self) -> memoryview | None:
        """The next complete frame body, or None if more bytes are needed."""
        buf, pos = self._buf, self._pos
        if len(buf) - pos < 4:
            return None
        (n,) = _LEN.unpack_from(buf, pos)
        if n > self.max_frame:
            raise ProtocolError(
                f"frame of {n} bytes exceeds max_frame {self.max_frame}", code="frame_too_large"
            )
        end = pos + 4 + n
        if len(buf) < end:
            return None
        self._pos = end
        return memoryview(buf)[pos + 4 : end]

    def next_frame(self) -> Frame | None:
        body = self.next_body()
        if body is None:
            return None
        try:
            return frame_from_body(body)
        finally:
            body.release()

    def frames(self) -> list[Frame]:
        """Every complete frame buffered so far."""
        out: list[Frame] = []
        while (f := self.next_frame()) is not None:
            out.append(f)
        return out
