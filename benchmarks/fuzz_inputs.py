"""The mutation fuzzer's hostile inputs (benchmarks/fuzz_router.py, ``scripts/fuzz``): valid
frames of each protocol built with the project's codecs, with hostile values (huge, NUL-heavy,
non-BMP, control-character names; raw NUL bytes that re-encode longer; group names at the
writeUTF limit), then mutated: bit flips, byte insertions and deletions, truncation, length
prefixes that lie, pipelined floods of one frame, partial frames left open, segment-by-segment
writes. And the corpus every run starts with.

Everything is drawn from the ``random.Random`` it is given: the same seed makes the same inputs.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol import native as wire
from gossiprouter.protocol.jgroups_address import V2, V5, JAddress

_RAW_NUL = "\x1a"  # placeholder for a raw NUL byte, replaced after encoding
_U32 = struct.Struct(">I")

PROTOCOLS = ("native", "jgroups2", "jgroups5")


# The hostile name classes of issue 12, each with the sizes tried (largest last).
_CLASSES: dict[int, tuple[str, tuple[int, ...]]] = {
    1: ("", (0,)),  # empty
    2: (_RAW_NUL, (1, 100, 40_000, 65_535)),  # raw NUL: 1 byte in, 2 (C0 80) written back
    3: ("\x00", (1, 32_767, 32_768)),  # NUL characters (C0 80 on the wire)
    4: ("g", (65_000, 65_530, 65_535, 65_536)),  # at the writeUTF limit, + a prefix = over
    5: ("\U0001f600", (1, 10_922, 16_384)),  # non-BMP: 4 bytes of UTF-8, 6 modified
    6: ("N", (1 << 16, 1 << 20, 3 << 20)),  # huge: only native can carry it
    7: ("evil\nINFO forged line\r\x1b[31mred\x1b[0m\x07", (1, 100)),  # log injection
    8: ("\ud800x\udfff", (1, 1000)),  # lone surrogates
}
HOSTILE_NAME_CLASSES = tuple(_CLASSES)


def hostile_name(k: int, size: int) -> str:
    unit, _ = _CLASSES[k]
    return unit * size


def _names(rng: random.Random, *, group: bool = False) -> str | None:
    """A hostile (or harmless) name: the classes above, random text, and plain names."""
    k = rng.randrange(14)
    if k in _CLASSES:
        return hostile_name(k, rng.choice(_CLASSES[k][1]))
    if k == 0:
        return None
    if k == 9:
        return "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randrange(1, 40))
                       ).encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    base = f"fz-{rng.randrange(8)}" if group else f"m-{rng.randrange(1000)}"
    if group and rng.random() < 0.3:
        base = f"honest-{rng.choice(PROTOCOLS)}"  # the honest members' groups
    return base


def _fuzz_addr(rng: random.Random, version: int) -> JAddress | None:
    if rng.random() < 0.1:
        return None
    if rng.random() < 0.2:
        return JAddress.from_ip("127.0.0.1", rng.randrange(65536), version=version)
    # Never the honest members' address space (see fuzz_router.py's _Member).
    return JAddress.from_uuid(rng.randrange(1 << 62), rng.randrange(1 << 62), version=version)


def _raw_nul(b: bytes) -> bytes:
    """Turn the placeholder into raw NUL bytes (valid for the decoder, longer when re-encoded)."""
    return b.replace(_RAW_NUL.encode(), b"\x00")


def _safe(build: Callable[..., bytes], *args: Any) -> bytes | None:
    """``build(*args)``: a frame the codec can encode, or None (a name too long for writeUTF,
    a lone surrogate for msgpack, ...)."""
    try:
        return _raw_nul(build(*args))
    except (ValueError, OverflowError, struct.error):
        return None
    except Exception as e:
        if type(e).__name__ == "ProtocolError":
            return None
        raise


def native_frames(rng: random.Random, token: str | None) -> tuple[bytes, list[bytes]]:
    """(handshake, frames): a valid native session with hostile values."""
    tok = token if token is None or rng.random() < 0.9 else "wrong-" + token
    client = _names(rng) or "fz"
    hello = wire.PREAMBLE + (_safe(wire.encode, wire.Hello((1,), client, tok))
                             or wire.encode(wire.Hello((1,), "fz", tok)))
    frames: list[bytes] = []
    for _ in range(rng.randrange(1, 6)):
        g = _names(rng, group=True) or "fz"
        addr = rng.randbytes(rng.choice([1, 8, 16, 255, 256]))
        k = rng.randrange(8)
        req = rng.randrange(1, 1 << 20)
        if k <= 2:
            phys = tuple((_names(rng) or "h", rng.randrange(65536))
                         for _ in range(rng.choice([0, 1, 3])))
            f = _safe(wire.encode, wire.Connect(req, g, addr, _names(rng), phys))
        elif k == 3:
            f = _safe(wire.encode, wire.GetMembers(req, g))
        elif k == 4:
            f = _safe(wire.encode, wire.Watch(req, g))
        elif k == 5:
            f = _safe(wire.encode_route, g, None if rng.random() < 0.5 else addr, addr,
                      rng.randbytes(rng.randrange(64)))
        elif k == 6:
            f = wire.encode(wire.Ping(rng.randrange(1 << 31)))
        else:
            f = _safe(wire.encode, wire.Disconnect(req, g, addr))
        if f is not None:
            frames.append(f)
    # After registering, ask for the members: the reply writes the names back.
    g = _names(rng, group=True) or "fz"
    q = _safe(wire.encode, wire.GetMembers(1, g))
    if q is not None:
        frames.append(q)
    return hello, frames


@dataclass(frozen=True)
class _JGroups:
    """How one JGroups protocol writes each kind of frame, drawing its hostile values from the
    fuzzer's ``rng`` (in a fixed order: a seed replays the same inputs)."""

    version: int
    join: Callable[[random.Random, str | None, JAddress | None], bytes | None]
    message: Callable[[random.Random, str | None, JAddress | None], bytes | None]
    keepalive: Callable[[], bytes]
    leave: Callable[[str | None, JAddress | None], bytes | None]
    query: Callable[[str | None], bytes | None]
    per_group: float  # how often the closing member query names the group (else: all groups)


def _j2_connect(rng: random.Random, group: str | None, addr: JAddress | None) -> bytes | None:
    phys = [JAddress.from_ip("127.0.0.1", rng.randrange(65536), version=V2)
            for _ in range(rng.choice([0, 1, 2]))]
    return _safe(j2.connect, group, addr, _names(rng), phys)


def _j2_message(rng: random.Random, group: str | None, addr: JAddress | None) -> bytes | None:
    return _safe(j2.message, group, addr if rng.random() < 0.5 else None,
                 rng.randbytes(rng.randrange(64)))


def _j5_register(rng: random.Random, group: str | None, addr: JAddress | None) -> bytes | None:
    return _safe(j5.register, group, addr, _names(rng), _fuzz_addr(rng, V5))


def _j5_message(rng: random.Random, group: str | None, addr: JAddress | None) -> bytes | None:
    dest = addr if rng.random() < 0.5 else None
    return _safe(j5.message, group, dest, _fuzz_addr(rng, V5), rng.randbytes(rng.randrange(64)))


_JGROUPS2 = _JGroups(V2, _j2_connect, _j2_message, j2.ping, partial(_safe, j2.disconnect),
                     partial(_safe, j2.gossip_get), per_group=0.8)
_JGROUPS5 = _JGroups(V5, _j5_register, _j5_message, j5.heartbeat,
                     partial(_safe, j5.unregister), partial(_safe, j5.get_members), per_group=0.6)


def _jgroups_frames(rng: random.Random, proto: _JGroups) -> tuple[bytes, list[bytes]]:
    """(handshake: none, frames): a valid JGroups session with hostile values."""
    frames: list[bytes] = []
    group = _names(rng, group=True)
    for _ in range(rng.randrange(1, 5)):
        k = rng.randrange(6)
        addr = _fuzz_addr(rng, proto.version)
        if k <= 1:
            f = proto.join(rng, group, addr)
        elif k == 2:
            f = proto.message(rng, group, addr)
        elif k == 3:
            f = proto.keepalive()
        elif k == 4:
            f = proto.leave(group, addr)
        else:
            f = proto.query(group)
        if f is not None:
            frames.append(f)
    # A member query afterwards: per group, or all groups (5.x: the reply prefixes each group).
    q = proto.query(group if rng.random() < proto.per_group else None)
    if q is not None:
        frames.append(q)
    return b"", frames


def jgroups2_frames(rng: random.Random) -> tuple[bytes, list[bytes]]:
    return _jgroups_frames(rng, _JGROUPS2)


def jgroups5_frames(rng: random.Random) -> tuple[bytes, list[bytes]]:
    return _jgroups_frames(rng, _JGROUPS5)


@dataclass
class Input:
    proto: str
    mutation: str
    chunks: list[bytes]  # written one after the other
    keep_open: bool = False  # leave the connection open (partial frames)
    pause: float = 0.0  # between chunks

    def describe(self) -> str:
        data = b"".join(self.chunks)
        return (f"{self.proto} {self.mutation}, {len(data):,} bytes in {len(self.chunks)} "
                f"writes, starts {data[:48].hex()}")


def _lie_length(rng: random.Random, data: bytearray, offsets: list[int]) -> None:
    """Overwrite one length field with a lie (small, huge, negative)."""
    if not offsets:
        return
    at = rng.choice(offsets)
    lie = rng.choice([0, 1, 5, 0x7FFF_FFFF, 0xFFFF_FFFF, 0x8000_0000, 0xFFFF_FFFB,
                      8 << 20, (8 << 20) + 1, 64 << 10, rng.randrange(1 << 32)])
    data[at:at + 4] = _U32.pack(lie)


def mutate(rng: random.Random, proto: str, head: bytes, frames: list[bytes]) -> Input:
    """Apply one mutation to a valid session (``head`` = the native preamble + HELLO)."""
    body = b"".join(frames)
    # Offsets of 4-byte length prefixes (native and 5.x frames start with one).
    offsets: list[int] = []
    if proto != "jgroups2":
        pos = len(head)
        if proto == "native" and head:
            offsets.append(len(wire.PREAMBLE))
        for f in frames:
            offsets.append(pos)
            pos += len(f)
    data = bytearray(head + body)
    m = rng.randrange(12)
    if m == 0:
        return Input(proto, "valid", [bytes(data)])
    if m == 1:
        for _ in range(rng.randrange(1, 9)):
            if data:
                i = rng.randrange(len(head) if head and rng.random() < 0.2 else len(data))
                data[i] ^= 1 << rng.randrange(8)
        return Input(proto, "bit flips", [bytes(data)])
    if m == 2:
        cut = rng.randrange(len(data) + 1)
        return Input(proto, "truncated", [bytes(data[:cut])], keep_open=rng.random() < 0.5)
    if m == 3:
        _lie_length(rng, data, offsets)
        return Input(proto, "length lie", [bytes(data)], keep_open=rng.random() < 0.5)
    if m == 4:
        for _ in range(rng.randrange(1, 5)):
            i = rng.randrange(len(data) + 1)
            if rng.random() < 0.5:
                data[i:i] = rng.randbytes(rng.randrange(1, 9))
            else:
                del data[i:i + rng.randrange(1, 9)]
        return Input(proto, "insert/delete", [bytes(data)])
    if m == 5:
        # A pipelined flood of one cheap request (PING / HEARTBEAT / GET_MEMBERS ...).
        one = rng.choice(frames) if frames else b""
        if len(one) > 4096:
            one = j2.ping() if proto == "jgroups2" else (
                j5.heartbeat() if proto == "jgroups5" else wire.encode(wire.Ping(1)))
        n = min(rng.choice([100, 1000, 20_000]), (2 << 20) // max(1, len(one)))
        return Input(proto, f"pipelined flood x{n}", [head + one * n])
    if m == 6:
        # Partial frame: a prefix that promises a lot more, left open.
        extra = b""
        if proto == "jgroups2":
            extra = bytes([j2.CONNECT]) + b"\x01" + b"\xff\xff" + b"x" * rng.randrange(60_000)
        else:
            n = rng.choice([64 << 10, 1 << 20, 8 << 20])
            extra = _U32.pack(n) + rng.randbytes(min(n - 1, rng.choice([10, 60_000, 1 << 20])))
        return Input(proto, "partial frame left open", [bytes(head) + extra], keep_open=True)
    if m == 7:
        # One byte per write: the decoders must resume anywhere.
        small = bytes(data[:2048])
        return Input(proto, "byte by byte", [small[i:i + 1] for i in range(len(small))])
    if m == 8:
        cuts = sorted(rng.randrange(len(data) + 1) for _ in range(rng.randrange(1, 6)))
        pieces = [bytes(data[a:b]) for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        return Input(proto, "split writes", [p for p in pieces if p], pause=0.002)
    if m == 9:
        # Frames of another protocol after this one's start.
        other = rng.choice([p for p in PROTOCOLS if p != proto])
        h2, f2 = (native_frames(rng, None) if other == "native" else
                  jgroups2_frames(rng) if other == "jgroups2" else jgroups5_frames(rng))
        return Input(proto, f"then {other} bytes", [bytes(data), h2 + b"".join(f2)])
    if m == 10:
        return Input(proto, "random bytes", [head + rng.randbytes(rng.randrange(1, 4096))])
    # Valid frames, but the connection is dropped without reading (RST).
    return Input(proto, "valid then reset", [bytes(data)])


def _corpus_frames(proto: str, k: int, group: str, name: str | None,
                   token: str | None) -> list[bytes] | None:
    """A registration of ``name`` in ``group`` and member queries, or None if the protocol
    cannot carry the value at all."""
    if proto == "native":
        hello = wire.PREAMBLE + wire.encode(wire.Hello((1,), "fz", token))
        reg = _safe(wire.encode, wire.Connect(1, group, b"c%d" % k, name, ()))
        query = [_safe(wire.encode, wire.GetMembers(2, group))]
    elif proto == "jgroups2":
        hello = b""
        addr = JAddress.from_uuid(0xC0 + k, 0xC0 + k, version=V2)
        reg = _safe(j2.connect, group, addr, name, [])
        query = [_safe(j2.gossip_get, group)]
    else:
        hello = b""
        addr = JAddress.from_uuid(0xC0 + k, 0xC0 + k, version=V5)
        reg = _safe(j5.register, group, addr, name, None)
        query = [_safe(j5.get_members, group), _safe(j5.get_members, None)]
    if reg is None:
        return None
    return [hello + reg, *(q for q in query if q is not None)]


def corpus(token: str | None) -> list[Input]:
    """The inputs every run starts with: each hostile name class, as a logical name and as a
    group name, registered on each protocol and then queried (per group, and for 5.x for all
    groups), unmutated, with the largest size the protocol can carry. So whatever the seed and
    however short the run, the classes of issue 12 item 1 (names accepted at registration
    that cannot be written back) are tried."""
    out: list[Input] = []
    for k, (_, sizes) in _CLASSES.items():
        for as_group in (False, True):
            for proto in PROTOCOLS:
                for size in sorted(sizes, reverse=True):
                    name = hostile_name(k, size)
                    if as_group and not name:
                        break  # an empty group name is plain invalid: the fuzzer has those
                    group = name if as_group else f"fz-corpus-{k}"
                    frames = _corpus_frames(proto, k, group, None if as_group else name,
                                            token)
                    if frames is not None:
                        out.append(Input(proto, f"corpus: name class {k} x{size}"
                                         + (" as group" if as_group else ""),
                                         [b"".join(frames)]))
                        break
    return out


def make_input(rng: random.Random, token: str | None) -> Input:
    proto = rng.choice(PROTOCOLS)
    if proto == "native":
        head, frames = native_frames(rng, token)
    elif proto == "jgroups2":
        head, frames = jgroups2_frames(rng)
    else:
        head, frames = jgroups5_frames(rng)
    return mutate(rng, proto, head, frames)
