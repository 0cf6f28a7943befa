"""The check of routed frames from another router, before any byte reaches a client socket
(docs/federation.md, "What the routers check themselves").

A routed message carries frames in the wire form of the receiving members' protocol (the
group's family: native, ``jgroups2:``, ``jgroups5:``), which the receiving router queues
byte-exact. The broker is not trusted with them: a frame that does not parse, or parses as
something else, would desynchronise a member's stream for good. So every routed message is
read here as the receiver's protocol would read it, as a local connection's frames are:

* whole frames only, exactly ``count`` of them, and nothing after the last one;
* each within ``max_frame``;
* each a message (native ROUTE of this group, 5.x MESSAGE of this group, 2.12 MESSAGE), no
  control frame;
* sent by a member that the sending router carries in the group (``senders``). JGroups 2.12
  messages as re-wrapped for receivers carry no sender (it is inside the JGroups message),
  so for them only the first three checks apply.

Sans-IO: bytes in, a reason out (None: accepted). The native check's scanner is kept per
``max_frame`` (:func:`_scanner`): a scanner holds no state between calls but its ROUTE header
cache, so a group's header is parsed and checked once, not once per routed message (building
the scanner and learning the header were most of the check's cost, issue 30).
"""

from __future__ import annotations

from collections.abc import Callable, Container
from functools import lru_cache

from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.jgroups5_scan import Route as J5Route
from gossiprouter.protocol.jgroups5_scan import Scanner as J5Scanner
from gossiprouter.protocol.native_scan import RUN, NativeScanner


def check_routed(group: str, frames: bytes, count: int, max_frame: int,
                 senders: Container[bytes]) -> str | None:
    """Why the routed ``frames`` (``count`` of them) for ``group`` must not be delivered, or
    None when they are whole, valid frames of the group's protocol from ``senders``."""
    try:
        if group.startswith("jgroups5:"):
            return _check_j5(group, frames, count, max_frame, senders)
        if group.startswith("jgroups2:"):
            return _check_j2(frames, count, max_frame)
        return _check_native(group, frames, count, max_frame, senders)
    except ProtocolError as e:
        return str(e)


def _check_native(group: str, frames: bytes, count: int, max_frame: int,
                  senders: Container[bytes]) -> str | None:
    n = 0
    end = 0
    for kind, _start, stop, k, head in _scanner(max_frame).scan(frames):
        if kind != RUN:
            return "not whole native ROUTE frames within max_frame"
        assert isinstance(head, tuple)
        g, _dest, sender = head
        if g != group:
            return f"a ROUTE of group {g!r}"
        if sender not in senders:
            return f"sender {sender.hex()} is not carried by the sending router"
        n += k
        end = stop
    if end != len(frames) or n != count:
        return f"{n} whole frames in {len(frames)} bytes, {count} announced"
    return None


def route_header(frames: bytes, max_frame: int) -> bytes | None:
    """The exact ROUTE header of the native ``frames`` :func:`check_routed` just accepted (the
    relay thread's key for the next ones: server/broker_link.py), or None."""
    return _scanner(max_frame).header(frames, 4)


def j5_header(frames: bytes, max_frame: int) -> bytes | None:
    """The exact MESSAGE header (after the length prefix, up to the payload's length) of the
    5.x ``frames`` :func:`check_routed` just accepted, when every frame has it (the relay
    thread's key for the next ones), or None."""
    runs: list[tuple[bytes, int]] = []

    def run(head: J5Route, data: bytes, count: int) -> bool:
        runs.append((head[4], len(data)))
        return False

    for _other in _j5_scanner(max_frame).scan(frames, run):
        return None
    return runs[0][0] if len(runs) == 1 and runs[0][1] == len(frames) else None


@lru_cache(maxsize=4)
def _j5_scanner(max_frame: int) -> J5Scanner:
    """A 5.x scanner for :func:`j5_header` (its header cache lasts; the prefix names no table
    group here)."""
    return J5Scanner("", max_frame)


@lru_cache(maxsize=4)
def _scanner(max_frame: int) -> NativeScanner:
    """The relaying scanner of routed native frames within ``max_frame`` (one per bound:
    its header cache lasts across routed messages)."""
    return NativeScanner(max_frame, relay=True)


def _check_j5(group: str, frames: bytes, count: int, max_frame: int,
              senders: Container[bytes]) -> str | None:
    name = group[len("jgroups5:"):]

    def why(ev: object) -> str | None:
        if getattr(ev, "group", None) != name:  # (its cluster name, which members check)
            return f"a MESSAGE of group {getattr(ev, 'group', None)!r}"
        s = getattr(ev, "sender", None)
        return None if s is not None and s.key in senders else (
            "sender not carried by the sending router")

    return _check_stream(j5.Decoder(max_frame), j5.Message, frames, count, why)


def _check_j2(frames: bytes, count: int, max_frame: int) -> str | None:
    return _check_stream(j2.ClientDecoder(max_frame), j2.Message, frames, count,
                         lambda ev: None)


def _check_stream(dec: j5.Decoder | j2.ClientDecoder, message: type, frames: bytes,
                  count: int, why: Callable[[object], str | None]) -> str | None:
    """``count`` whole messages of ``dec``'s protocol that ``why`` finds nothing against, and
    nothing after them."""
    dec.feed(frames)
    n = 0
    while (ev := dec.next_event()) is not None:
        if not isinstance(ev, message):
            return f"a {type(ev).__name__}, not a MESSAGE"
        bad = why(ev)
        if bad is not None:
            return bad
        n += 1
    if dec.buffered or n != count:
        return f"{n} whole frames, {dec.buffered} bytes left, {count} announced"
    return None
