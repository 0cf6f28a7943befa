"""JGroups addresses (``Util.writeAddress``) for both wire versions, sans-IO.

* :class:`JAddress`: the address model. ``key`` is the routing identity (what JGroups' ``equals``
  compares), ``raw`` the exact ``writeAddress`` bytes as received so that the router can re-emit
  subclasses it does not fully model (ExtendedUUID, SiteUUID, TopologyUUID, ...) byte for byte.
* :func:`read_address` / :func:`read_addresses` / :func:`write_address` /
  :func:`write_addresses` for both wire versions (``version=2`` for 2.12, ``version=5`` for
  3.6.5+ including 5.x), over the :class:`~gossiprouter.protocol.jgroups_reader.Reader`; an
  address that is not valid input raises :class:`~gossiprouter.protocol.errors.ProtocolError`.
"""

from __future__ import annotations

import enum
import ipaddress
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.jgroups_reader import Buffer, NeedMore, Reader

__all__ = [
    "V2",
    "V5",
    "AddressKind",
    "JAddress",
    "read_address",
    "read_addresses",
    "write_address",
    "write_addresses",
]

#: Wire versions understood by the address functions.
V2 = 2  # JGroups 2.x up to 3.6.4: UUID/IpAddress carry a trailing additional_data boolean
V5 = 5  # JGroups 3.6.5+ (and 4.x, 5.x)

_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_Q2 = struct.Struct(">qq")


class AddressKind(enum.Enum):
    """Which JGroups class an address was written as."""

    UUID = "UUID"
    IP = "IpAddress"
    # 2.12 subclasses of UUID
    PAYLOAD_UUID = "PayloadUUID"
    ADDITIONAL_DATA_UUID = "AdditionalDataUUID"
    TOPOLOGY_UUID = "TopologyUUID"
    # 5.x subclasses of UUID
    FLAGS_UUID = "FlagsUUID"
    EXTENDED_UUID = "ExtendedUUID"
    SITE_UUID = "SiteUUID"
    SITE_MASTER = "SiteMaster"
    MILLIS = "MillisAddress"


# Address.java flag bits, per version.
_NULL = 0x01
_UUID_ADDR = 0x02
_IP_ADDR_V2 = 0x04
_SITE_UUID_V5 = 0x04
_SITE_MASTER_V5 = 0x08
_IP_ADDR_V5 = 0x10
_OTHER = 0x00

# ClassConfigurator magic numbers (conf/jg-magic-map.xml of each tag).
_MAGIC_V2 = {
    1: AddressKind.IP,
    68: AddressKind.UUID,
    82: AddressKind.PAYLOAD_UUID,
    83: AddressKind.ADDITIONAL_DATA_UUID,
    84: AddressKind.TOPOLOGY_UUID,
}
_MAGIC_V5 = {
    1: AddressKind.IP,
    11: AddressKind.UUID,
    12: AddressKind.EXTENDED_UUID,
    13: AddressKind.SITE_UUID,
    14: AddressKind.SITE_MASTER,
    19: AddressKind.FLAGS_UUID,
    22: AddressKind.MILLIS,
}

_IP_PREFIX = b"ip:"
_MILLIS_PREFIX = b"ms:"
_SITE_MASTER_TAG = b"sm"

# Per wire version: the address classes written with their own flag value (besides the UUID of
# the hot path, and _OTHER: a magic number follows), and the magic numbers.
_KINDS: dict[int, tuple[dict[int, AddressKind], dict[int, AddressKind]]] = {
    V2: ({_IP_ADDR_V2: AddressKind.IP}, _MAGIC_V2),
    V5: ({_IP_ADDR_V5: AddressKind.IP, _SITE_UUID_V5: AddressKind.SITE_UUID,
          _SITE_MASTER_V5: AddressKind.SITE_MASTER}, _MAGIC_V5),
}


@dataclass(frozen=True, slots=True, repr=False)
class JAddress:
    """One JGroups address as it travels on the wire.

    * ``key``: routing identity, equal for addresses JGroups considers equal. UUID family:
      the 16 bytes msb‖lsb (so an ExtendedUUID equals the plain UUID with the same bits, as in
      JGroups). SiteMaster additionally appends its site, since JGroups compares the site too
      and every SiteMaster has the bits 0/0. IpAddress: ``b"ip:"`` + packed IP + u16 port
      (the IPv6 scope id is not part of it, as in ``Inet6Address.equals``). MillisAddress:
      ``b"ms:"`` + the 8-byte value. Different kinds never produce equal keys.
    * ``raw``: the exact ``writeAddress`` bytes (flag byte included) as received or built.
    * ``version``: the wire version ``raw`` belongs to (2 or 5); the encodings differ.

    Use ``key`` (not the object) as the identity in routing tables.
    """

    key: bytes
    raw: bytes
    kind: AddressKind
    version: int

    # ----------------------------------------------------------------- constructors

    @classmethod
    def from_uuid(cls, msb: int, lsb: int, *, version: int) -> JAddress:
        """A plain ``org.jgroups.util.UUID`` (2.12: with the ``00`` additional_data trailer)."""
        _check_version(version)
        if not (-(1 << 63) <= msb < (1 << 64) and -(1 << 63) <= lsb < (1 << 64)):
            raise ValueError("msb/lsb must fit in 64 bits (signed or unsigned)")
        key = _Q2.pack(_signed64(msb), _signed64(lsb))
        body = key[8:] + key[:8]  # the wire order is lsb, msb
        raw = b"\x02" + body + (b"\x00" if version == V2 else b"")
        return cls(key, raw, AddressKind.UUID, version)

    @classmethod
    def from_uuid_obj(cls, u: uuid.UUID, *, version: int) -> JAddress:
        """A plain UUID address from a :class:`uuid.UUID`."""
        return cls.from_uuid(u.int >> 64, u.int & 0xFFFF_FFFF_FFFF_FFFF, version=version)

    @classmethod
    def from_ip(cls, host: str, port: int, *, version: int, scope_id: int = 0) -> JAddress:
        """An ``IpAddress`` (IPv4 or IPv6; the IPv6 scope id as an int, or a ``%N`` suffix)."""
        _check_version(version)
        if not 0 <= port <= 0xFFFF:
            raise ValueError(f"port out of range: {port}")
        if "%" in host:
            host, _, scope = host.partition("%")
            scope_id = int(scope)
        if not -(1 << 31) <= scope_id < (1 << 32):
            raise ValueError(f"scope id out of range: {scope_id}")
        ip = ipaddress.ip_address(host)
        packed = ip.packed
        body = bytes([len(packed)]) + packed
        if ip.version == 6:
            body += _I32.pack(_signed32(scope_id))
        body += _U16.pack(port)
        if version == V2:
            raw = bytes([_IP_ADDR_V2]) + body + b"\x00"
        else:
            raw = bytes([_IP_ADDR_V5]) + body
        return cls(_IP_PREFIX + packed + _U16.pack(port), raw, AddressKind.IP, version)

    @classmethod
    def parse(cls, raw: Buffer, *, version: int) -> JAddress | None:
        """Parse exactly one ``writeAddress`` encoding (``None`` for the null address)."""
        r = Reader(raw)
        try:
            addr = read_address(r, version)
        except NeedMore:
            raise ProtocolError("truncated address") from None
        if r.remaining():
            raise ProtocolError(f"{r.remaining()} bytes after the address")
        return addr

    # ----------------------------------------------------------------- views

    @property
    def is_uuid(self) -> bool:
        """True for the UUID family (UUID and every subclass)."""
        return self.kind not in (AddressKind.IP, AddressKind.MILLIS)

    @property
    def uuid(self) -> uuid.UUID | None:
        """The msb/lsb bits as a :class:`uuid.UUID`, for the UUID family."""
        if not self.is_uuid:
            return None
        return uuid.UUID(bytes=self.key[:16])

    @property
    def host_port(self) -> tuple[str, int] | None:
        """``(host, port)`` of an IpAddress (``host`` is ``""`` for a null IP); else None."""
        if self.kind is not AddressKind.IP:
            return None
        packed = self.key[3:-2]
        port = _U16.unpack(self.key[-2:])[0]
        if not packed:
            return ("", port)
        host = str(ipaddress.ip_address(packed))
        if len(packed) == 16:
            scope = self._ipv6_scope()
            if scope:
                host = f"{host}%{scope}"
        return (host, port)

    def _ipv6_scope(self) -> int:
        # raw is: flags [short magic if flags == 0] len(16) address(16) scope(4) port ...
        body = 3 if self.raw[0] == _OTHER else 1
        return int(_I32.unpack_from(self.raw, body + 17)[0])

    def __repr__(self) -> str:
        return f"JAddress({self}, {self.kind.value}, v{self.version}, raw={self.raw.hex()})"

    def __str__(self) -> str:
        if self.kind is AddressKind.IP:
            hp = self.host_port
            assert hp is not None
            host, port = hp
            if ":" in host:
                return f"[{host}]:{port}"
            return f"{host or '<null>'}:{port}"
        if self.kind is AddressKind.MILLIS:
            return str(_I64.unpack(self.key[3:])[0])
        if self.kind is AddressKind.SITE_MASTER:
            site = _site_of(self.key[18:])
            return f"SiteMaster({site if site is not None else '<all sites>'})"
        return str(uuid.UUID(bytes=self.key[:16]))


def _check_version(version: int) -> None:
    if version not in (V2, V5):
        raise ValueError(f"unknown wire version {version}")


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= (1 << 63) else v


def _signed32(v: int) -> int:
    return v - (1 << 32) if v >= (1 << 31) else v


def _site_of(tagged: bytes) -> str | None:
    r = Reader(tagged)
    return r.string()


def _read_uuid_key(r: Reader) -> bytes:
    """lsb, msb on the wire; the key is msb‖lsb."""
    start = r.pos
    r.skip(16)
    body = r.slice(start, start + 16)
    return body[8:] + body[:8]


def _read_uuid_v2(r: Reader) -> bytes:
    key = _read_uuid_key(r)
    if r.boolean():  # additional_data
        r.skip(r.u16())
    return key


def _read_ip(r: Reader, version: int) -> bytes:
    n = r.u8()
    if n not in (0, 4, 16):
        raise ProtocolError(f"bad IP address length {n}")
    packed = r.take(n)
    if n == 16:
        r.skip(4)  # scope id: kept in raw, not part of the identity
    port = r.take(2)
    if version == V2 and r.boolean():  # additional_data
        r.skip(r.u16())
    return _IP_PREFIX + packed + port


def _read_extended_v5(r: Reader) -> None:
    """The FlagsUUID flags and the ExtendedUUID key/value table that follow the UUID bits."""
    r.int_compressed()
    for _ in range(r.u8()):
        r.skip(r.u8())
        r.skip(r.u8())


def _read_body(r: Reader, kind: AddressKind, version: int) -> bytes:
    """Read the ``writeTo`` body of ``kind``; return the key."""
    if kind is AddressKind.IP:
        return _read_ip(r, version)
    if version == V2:
        key = _read_uuid_v2(r)
        if kind is AddressKind.PAYLOAD_UUID:
            r.string()
        elif kind is AddressKind.ADDITIONAL_DATA_UUID:
            if r.presence("byte buffer"):
                n = r.i32()
                if n < 0:
                    raise ProtocolError(f"negative byte buffer length {n}")
                r.skip(n)
        elif kind is AddressKind.TOPOLOGY_UUID:
            r.string()
            r.string()
            r.string()
        return key
    if kind is AddressKind.MILLIS:
        return _MILLIS_PREFIX + r.take(8)
    key = _read_uuid_key(r)
    if kind is AddressKind.UUID:
        return key
    if kind is AddressKind.FLAGS_UUID:
        r.int_compressed()
        return key
    _read_extended_v5(r)
    if kind in (AddressKind.SITE_UUID, AddressKind.SITE_MASTER):
        site_start = r.pos
        r.string()  # site
        site_end = r.pos
        r.string()  # name
        if kind is AddressKind.SITE_MASTER:
            return key + _SITE_MASTER_TAG + r.slice(site_start, site_end)
    return key


# Plain-UUID addresses by raw bytes (17 bytes for 5.x, 18 for 2.12: never confused). JAddress is
# immutable, so sharing instances is safe; clearing when full bounds the memory.
_interned: dict[bytes, JAddress] = {}
_INTERN_MAX = 65536


def read_address(r: Reader, version: int) -> JAddress | None:
    """``Util.readAddress`` for wire ``version`` (2 or 5); ``None`` for the null address.

    Flags are matched exactly (JGroups tests single bits, but its writers only ever produce these
    values); an unknown flag value or magic number is a ProtocolError, because the length of the
    body is then unknown.
    """
    start = r.pos
    flags = r.u8()
    if flags == _NULL:
        return None
    if flags == _UUID_ADDR:
        # The hot path (every MESSAGE has one or two): plain UUIDs are interned, so a known
        # address costs one 17/18-byte copy and a dict lookup.
        if version == V2:
            r.skip(16)
            if r.boolean():  # additional_data: rare, not interned
                r.skip(r.u16())
                raw = r.slice(start, r.pos)
                return JAddress(raw[9:17] + raw[1:9], raw, AddressKind.UUID, V2)
        else:
            r.skip(16)
        raw = r.slice(start, r.pos)
        addr = _interned.get(raw)
        if addr is None:
            if len(_interned) >= _INTERN_MAX:
                _interned.clear()
            addr = _interned[raw] = JAddress(raw[9:17] + raw[1:9], raw, AddressKind.UUID, version)
        return addr
    tables = _KINDS.get(version)
    if tables is None:
        raise ValueError(f"unknown wire version {version}")
    by_flags, by_magic = tables
    if flags == _OTHER:
        kind = _magic(r, by_magic)
    else:
        found = by_flags.get(flags)
        if found is None:
            raise ProtocolError(f"bad address flags {flags:#04x}")
        kind = found
    key = _read_body(r, kind, version)
    return JAddress(key, r.slice(start, r.pos), kind, version)


def _magic(r: Reader, table: dict[int, AddressKind]) -> AddressKind:
    magic = r.i16()
    kind = table.get(magic)
    if kind is None:
        raise ProtocolError(f"unknown address class (magic number {magic})")
    return kind


def read_addresses(r: Reader, version: int) -> tuple[JAddress, ...] | None:
    """``Util.readAddresses``: short count (negative = null), then count addresses.

    Null entries inside the list (never written by JGroups' own callers) are dropped.
    """
    n = r.i16()
    if n < 0:
        return None
    out: list[JAddress] = []
    for _ in range(n):
        a = read_address(r, version)
        if a is not None:
            out.append(a)
    return tuple(out)


def write_address(addr: JAddress | None, version: int | None = None) -> bytes:
    """``Util.writeAddress``: the address's raw bytes, or ``01`` for null.

    With ``version``, an address encoded for another wire version is refused (ValueError): the
    encoders of one codec must not emit the other's bytes.
    """
    if addr is None:
        return b"\x01"
    if version is not None and addr.version != version:
        raise ValueError(
            f"address {addr} is encoded for wire version {addr.version}, not {version}")
    return addr.raw


def write_addresses(addrs: Sequence[JAddress] | None, version: int | None = None) -> bytes:
    """``Util.writeAddresses``: short count (``FFFF`` for null), then the addresses (each
    checked against ``version`` as :func:`write_address` does)."""
    if addrs is None:
        return b"\xff\xff"
    parts = [write_address(a, version) for a in addrs]
    if len(parts) > 0x7FFF:
        raise ProtocolError(f"too many addresses for one list: {len(parts)}")
    return _I16.pack(len(parts)) + b"".join(parts)
