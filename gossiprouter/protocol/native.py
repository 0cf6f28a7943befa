"""The native gossiprouter wire protocol, version 1, sans-IO: its public module and encoders.

A connection opens with the 4-byte preamble ``GRTR``; after it both sides
exchange frames: a big-endian ``u32`` body length, then a body holding exactly
one msgpack array whose first element is the frame type. ``docs/protocol.md``
is the normative description; this module and the three it gathers are its only
implementation.

The protocol is used as one namespace (``from gossiprouter.protocol import native as wire``;
``wire.Route``, ``wire.encode``, ``wire.Decoder``), so this module re-exports the frames it
writes:

* :mod:`gossiprouter.protocol.native_frames`: the frame types and dataclasses, the limits, and
  the validating decoder: :class:`Decoder` turns bytes (split anywhere) into frame objects,
  checking every field. Clients and tests use it; the router uses it for everything but the
  hot ROUTE path.
* the encoders, here: :func:`encode` for any frame, and the hot or special paths
  (:func:`encode_route`, :func:`encode_publish`, :func:`encode_members`...).
* :mod:`gossiprouter.protocol.native_scan` cuts received bytes into runs of
  ROUTE (and PUBLISH) frames with one header, without touching the payloads,
  for the router's relay loop, which forwards them byte for byte.
"""

from __future__ import annotations

import struct
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgpack

from gossiprouter.protocol.native_frames import (
    DEFAULT_MAX_FRAME,
    EVENT_KINDS,
    MAX_ADDR,
    MAX_GROUP,
    PREAMBLE,
    PUB_ECHO,
    PUB_GLOBAL,
    PUBLISH_START,
    ROUTE_START,
    SUPPORTED_VERSIONS,
    Connect,
    Decoder,
    Disconnect,
    Error,
    Event,
    Frame,
    FrameType,
    GetMembers,
    GroupRequest,
    Hello,
    MemberInfo,
    Ok,
    Physical,
    Ping,
    Pong,
    Publish,
    Route,
    Subscribe,
    TopicRequest,
    Unsubscribe,
    Unwatch,
    Watch,
    Welcome,
    frame_from_body,
)
from gossiprouter.protocol.native_scan import route_header as _route_header

__all__ = [
    "DEFAULT_MAX_FRAME",
    "EVENT_KINDS",
    "MAX_ADDR",
    "MAX_GROUP",
    "OK_OVERHEAD",
    "PREAMBLE",
    "PUBLISH_START",
    "PUB_ECHO",
    "PUB_GLOBAL",
    "ROUTE_START",
    "SUPPORTED_VERSIONS",
    "Connect",
    "Decoder",
    "Disconnect",
    "Error",
    "Event",
    "Frame",
    "FrameType",
    "GetMembers",
    "GroupRequest",
    "Hello",
    "MemberInfo",
    "Ok",
    "Physical",
    "Ping",
    "Pong",
    "Publish",
    "Route",
    "Subscribe",
    "TopicRequest",
    "Unsubscribe",
    "Unwatch",
    "Watch",
    "Welcome",
    "encode",
    "encode_error",
    "encode_members",
    "encode_publish",
    "encode_route",
    "frame_from_body",
    "member_problem",
]

# Room an OK frame needs around its member list: array header, type, req (up to 9 bytes),
# the list's header (up to 5) and the continuation flag, rounded up.
OK_OVERHEAD = 32

_LEN = struct.Struct(">I")


# --------------------------------------------------------------------------- encoding

_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def _frame(body: bytes) -> bytes:
    return _LEN.pack(len(body)) + body


def _phys(physical: Physical) -> list[list[str | int]]:
    return [[h, p] for h, p in physical]


def encode(frame: Frame) -> bytes:
    """Encode one frame with its length prefix."""
    return _frame(_packb(_fields(frame)))


def encode_route(group: str, dest: bytes | None, sender: bytes, payload: bytes) -> bytes:
    """The hot client path: encode a ROUTE without building a :class:`Route`."""
    return _frame(_packb([FrameType.ROUTE, group, dest, sender, payload]))


def _fields(frame: Frame) -> list[Any]:
    match frame:
        case Route(group, dest, sender, payload):
            return [FrameType.ROUTE, group, dest, sender, payload]
        case Hello(versions, client, token):
            return [FrameType.HELLO, list(versions), client, token]
        case Welcome(version, router_id, settings):
            return [FrameType.WELCOME, version, router_id, settings]
        case Connect(req, group, addr, name, physical):
            return [FrameType.CONNECT, req, group, addr, name, _phys(physical)]
        case Disconnect(req, group, addr):
            return [FrameType.DISCONNECT, req, group, addr]
        case GetMembers(req, group):
            return [FrameType.GET_MEMBERS, req, group]
        case Ok(req, members, more):
            result = (
                None
                if members is None
                else [[m.addr, m.name, _phys(m.physical)] for m in members]
            )
            return [FrameType.OK, req, result, True] if more else [FrameType.OK, req, result]
        case Error(req, code, message):
            return [FrameType.ERROR, req, code, message]
        case Ping(nonce):
            return [FrameType.PING, nonce]
        case Pong(nonce):
            return [FrameType.PONG, nonce]
        case Event(group, kind, addr, name, physical):
            return [FrameType.EVENT, group, kind, addr, name, _phys(physical)]
        case Watch(req, group):
            return [FrameType.WATCH, req, group]
        case Unwatch(req, group):
            return [FrameType.UNWATCH, req, group]
        case Subscribe(req, group, addr, provider, broadcast, partition):
            return [FrameType.SUBSCRIBE, req, group, addr, provider, broadcast, list(partition)]
        case Unsubscribe(req, group, addr, provider, broadcast, partition):
            return [FrameType.UNSUBSCRIBE, req, group, addr, provider, broadcast, list(partition)]
        case Publish(group, sender, provider, broadcast, partition, flags, payload):
            return [FrameType.PUBLISH, group, sender, provider, broadcast, list(partition),
                    flags, payload]
    raise TypeError(f"not a frame: {frame!r}")  # pragma: no cover - exhaustive above


def encode_publish(group: str, sender: bytes, provider: str, broadcast: str,
                   partition: tuple[str, ...] | list[str], flags: int, payload: bytes) -> bytes:
    """A PUBLISH frame without building a :class:`Publish` (client and bridge paths)."""
    return _frame(_packb([FrameType.PUBLISH, group, sender, provider, broadcast,
                          list(partition), flags, payload]))


def encode_error(req: int | None, code: str, message: str) -> bytes:
    return encode(Error(req, code, message))


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def encode_members(req: int, members: Sequence[MemberInfo], max_frame: int) -> list[bytes]:
    """The OK answering GET_MEMBERS ``req``: one frame, or as many as it takes so that no
    body exceeds ``max_frame`` (every part but the last flagged ``more``).

    A member list grows with the group while ``max_frame`` is fixed, so a big group cannot be
    answered in one frame; each member is packed once and the parts are cut between members.
    Registration refuses a member that would not fit alone (:func:`member_problem`), so every
    part holds at least one member.
    """
    head = _packb(FrameType.OK) + _packb(req)
    packed = [_packb([m.addr, m.name, _phys(m.physical)]) for m in members]
    room = max_frame - OK_OVERHEAD
    frames: list[bytes] = []
    part: list[bytes] = []
    size = 0
    for p in packed:
        if part and size + len(p) > room:
            frames.append(_frame(b"\x94" + head + _array_header(len(part)) + b"".join(part)
                                 + b"\xc3"))
            part, size = [], 0
        part.append(p)
        size += len(p)
    frames.append(_frame(b"\x93" + head + _array_header(len(part)) + b"".join(part)))
    return frames


def member_problem(group: str, addr: bytes, name: str | None, physical: Physical,
                   max_frame: int) -> str | None:
    """Why a member could not be written back to a native client (None if it can).

    Any member may be listed (GET_MEMBERS) and announced (EVENT) to a native client, JGroups
    ones included: its address must be one a native frame may carry, and each of those
    frames must fit in ``max_frame`` on its own.
    """
    if len(addr) > MAX_ADDR:
        return f"address of {len(addr)} bytes: the native protocol carries at most {MAX_ADDR}"
    try:
        event = len(encode(Event(group, "suspect", addr, name, physical))) - 4
        member = len(_packb([addr, name, _phys(physical)])) + OK_OVERHEAD
    except UnicodeEncodeError:
        # A JGroups (Java) string may hold a lone UTF-16 surrogate; UTF-8 cannot carry it.
        return "group, name or host is not valid Unicode (a lone surrogate)"
    if max(event, member) > max_frame:
        return (f"member data of {max(event, member)} bytes does not fit in one frame "
                f"(max_frame {max_frame})")
    return None


# Hidden from mypy: a module __getattr__ would make every misspelt name here type-check.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        """Deprecated names, kept working with a DeprecationWarning (issue 14 renamed and moved
        them): ``T`` is :class:`FrameType`; ``route_header`` lives in ``protocol.native_scan``."""
        if name == "T":
            warnings.warn("gossiprouter.protocol.native.T is deprecated: use FrameType",
                          DeprecationWarning, stacklevel=2)
            return FrameType
        if name == "route_header":
            warnings.warn("gossiprouter.protocol.native.route_header is deprecated: use "
                          "gossiprouter.protocol.native_scan.route_header",
                          DeprecationWarning, stacklevel=2)
            return _route_header
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
