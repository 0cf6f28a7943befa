"""What bench_vs_jgroups.py puts on each router: the cases, the bytes of each protocol the
loaders write and expect (the project's codecs encode them all in advance), and each Blaster
loader process's configuration.

Blaster (``benchmarks/jgroups/Blaster.java``) is protocol-agnostic: a member is its
registration bytes, the reply that says it is registered, and for a sender the frame it
writes; a receiver counts frames of the case's one delivered length and checks a few fixed
bytes of each.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol import native as wire
from gossiprouter.protocol.jgroups_address import V2, V5, JAddress

GROUP = "bench"
PAIRS = 4  # unicast cases: 4 sender -> receiver pairs
FANOUT_MEMBERS = 8  # fan-out: a group of 8 ...
FANOUT_SENDERS = 2  # ... with 2 senders
IDLE_BASE = 1000  # member indexes of idle connections start here

Kind = Literal["unicast", "fanout", "paced", "idle"]


@dataclass(frozen=True)
class Case:
    name: str
    kind: Kind
    size: int  # payload bytes
    rate: int = 0  # total messages/s for paced load; 0 = flood
    idle: int = 0  # idle registered connections besides the active members

    @property
    def title(self) -> str:
        if self.kind == "unicast":
            return f"unicast {PAIRS} pairs, {self.size} B"
        if self.kind == "fanout" and self.rate:
            return (f"fan-out 1→{FANOUT_MEMBERS - 1}, {FANOUT_SENDERS} senders, "
                    f"{self.rate * (FANOUT_MEMBERS - 1):,} deliveries/s, {self.size} B")
        if self.kind == "fanout":
            return f"fan-out 1→{FANOUT_MEMBERS - 1}, {FANOUT_SENDERS} senders, {self.size} B"
        if self.kind == "paced":
            return f"paced {self.rate:,} msg/s, {self.size} B"
        return f"{self.idle:,} idle + {self.rate:,} msg/s, {self.size} B"


CASES = (
    Case("unicast-100", "unicast", 100),
    Case("unicast-1000", "unicast", 1000),
    Case("fanout-100", "fanout", 100),
    Case("fanout-1000", "fanout", 1000),
    Case("paced-100", "paced", 100, rate=10_000),
    # Medium-load fan-out (issue 16's second row): 2 senders x 1,144 msg/s into a group of 8,
    # 16,016 deliveries/s; several messages of one wake-up may go to the same receiver.
    Case("fanout-paced", "fanout", 100, rate=2_288),
    Case("idle-5000", "idle", 100, rate=1_000, idle=5_000),
    Case("idle-10000", "idle", 100, rate=1_000, idle=10_000),
)


# --------------------------------------------------------------------------- protocols


class Proto(Protocol):
    def register(self, i: int) -> tuple[bytes, int, bytes]:
        """Registration bytes of member i, reply frames to skip, and the exact reply expected."""

    def send_frame(self, sender: int, dest: int | None, payload: bytes) -> bytes:
        """A message as the sender writes it (dest None = multicast)."""

    def recv_frame(self, sender: int, dest: int | None, payload: bytes) -> bytes:
        """The same message as the router delivers it."""

    def count_members(self, port: int) -> int:
        """How many members the router lists for the group."""


def _uuid_bits(i: int) -> tuple[int, int]:
    return 0x6272_0000_0000_0000 + i, 0x4A47_0000_0000_0000 + i


def _ask(port: int, request: bytes, answer: Callable[[bytes], int | None], what: str) -> int:
    """Send ``request`` on a new connection to the router on ``port``, then feed what comes
    back to ``answer`` until it returns the count (30 s at most)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            data = s.recv(1 << 20)
            if not data:
                raise RuntimeError(f"router closed the {what} connection")
            if (n := answer(data)) is not None:
                return n
        raise TimeoutError(f"no {what} reply")


class JGroups212:
    """JGroups 2.12 GossipData: what TUNNEL / RouterStub 2.12 send."""

    def _addr(self, i: int) -> JAddress:
        msb, lsb = _uuid_bits(i)
        return JAddress.from_uuid(msb, lsb, version=V2)

    def register(self, i: int) -> tuple[bytes, int, bytes]:
        phys = JAddress.from_ip("127.0.0.1", 10000 + i % 50000, version=V2)
        return j2.connect(GROUP, self._addr(i), f"m{i}", [phys]), 0, j2.connect_ok()

    def send_frame(self, sender: int, dest: int | None, payload: bytes) -> bytes:
        return j2.message(GROUP, None if dest is None else self._addr(dest), payload)

    def recv_frame(self, sender: int, dest: int | None, payload: bytes) -> bytes:
        return j2.message_to_client(None if dest is None else self._addr(dest), payload)

    def count_members(self, port: int) -> int:
        dec = j2.ClientDecoder(max_frame=64 << 20)
        dec.expect_members_reply()

        def answer(data: bytes) -> int | None:
            dec.feed(data)
            ev = dec.next_event()
            return len(ev.members) if isinstance(ev, j2.MembersReply) else None

        return _ask(port, j2.gossip_get(GROUP), answer, "GOSSIP_GET")


class Native:
    """gossiprouter's native protocol (docs/protocol.md); also the C floor's (benchmarks/floor/
    relay.c), which relays the same ROUTE frames byte for byte but answers no GET_MEMBERS, so
    count_members is for gossiprouter only."""

    def _addr(self, i: int) -> bytes:
        return struct.pack(">QQ", *_uuid_bits(i))

    def register(self, i: int) -> tuple[bytes, int, bytes]:
        reg = (wire.PREAMBLE + wire.encode(wire.Hello((1,), "bench-vs-jgroups"))
               + wire.encode(wire.Connect(1, GROUP, self._addr(i), f"m{i}",
                                          (("127.0.0.1", 10000 + i % 50000),))))
        return reg, 1, wire.encode(wire.Ok(1, None))  # skip WELCOME, then OK

    def send_frame(self, sender: int, dest: int | None, payload: bytes) -> bytes:
        return wire.encode_route(GROUP, None if dest is None else self._addr(dest),
                                 self._addr(sender), payload)

    def recv_frame(self, sender: int, dest: int | None, payload: bytes) -> bytes:
        return self.send_frame(sender, dest, payload)  # forwarded byte for byte

    def count_members(self, port: int) -> int:
        dec = wire.Decoder(max_frame=64 << 20)

        def answer(data: bytes) -> int | None:
            dec.feed(data)
            for f in dec.frames():
                if isinstance(f, wire.Ok) and f.req == 7:
                    return len(f.members or ())
                if isinstance(f, wire.Error):
                    raise RuntimeError(f"GET_MEMBERS: {f}")
            return None

        return _ask(port, wire.PREAMBLE + wire.encode(wire.Hello((1,), "bench-check"))
                    + wire.encode(wire.GetMembers(7, GROUP)), answer, "GET_MEMBERS")


class JGroups5:
    """JGroups 3.6.5+ / 4.x / 5.x GossipData: what TUNNEL / RouterStub 5.x send.

    REGISTER has no reply in 5.x, so registration is REGISTER followed by a HEARTBEAT on the
    same connection: the router answers the HEARTBEAT only after it has handled the REGISTER,
    which makes the echoed HEARTBEAT the exact reply that says "registered".
    """

    def _addr(self, i: int) -> JAddress:
        msb, lsb = _uuid_bits(i)
        return JAddress.from_uuid(msb, lsb, version=V5)

    def register(self, i: int) -> tuple[bytes, int, bytes]:
        phys = JAddress.from_ip("127.0.0.1", 10000 + i % 50000, version=V5)
        reg = j5.register(GROUP, self._addr(i), f"m{i}", phys) + j5.heartbeat()
        return reg, 0, j5.heartbeat()

    def send_frame(self, sender: int, dest: int | None, payload: bytes) -> bytes:
        return j5.message(GROUP, None if dest is None else self._addr(dest), self._addr(sender),
                          payload)

    def recv_frame(self, sender: int, dest: int | None, payload: bytes) -> bytes:
        return self.send_frame(sender, dest, payload)  # forwarded byte for byte

    def count_members(self, port: int) -> int:
        dec = j5.Decoder(max_frame=64 << 20)
        seen = 0

        def answer(data: bytes) -> int | None:
            nonlocal seen
            dec.feed(data)
            while (ev := dec.next_event()) is not None:
                if isinstance(ev, j5.MembersReply):
                    # Clients before 5.4.4 get one reply; newer ones may get several,
                    # the last one flagged.
                    seen += len(ev.members)
                    if ev.last or ev.group is not None:
                        return seen
            return None

        return _ask(port, j5.get_members(GROUP), answer, "GET_MBRS")


# --------------------------------------------------------------------------- loader configs


@dataclass(frozen=True)
class Member:
    index: int  # address number
    sender_id: int | None  # set for senders (the id byte in their payload)
    dest: int | None  # unicast destination; None = multicast (senders only)
    rate: int  # messages/s, 0 = flood


def layout(case: Case) -> list[Member]:
    """The active members of a case, senders first."""
    if case.kind == "fanout":
        senders = [Member(k, k, None, case.rate // FANOUT_SENDERS) for k in range(FANOUT_SENDERS)]
        receivers = [Member(k, None, None, 0) for k in range(FANOUT_SENDERS, FANOUT_MEMBERS)]
        return senders + receivers
    per_sender = case.rate // PAIRS
    out = []
    for p in range(PAIRS):
        out.append(Member(2 * p, p, 2 * p + 1, per_sender))
        out.append(Member(2 * p + 1, None, None, 0))
    return out


def payload(size: int, sender_id: int) -> bytes:
    """Payload: 8-byte timestamp slot (filled by a paced sender), the sender-id byte, zeros."""
    p = bytearray(size)
    p[8] = sender_id
    return bytes(p)


def loader_configs(case: Case, proto: Proto, port: int, nloaders: int,
                   deadline: float) -> list[list[str]]:
    """Config lines of each loader process."""
    members = layout(case)
    senders = [m for m in members if m.sender_id is not None]
    # What each sender sends, and what the router delivers for it (one length for the case).
    sent = {m.index: proto.send_frame(m.index, m.dest, payload(case.size, m.sender_id or 0))
            for m in senders}
    delivered = [proto.recv_frame(m.index, m.dest, payload(case.size, m.sender_id or 0))
                 for m in senders]
    rlen = len(delivered[0])
    if any(len(f) != rlen for f in delivered):
        raise AssertionError("delivered frames of one case must have one length")
    pay_off = rlen - case.size  # the payload is the last field in both protocols
    timed = case.rate > 0
    # The checked prefix: what every delivered frame shares, short of a paced sender's stamp.
    limit = min(16, rlen, pay_off if timed else rlen)
    common = 0
    while common < limit and len({f[common] for f in delivered}) == 1:
        common += 1
    check = delivered[0][:max(common, 1)].hex()
    configs: list[list[str]] = [
        [f"port {port}", f"deadline {deadline:.0f}", "connect_threads 4"] for _ in range(nloaders)
    ]
    # Pairs stay together in one loader (so sender and receiver share a JVM and a clock).
    for k, m in enumerate(members):
        slot = (k // 2) % nloaders if case.kind != "fanout" else k % nloaders
        reg, skip, ok = proto.register(m.index)
        words = [f"member reg={reg.hex()} skip={skip} ok={ok.hex()}", f"rlen={rlen}",
                 f"check={check}", f"idoff={pay_off + 8}",
                 f"self={255 if m.sender_id is None else m.sender_id}",
                 f"tsoff={pay_off if timed else -1}"]
        if m.sender_id is not None:
            frame = sent[m.index]
            words += [f"send={frame.hex()}", f"rate={m.rate}",
                      f"stsoff={len(frame) - case.size if timed else -1}"]
        configs[slot].append(" ".join(words))
    for n in range(case.idle):
        reg, skip, ok = proto.register(IDLE_BASE + n)
        configs[n % nloaders].append(f"idle reg={reg.hex()} skip={skip} ok={ok.hex()}")
    return configs
