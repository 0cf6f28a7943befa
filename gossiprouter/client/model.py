"""The client's data: members, messages, group events, counters, and the checks on them
(router and member addresses, groups, the stub's options).

Plain values with no I/O. Below them: :mod:`gossiprouter.client.status` (the routers'
addresses and connection states) and :mod:`gossiprouter.client.errors` (the exceptions; a
``refused`` GroupEvent carries one).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gossiprouter.client.errors import RouterError
from gossiprouter.client.status import RouterAddress
from gossiprouter.core.addresses import format_hostport, parse_hostport
from gossiprouter.core.topics import TopicId
from gossiprouter.protocol import native as wire

Physical = tuple[tuple[str, int], ...]
Mode = Literal["relay", "discovery"]
Policy = Literal["random", "round-robin"]

CLIENT_NAME = "gossiprouter-stub/python"
RECV_SIZE = 256 * 1024
# What a router may make the client hold (issue 31). A member list sent in parts (a
# GET_MEMBERS answer) has at most this many members and bytes; the PONGs owed to the
# router's PINGs, at most this many (a router pings every heartbeat_ms: one or two are owed,
# unless it stopped reading). Past either, the connection ends as a protocol violation.
MAX_REPLY_MEMBERS = 1 << 18
MAX_REPLY_BYTES = 32 * 1024 * 1024
MAX_QUEUED_PONGS = 1024
# The smallest max_frame option a stub takes (a WELCOME, a member list part must fit).
MIN_MAX_FRAME = 64 * 1024
# The rate-limited WARNING lines a router can cause (bad frames, ERRORs without a request):
# at most one line per this many seconds for each kind, with a count of those left out.
WARN_INTERVAL = 10.0
# Suspects for the same (group, addr) arriving within this window (one per
# router, typically milliseconds apart) are delivered once.
SUSPECT_DEDUPE_WINDOW = 5.0
# Error codes after which the router closes the connection (docs/protocol.md).
CLOSING_CODES = frozenset({
    "protocol", "frame_too_large", "unsupported_version", "unauthorized", "idle_timeout",
    "slow_consumer", "handshake_timeout", "rate_limited", "shutting_down", "limit",
    "internal_error",
})



# --------------------------------------------------------------------------- public data


@dataclass(frozen=True, slots=True)
class Member:
    """A member of a group: logical address, logical name, physical addresses."""

    addr: bytes
    name: str | None = None
    physical: Physical = ()


@dataclass(frozen=True, slots=True)
class Message:
    """A message received by a channel. ``dest`` is None for a group multicast."""

    group: str
    sender: bytes
    dest: bytes | None
    payload: bytes
    # Arrival order within the stub (for Channel.incoming); not part of equality.
    seq: int = field(default=0, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Publication(Message):
    """A topic publication received by a channel (one of its patterns matched ``topic``).

    ``topic`` is the multicast id ``(provider, broadcast, partition)``; ``scope``
    is ``"local"`` or ``"global"``; ``dest`` is always None. A Publication is a
    Message, so it arrives in the channel's iterator in order with the rest.
    """

    topic: TopicId = ("", "", ())
    scope: str = "local"


@dataclass(frozen=True, slots=True)
class GroupEvent:
    """A membership event of ``group``.

    ``kind`` is ``join`` / ``leave`` (for watched groups, merged over every
    router: ``join`` when an address first appears on any router, ``leave``
    when it is gone from all), ``suspect`` (a member vanished without
    DISCONNECT; merged over routers) or ``refused`` (a router refused to
    re-register this channel after a reconnect; ``error`` says why).
    """

    group: str
    kind: str
    member: Member
    router: RouterAddress
    error: RouterError | None = None
    seq: int = field(default=0, compare=False, repr=False)


@dataclass
class StubStats:
    """Counters for things the stub handled without telling anyone in particular."""

    undeliverable: int = 0  # routed frames for no local channel (e.g. just disconnected)
    # Frames from a router that were dropped: undecodable (JGRP-2721), or refused by the
    # state table (protocol/native_state.py), e.g. a second WELCOME; and a stream that is not
    # frames at all (a length past max_frame: the connection is closed). The receiver-side
    # framing check of the load tests (loadtest/peer.py) reads it.
    bad_frames: int = 0
    events_merged: int = 0  # duplicate join/leave/suspect from several routers
    async_errors: dict[str, int] = field(default_factory=dict)  # ERROR without req, by code
    # Global publications dropped because another router of the same federation delivers them.
    federated_duplicates: int = 0


# --------------------------------------------------------------------------- bounded stream

# --------------------------------------------------------------------------- helpers


def parse_router(value: str | tuple[str, int]) -> RouterAddress:
    """``("host", port)`` or ``"host:port"`` (``[v6]:port``) -> ``(host, port)``."""
    if not isinstance(value, str):
        try:
            host, port = value
        except (TypeError, ValueError):
            raise ValueError(f"router {value!r}: expected (host, port) or 'host:port'") from None
        if not isinstance(host, str) or not host or not isinstance(port, int) \
                or not 0 < port <= 65535:
            raise ValueError(f"router {value!r}: expected (host, port) with a port 1..65535")
        return host, port
    try:
        return parse_hostport(value)
    except ValueError as e:
        raise ValueError(f"router {value!r}: {e}") from None


def parse_routers(routers: Sequence[str | tuple[str, int]] | str) -> list[RouterAddress]:
    """A stub's routers: a list of ``(host, port)`` / ``"host:port"``, or one comma-separated
    string; at least one, none twice."""
    if isinstance(routers, str):
        routers = [r.strip() for r in routers.split(",")]
    addrs = [parse_router(r) for r in routers]
    if not addrs:
        raise ValueError("at least one router is needed")
    if len(set(addrs)) != len(addrs):
        raise ValueError("a router is listed twice")
    return addrs


def check_options(*, mode: str, policy: str, connect_timeout: float, request_timeout: float,
                  send_timeout: float, reconnect_initial: float, reconnect_max: float,
                  reconnect_reset: float, heartbeat_interval: float,
                  heartbeat_timeout: float, max_frame: int = wire.DEFAULT_MAX_FRAME) -> None:
    """ValueError naming the first of a stub's options that is out of range."""
    if mode not in ("relay", "discovery"):
        raise ValueError(f"mode {mode!r}: expected 'relay' or 'discovery'")
    if policy not in ("random", "round-robin"):
        raise ValueError(f"policy {policy!r}: expected 'random' or 'round-robin'")
    for name, value in (("connect_timeout", connect_timeout),
                        ("request_timeout", request_timeout),
                        ("send_timeout", send_timeout),
                        ("reconnect_max", reconnect_max)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0")
    for name, value in (("reconnect_initial", reconnect_initial),
                        ("reconnect_reset", reconnect_reset),
                        ("heartbeat_interval", heartbeat_interval),
                        ("heartbeat_timeout", heartbeat_timeout)):
        if not value >= 0:
            raise ValueError(f"{name} must be >= 0")
    if not isinstance(max_frame, int) or max_frame < MIN_MAX_FRAME:
        raise ValueError(f"max_frame must be an int of at least {MIN_MAX_FRAME} (bytes)")
    if heartbeat_timeout and heartbeat_timeout <= heartbeat_interval:
        raise ValueError("heartbeat_timeout must be greater than heartbeat_interval")
    if heartbeat_timeout and not heartbeat_interval:
        # Without PINGs an idle but healthy connection would look dead.
        raise ValueError("heartbeat_timeout needs heartbeat_interval > 0")


def fmt_router(router: RouterAddress) -> str:
    return format_hostport(*router)


def _check_group(group: str) -> None:
    if not isinstance(group, str) or not group:
        raise ValueError("group must be a non-empty string")
    if len(group.encode()) > wire.MAX_GROUP:
        raise ValueError(f"group longer than {wire.MAX_GROUP} bytes of UTF-8")


def _check_addr(addr: bytes, what: str = "addr") -> bytes:
    if not isinstance(addr, bytes | bytearray | memoryview):
        raise TypeError(f"{what} must be bytes, got {type(addr).__name__}")
    b = bytes(addr)
    if len(b) > wire.MAX_ADDR:
        raise ValueError(f"{what} longer than {wire.MAX_ADDR} bytes")
    return b


def _physical(physical: Iterable[tuple[str, int] | str]) -> Physical:
    return tuple(parse_router(p) for p in physical)


# --------------------------------------------------------------------------- channel


Key = tuple[str, bytes]
