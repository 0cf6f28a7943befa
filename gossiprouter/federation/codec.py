"""The federation's payloads, encoded and decoded: a router's presence, its membership record
of a group, and the header of a routed message (docs/federation.md).

Sans-IO, as :mod:`gossiprouter.federation.state`, which holds what they describe: bytes in,
plain values out. A decoder raises one of its ``*_ERRORS`` for a payload it cannot read (the
state counts it as malformed); what the MQTT bridge does with the bytes is
:mod:`gossiprouter.federation.peers`.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

import msgpack

from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.jgroups_address import V2, V5, JAddress
from gossiprouter.routing.entries import Group, Kind, RemoteCarrier
from gossiprouter.sessions.jgroups_common import JWire

FORMAT = 1
_HEAD_LEN = struct.Struct(">H")  # before a routed message's msgpack header
# What one member record holds: addr, name, physical, kind, identity, live, wire. ``live``:
# 0 held in reconnect grace, 1 connected, NEWCOMER connected while another live router
# carried it (a move's new router: federation/moves.py; read as true by older versions).
Member = tuple[bytes, str | None, tuple[tuple[str, int], ...], Kind, str | None, int, Any]
NEWCOMER = 2
# What each decoder raises for a payload it cannot read.
PRESENCE_ERRORS = (ValueError, msgpack.UnpackException)
RECORD_ERRORS = (ValueError, TypeError, OverflowError, ProtocolError, msgpack.UnpackException)
# Record types (the first item of a record) and the most chunks one snapshot may have.
CHUNK, DELTA = 1, 2
MAX_CHUNKS = 4096


class Chunk(NamedTuple):
    """One chunk of a snapshot: version (run, seq), ``count`` chunks in all."""

    run: bytes
    seq: int
    total: int
    part: int
    members: list[Member]


class Delta(NamedTuple):
    """The changes of version ``seq`` of ``run`` (the version before it is ``seq - 1``)."""

    run: bytes
    seq: int
    joins: list[Member]
    leaves: list[bytes]
    suspected: set[bytes]


ROUTE_ERRORS = (ValueError, TypeError, struct.error, msgpack.UnpackException)


# --------------------------------------------------------------------------- presence


def encode_presence(name: str, ttl: int) -> bytes:
    """A router's presence: its name and the seconds it is valid for unless republished."""
    out: bytes = msgpack.packb({"v": FORMAT, "name": name, "ttl": ttl})
    return out


def decode_presence(payload: bytes) -> tuple[str, int | None]:
    """(name, ttl) of a non-empty presence."""
    info = msgpack.unpackb(payload)
    name = info.get("name", "") if isinstance(info, dict) else ""
    ttl = info.get("ttl") if isinstance(info, dict) else None
    if not isinstance(name, str) or not (ttl is None or isinstance(ttl, int)):
        raise ValueError("name or ttl")
    return name, ttl


# --------------------------------------------------------------------------- records


def local_members(g: Group) -> list[list[Any]]:
    """The members of ``g`` this router publishes in its record: those it carries, and those
    it holds in reconnect grace (never a provisioned one: every router has its own)."""
    out = []
    for e in g.entries.values():
        if e.kind == Kind.PROVISIONED:
            continue  # every router has its own, from its config
        live = any(not isinstance(c, RemoteCarrier) for c in e.carriers)
        if not live and not (e.grace_until is not None and not e.carriers):
            continue
        out.append([e.addr, e.name, [list(p) for p in e.physical], int(e.kind), e.identity,
                    live, _wire_out(e.wire)])
    return out


def encode_chunk(run: bytes, seq: int, count: int, index: int,
                 members: list[bytes]) -> bytes:
    """Chunk ``index`` of ``count`` of a snapshot at version (run, seq): ``members`` are
    already packed (:func:`pack_member`), so a snapshot is split by size without re-encoding."""
    return _list_head(6, CHUNK, run, seq, count, index) + _array(members)


def encode_delta(run: bytes, seq: int, joins: list[bytes], leaves: list[bytes],
                 suspected: list[bytes]) -> bytes:
    """Delta ``seq`` of run ``run``: the members that joined or changed (packed), those that
    left, and those of them that left as suspected."""
    out: bytes = (_list_head(6, DELTA, run, seq) + _array(joins) + msgpack.packb(leaves)
                  + msgpack.packb(suspected))
    return out


def pack_member(m: list[Any]) -> bytes:
    out: bytes = msgpack.packb(m)
    return out


def split_chunks(run: bytes, seq: int, members: list[bytes], limit: int) -> list[bytes]:
    """A snapshot at (run, seq) as chunks of at most ``limit`` bytes each (at least one)."""
    groups: list[list[bytes]] = [[]]
    size = 0
    room = max(limit - 64, 1)  # the chunk's own header, at most 45 bytes
    for m in members:
        if groups[-1] and size + len(m) > room:
            groups.append([])
            size = 0
        groups[-1].append(m)
        size += len(m)
    return [encode_chunk(run, seq, len(groups), i, g) for i, g in enumerate(groups)]


def _list_head(n: int, *items: Any) -> bytes:
    return bytes([0x90 | n]) + b"".join(msgpack.packb(i) for i in items)


def _array(packed: list[bytes]) -> bytes:
    n = len(packed)
    head = bytes([0x90 | n]) if n < 16 else (b"\xdc" + n.to_bytes(2, "big") if n < 65536
                                             else b"\xdd" + n.to_bytes(4, "big"))
    return head + b"".join(packed)


def _wire_out(w: object) -> list[Any] | None:
    if not isinstance(w, JWire):
        return None
    phys = None if w.physical is None else [a.raw for a in w.physical]
    return [w.addr.version, w.addr.raw, phys]


def _wire_in(w: Any) -> JWire | None:
    if w is None:
        return None
    version, raw, phys = w
    # Checked before parsing: the codec trusts its caller's version and types.
    if version not in (V2, V5) or isinstance(version, bool) or not isinstance(raw, bytes) \
            or not (phys is None or (isinstance(phys, list)
                                     and all(isinstance(p, bytes) for p in phys))):
        raise ValueError("bad JGroups encoding")
    addr = JAddress.parse(raw, version=version)
    if addr is None:
        raise ValueError("null address")
    physical = None
    if phys is not None:
        physical = tuple(a for a in (JAddress.parse(p, version=version) for p in phys)
                         if a is not None)
    return JWire(addr, physical)


def _member_in(m: Any) -> Member:
    addr, name, physical, kind, identity, live, wire = m
    if not isinstance(addr, bytes) or not (name is None or isinstance(name, str)) \
            or not (identity is None or isinstance(identity, str)):
        raise ValueError("bad member")
    phys = tuple((h, p) for h, p in physical)
    if not all(isinstance(h, str) and isinstance(p, int) and 0 <= p <= 0xFFFF
               for h, p in phys):
        raise ValueError("bad physical address")
    # Provisioned entries are never federated (each router has its own): one in a record
    # would be an entry no record could remove.
    if kind not in (Kind.CONNECTION, Kind.IN_PROCESS) or isinstance(kind, bool):
        raise ValueError(f"bad kind {kind!r}")
    live = NEWCOMER if live == NEWCOMER and not isinstance(live, bool) else int(bool(live))
    return (addr, name, phys, Kind(kind), identity, live, _wire_in(wire))


def _addrs(xs: Any) -> list[bytes]:
    if not isinstance(xs, list) or not all(isinstance(a, bytes) for a in xs):
        raise ValueError("bad address list")
    return xs


def decode_record(payload: bytes) -> Chunk | Delta:
    """A snapshot chunk or a delta (docs/federation.md, "Records")."""
    data = msgpack.unpackb(payload)
    if not isinstance(data, list) or len(data) != 6:
        raise ValueError("not a record")
    tag, run, seq = data[0], data[1], data[2]
    if not isinstance(run, bytes) or len(run) > 16 or not isinstance(seq, int) \
            or isinstance(seq, bool) or not 0 < seq < 1 << 62:
        raise ValueError("bad version")
    if tag == CHUNK:
        count, index, ms = data[3], data[4], data[5]
        if not (isinstance(count, int) and isinstance(index, int) and 0 <= index < count
                <= MAX_CHUNKS) or isinstance(count, bool) or isinstance(index, bool) \
                or not isinstance(ms, list):
            raise ValueError("bad chunk")
        return Chunk(run, seq, count, index, [_member_in(m) for m in ms])
    if tag == DELTA:
        joins, leaves, suspected = data[3], data[4], data[5]
        if not isinstance(joins, list):
            raise ValueError("bad delta")
        return Delta(run, seq, [_member_in(m) for m in joins], _addrs(leaves),
                     set(_addrs(suspected)))
    raise ValueError(f"unknown record type {tag!r}")


# --------------------------------------------------------------------------- routed messages


class Route(NamedTuple):
    """A routed message, decoded (:func:`decode_route`)."""

    origin: str  # the router that wrote it (its subtree)
    group: str
    dest: bytes | None  # None: the group
    frame_count: int  # how many frames (``count``)
    handed: bool  # handed on by ``origin``: after grace, or after a move (``src``)
    seq: int  # the fan-out's sequence number at the router that routed it first
    src: str | None  # a move's hand-on: the router that routed the frames first
    multicast: bool  # a move's hand-on of a multicast (``dest``: the member it is for)
    frames: bytes


def encode_route(origin: str, group: str, dest: bytes | None, count: int,
                 frames: bytes, handed: bool = False, seq: int = 0,
                 src: str | None = None, multicast: bool = False) -> bytes:
    """A routed message: ``count`` frames from router ``origin`` for ``dest`` (None: the
    group), behind a header read alone (its length first): ``[origin, group, dest, count,
    handed, seq]``, plus ``[src, multicast]`` for a move's hand-on. ``handed``: frames
    handed on by ``origin``, never to be passed on again: held for a member in grace and
    handed to where it came back (``src`` None), or received for a member that moved to
    another router (``src``: the router that routed them first, ``seq`` its number of the
    fan-out). Their senders are members of the group, not necessarily of ``origin``."""
    head: bytes = msgpack.packb([origin, group, dest, count, handed, seq,
                                 *((src, multicast) if src is not None else ())])
    return _HEAD_LEN.pack(len(head)) + head + frames


def decode_route(payload: bytes) -> Route:
    """The :class:`Route` of a routed message."""
    # The header is read alone (its length first), so the frames are not copied
    # into a decoder's buffer on the way.
    (n,) = _HEAD_LEN.unpack_from(payload)
    origin, group, dest, count, *rest = msgpack.unpackb(payload[2:2 + n])
    # Before sequence numbers: no more, or ``true`` (handed on after grace).
    handed, seq, src, multicast = [*rest, *[False, 0, None, False][len(rest):]][:4]
    if not (isinstance(origin, str) and isinstance(group, str)
            and (dest is None or isinstance(dest, bytes))
            and isinstance(count, int) and not isinstance(count, bool) and count > 0
            and isinstance(handed, bool) and isinstance(seq, int)
            and not isinstance(seq, bool) and len(rest) in (0, 1, 2, 4)
            and (src is None or (isinstance(src, str) and handed and dest is not None))
            and isinstance(multicast, bool)):
        raise ValueError("bad header")
    return Route(origin, group, dest, count, handed, seq, src, multicast, payload[2 + n:])
