"""The native protocol's frames (version 1), sans-IO: what a frame is, not how it is written.

The frame types (:class:`FrameType`, the first element of every frame), one frozen dataclass
per frame, the :data:`Frame` union and the limits every side checks (the preamble, the
versions, the largest frame, address and group). ``docs/protocol.md`` is the normative
description. The encoders are in :mod:`gossiprouter.protocol.native` (the protocol's public
module, which also re-exports everything here), the validating decoder in
:mod:`gossiprouter.protocol.native_decode`, the relay loop's scanner in
:mod:`gossiprouter.protocol.native_scan`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

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
