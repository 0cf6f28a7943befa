"""Addresses as people type and read them: ``HOST:PORT`` and member addresses.

The only place that parses and formats them, so that what one part prints another
reads back: the command-line tools, the config file (``metrics``, provisioned members)
and the stub all call in here.

* ``HOST:PORT``: an IPv6 host goes in brackets, ``[::1]:12001``, both when read and when
  printed (an unbracketed ``::1:12001`` is ambiguous and refused).
* A member address is bytes (at most :data:`~gossiprouter.protocol.native_frames.MAX_ADDR`). It is
  written ``hex:`` followed by hex digits, or as plain text meaning its UTF-8 bytes.
  :func:`format_addr` prints plain text only when that text reads back as the same bytes
  and needs no quoting in a shell, so a printed address pastes straight into
  ``gossiprouter send --to``.
"""

from __future__ import annotations

from gossiprouter.protocol.native_frames import MAX_ADDR, MAX_GROUP

__all__ = [
    "HostPort",
    "format_addr",
    "format_hostport",
    "parse_addr",
    "parse_group",
    "parse_hostport",
    "parse_hostports",
]

HostPort = tuple[str, int]

HEX_PREFIX = "hex:"
# Characters a shell passes through unquoted (besides letters and digits of any script).
_PLAIN = frozenset("-_.:@/+=%,")


def parse_hostport(value: str, *, allow_zero: bool = False) -> HostPort:
    """``host:port`` or ``[v6]:port`` -> ``(host, port)``; ValueError says what was expected.

    ``allow_zero`` admits port 0 (listen on any free port: tests and the metrics port).
    """
    low = 0 if allow_zero else 1
    expected = f"expected HOST:PORT with a port from {low} to 65535 (IPv6: [::1]:12001)"
    if not isinstance(value, str):
        raise ValueError(expected)
    host, sep, port_s = value.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not host:
            raise ValueError(expected)
    elif "[" in host or "]" in host:
        raise ValueError(expected)
    elif ":" in host:
        raise ValueError(f"an IPv6 address goes in brackets, e.g. [{host}]:{port_s}")
    if not sep or not host or not port_s.isdigit() or not low <= int(port_s) <= 65535:
        raise ValueError(expected)
    return host, int(port_s)


def parse_hostports(value: str) -> list[HostPort]:
    """Several ``HOST:PORT`` separated by commas (at least one)."""
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not parts:
        raise ValueError("expected HOST:PORT (several separated by commas)")
    return [parse_hostport(p) for p in parts]


def format_hostport(host: str, port: int) -> str:
    """The inverse of :func:`parse_hostport`: IPv6 hosts in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_addr(value: str) -> bytes:
    """``hex:0a0b...`` -> those bytes; anything else -> its UTF-8 bytes.

    ValueError (saying what was expected) for bad hex, an empty address, or one longer than
    the protocol's :data:`MAX_ADDR` bytes.
    """
    if not isinstance(value, str):
        raise ValueError(f"expected text or {HEX_PREFIX} and hex digits")
    if value.startswith(HEX_PREFIX):
        try:
            b = bytes.fromhex(value[len(HEX_PREFIX):])
        except ValueError:
            raise ValueError(f"expected hex digits after '{HEX_PREFIX}'") from None
    else:
        b = value.encode()
    if not b:
        raise ValueError("an address must not be empty")
    if len(b) > MAX_ADDR:
        raise ValueError(f"an address is at most {MAX_ADDR} bytes")
    return b


def format_addr(addr: bytes) -> str:
    """How a member address is shown: text when it reads back as these bytes and pastes
    into a shell unquoted (``node-a``), otherwise ``hex:...``. Always
    ``parse_addr(format_addr(a)) == a`` for a valid address."""
    try:
        text = addr.decode()
    except UnicodeDecodeError:
        return HEX_PREFIX + addr.hex()
    # Not "-..." either: it would read as an option on a command line.
    if text and not text.startswith((HEX_PREFIX, "-")) and all(
            (c.isalnum() and c.isprintable()) or c in _PLAIN for c in text):
        return text
    return HEX_PREFIX + addr.hex()


def parse_group(value: str) -> str:
    """A group name: non-empty, at most the protocol's :data:`MAX_GROUP` bytes of UTF-8."""
    if not value:
        raise ValueError("a group name must not be empty")
    if len(value.encode()) > MAX_GROUP:
        raise ValueError(f"a group name is at most {MAX_GROUP} bytes of UTF-8")
    return value
