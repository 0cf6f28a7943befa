"""One typed configuration object shared by the CLI, the config file and tests.

Every router option is declared once, in :data:`OPTIONS`: its name, type,
default, unit and help text. The click options of ``gossiprouter serve``, the
keys of the TOML config file and the option table of ``docs/operations.md``
are all derived from it, so they cannot drift apart.
"""

from __future__ import annotations

import ipaddress
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from gossiprouter.protocol.native import DEFAULT_MAX_FRAME


class ConfigError(ValueError):
    """A bad option value or config file; the message names the key, the value and
    what was expected, and is shown to the user as it is."""


@dataclass(frozen=True)
class Option:
    """One router option. ``type`` is int, float, bool, str, or tuple for a list of
    strings (a TOML array; on the command line a repeatable, comma-splittable option)."""

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    unit: str = ""
    # Checks a non-empty str value, or each item of a list (type tuple) option;
    # raises ValueError saying what was expected.
    parse: Callable[[str], object] | None = None
    metavar: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


OPTIONS: tuple[Option, ...] = (
    Option("host", str, "127.0.0.1", "Address to listen on (0.0.0.0 or :: for every interface)."),
    Option("port", int, 12001, "TCP port for every protocol (native, JGroups 2.12, JGroups 5.x).",
           minimum=0),
    Option("max_frame", int, DEFAULT_MAX_FRAME,
           "Largest frame accepted or sent; a longer length prefix is refused before any "
           "allocation with ERROR frame_too_large.", minimum=64, unit="bytes"),
    Option("outbound_queue_bytes", int, 2 * DEFAULT_MAX_FRAME,
           "Bound on bytes queued for one connection; at least 2 x max-frame.",
           minimum=1024, unit="bytes"),
    Option("outbound_queue_frames", int, 100_000,
           "Bound on chunks queued for one connection (a chunk is one frame, or a run of "
           "frames that arrived together for it).", minimum=1),
    Option("slow_consumer_policy", str, "disconnect",
           "What happens when a receiver's queue is full: 'disconnect' (ERROR slow_consumer, "
           "then close) or 'drop' (the frame is dropped for that receiver and counted).",
           choices=("disconnect", "drop")),
    Option("idle_timeout", float, 60.0,
           "Close a connection from which nothing (PING included) was received for this long "
           "(ERROR idle_timeout); 0 disables.", minimum=0, unit="seconds"),
    Option("heartbeat_interval", float, 10.0,
           "How often clients should PING when idle (announced in WELCOME).",
           minimum=0.01, unit="seconds"),
    Option("suspect_events", bool, True,
           "Send EVENT suspect to a group when a member vanishes without DISCONNECT."),
    Option("grace", float, 0.0,
           "Reconnect grace: keep a member whose last connection dropped for this long, holding "
           "its traffic; 0 disables.", minimum=0, unit="seconds"),
    Option("grace_buffer_bytes", int, 1 << 20,
           "Traffic held per member during reconnect grace; beyond it frames are dropped and "
           "counted.", minimum=0, unit="bytes"),
    Option("max_connections", int, 20_000,
           "Most client connections at once; one more gets ERROR limit.", minimum=1),
    Option("addresses_per_connection", int, 1024,
           "Most (group, address) registrations on one connection (ERROR limit); 0 = no limit.",
           minimum=0),
    Option("groups_per_connection", int, 256,
           "Most groups one connection may register in (ERROR limit); 0 = no limit.", minimum=0),
    Option("handshake_timeout", float, 10.0,
           "Close a connection that has not said which protocol it speaks within this time.",
           minimum=0.1, unit="seconds"),
    Option("shutdown_timeout", float, 5.0,
           "On SIGINT/SIGTERM, how long clients get to receive what is queued for them.",
           minimum=0, unit="seconds"),
    Option("close_timeout", float, 10.0,
           "When the router closes a connection (slow consumer, idle, protocol error), how long "
           "it keeps trying to deliver the final ERROR frame behind what was already being "
           "written. The connection's members leave at once.", minimum=0, unit="seconds"),
    Option("backlog", int, 1024, "Listen backlog.", minimum=1),
    Option("direct_send", bool, True,
           "Let a connection's reader write routed frames straight to an idle receiver's "
           "socket instead of waking its writer task (fewer task switches per message)."),
    Option("dispatcher", bool, True,
           "Read every established plain-TCP connection from one dispatcher task over an inner "
           "level-triggered epoll (fewer task switches and epoll re-arms per message under light "
           "load); off: one reader task per connection. TLS connections always use their own "
           "reader."),
    Option("router_id", str, "",
           "Name announced in WELCOME (default: gossiprouter@HOST:PORT)."),
    Option("log_level", str, "info", "Log level.",
           choices=("debug", "info", "warning", "error")),
    # --- operations and security (gossiprouter.ops; see docs/operations.md)
    Option("log_format", str, "text",
           "Log line format: 'text' for people, 'json' for log shippers (one object per line).",
           choices=("text", "json")),
    Option("metrics", str, "",
           "HOST:PORT of the read-only HTTP endpoint: Prometheus /metrics and the admin view "
           "/groups; empty disables. Bind it to a private address.",
           parse=lambda v: parse_listen(v), metavar="HOST:PORT"),
    Option("tls_cert", str, "",
           "PEM certificate chain: the router port speaks TLS (every protocol); reloaded on "
           "SIGHUP.", metavar="FILE"),
    Option("tls_key", str, "",
           "PEM private key of tls_cert (default: read from the tls_cert file).", metavar="FILE"),
    Option("tls_client_ca", str, "",
           "PEM CA bundle that client certificates are verified against (mutual TLS).",
           metavar="FILE"),
    Option("tls_require_client_cert", bool, False,
           "Refuse TLS clients without a certificate signed by tls_client_ca."),
    Option("tokens_file", str, "",
           "TOML file of native-protocol tokens (identity, allowed groups); when set, HELLO "
           "must carry a known token. Reloaded on SIGHUP.", metavar="FILE"),
    Option("jgroups", bool, True,
           "Serve the JGroups 2.12 and 5.x protocols (they carry no credentials); false "
           "refuses them."),
    Option("allow_native", tuple, ("0.0.0.0/0", "::/0"),
           "Client networks (CIDR) allowed to speak the native protocol.",
           parse=lambda v: parse_network(v), metavar="CIDR"),
    Option("allow_jgroups2", tuple, ("0.0.0.0/0", "::/0"),
           "Client networks (CIDR) allowed to speak JGroups 2.12.",
           parse=lambda v: parse_network(v), metavar="CIDR"),
    Option("allow_jgroups5", tuple, ("0.0.0.0/0", "::/0"),
           "Client networks (CIDR) allowed to speak JGroups 3.6.5+/5.x.",
           parse=lambda v: parse_network(v), metavar="CIDR"),
)

_BY_NAME = {o.name: o for o in OPTIONS}


@dataclass(frozen=True)
class Provisioned:
    """A sticky member from the config file: listed, never expired, never replaced."""

    group: str
    addr: bytes
    name: str | None = None
    physical: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Config:
    host: str = "127.0.0.1"
    port: int = 12001
    max_frame: int = DEFAULT_MAX_FRAME
    outbound_queue_bytes: int = 2 * DEFAULT_MAX_FRAME
    outbound_queue_frames: int = 100_000
    slow_consumer_policy: str = "disconnect"
    idle_timeout: float = 60.0
    heartbeat_interval: float = 10.0
    suspect_events: bool = True
    grace: float = 0.0
    grace_buffer_bytes: int = 1 << 20
    max_connections: int = 20_000
    addresses_per_connection: int = 1024
    groups_per_connection: int = 256
    handshake_timeout: float = 10.0
    shutdown_timeout: float = 5.0
    close_timeout: float = 10.0
    backlog: int = 1024
    direct_send: bool = True
    dispatcher: bool = True
    router_id: str = ""
    log_level: str = "info"
    log_format: str = "text"
    metrics: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    tls_require_client_cert: bool = False
    tokens_file: str = ""
    jgroups: bool = True
    allow_native: tuple[str, ...] = ("0.0.0.0/0", "::/0")
    allow_jgroups2: tuple[str, ...] = ("0.0.0.0/0", "::/0")
    allow_jgroups5: tuple[str, ...] = ("0.0.0.0/0", "::/0")
    provisioned: tuple[Provisioned, ...] = field(default=())

    def __post_init__(self) -> None:
        for o in OPTIONS:
            check(o, getattr(self, o.name))
        if self.outbound_queue_bytes < 2 * self.max_frame:
            raise ConfigError(
                f"outbound_queue_bytes = {self.outbound_queue_bytes}: expected at least "
                f"2 x max_frame ({2 * self.max_frame}), so one whole frame always fits"
            )

    def with_(self, **changes: Any) -> Config:
        return replace(self, **changes)

    @property
    def name(self) -> str:
        return self.router_id or f"gossiprouter@{self.host}:{self.port}"


def check(o: Option, value: Any) -> None:
    """Refuse a bad value with the key, the value and what was expected."""
    if o.type is tuple:
        _check_list(o, value)
        return
    ok_type = (
        isinstance(value, o.type) and not (o.type is not bool and isinstance(value, bool))
    ) or (o.type is float and isinstance(value, int) and not isinstance(value, bool))
    if not ok_type:
        raise ConfigError(f"{o.name} = {value!r}: expected {_type_word(o)}")
    if o.choices is not None and value not in o.choices:
        raise ConfigError(f"{o.name} = {value!r}: expected one of {', '.join(o.choices)}")
    if o.minimum is not None and value < o.minimum:
        raise ConfigError(f"{o.name} = {value!r}: expected a value >= {o.minimum:g}")
    if o.name == "port" and value > 65535:
        raise ConfigError(f"port = {value!r}: expected a TCP port, 0 to 65535")
    if o.parse is not None and value != "":
        try:
            o.parse(value)
        except ValueError as e:
            raise ConfigError(f"{o.name} = {value!r}: {e}") from None


def _check_list(o: Option, value: Any) -> None:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{o.name} = {value!r}: expected {_type_word(o)}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise ConfigError(f"{o.name}[{i}] = {item!r}: expected a string")
        if o.parse is not None:
            try:
                o.parse(item)
            except ValueError as e:
                raise ConfigError(f"{o.name}[{i}] = {item!r}: {e}") from None


def _type_word(o: Option) -> str:
    if o.type is tuple:
        return f"a list of strings ({o.metavar or 'TEXT'} each)"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[o.type]


def parse_network(value: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """A client network in CIDR notation; ValueError says what was expected."""
    try:
        return ipaddress.ip_network(value, strict=True)
    except ValueError as e:
        raise ValueError(
            f"expected a network in CIDR notation, e.g. 10.0.0.0/8 or fd00::/8 ({e})"
        ) from None


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` to listen on; port 0 picks a free port (tests)."""
    host, _, port_s = value.rpartition(":")
    host = host.strip("[]")
    if not host or not port_s.isdigit() or int(port_s) > 65535:
        raise ValueError("expected HOST:PORT (e.g. 127.0.0.1:9100), port 0 to 65535")
    return host, int(port_s)


def _parse_addr(value: Any, where: str) -> bytes:
    if not isinstance(value, str):
        raise ConfigError(f"{where} = {value!r}: expected a string (hex bytes or text)")
    if value.startswith("hex:"):
        try:
            return bytes.fromhex(value[4:])
        except ValueError:
            raise ConfigError(f"{where} = {value!r}: expected hex digits after 'hex:'") from None
    return value.encode()


def _parse_provisioned(items: Any) -> tuple[Provisioned, ...]:
    if not isinstance(items, list):
        raise ConfigError(f"provisioned = {items!r}: expected an array of tables [[provisioned]]")
    out = []
    for i, it in enumerate(items):
        where = f"provisioned[{i}]"
        if not isinstance(it, dict):
            raise ConfigError(f"{where} = {it!r}: expected a table")
        unknown = set(it) - {"group", "addr", "name", "physical"}
        if unknown:
            raise ConfigError(
                f"{where}.{sorted(unknown)[0]}: unknown key; expected group, addr, name, physical"
            )
        group = it.get("group")
        if not isinstance(group, str) or not group:
            raise ConfigError(f"{where}.group = {group!r}: expected a non-empty string")
        if "addr" not in it:
            raise ConfigError(f"{where}.addr: missing; expected the member's address")
        name = it.get("name")
        if name is not None and not isinstance(name, str):
            raise ConfigError(f"{where}.name = {name!r}: expected a string")
        phys: list[tuple[str, int]] = []
        for j, hp in enumerate(it.get("physical", [])):
            try:
                host, port = parse_hostport(hp)
            except ValueError as e:
                raise ConfigError(f"{where}.physical[{j}] = {hp!r}: {e}") from None
            phys.append((host, port))
        out.append(Provisioned(group, _parse_addr(it["addr"], f"{where}.addr"), name, tuple(phys)))
    return tuple(out)


def parse_hostport(value: Any) -> tuple[str, int]:
    """Parse ``HOST:PORT`` (``[v6]:PORT`` for IPv6); ValueError says what was expected."""
    if not isinstance(value, str) or ":" not in value:
        raise ValueError("expected HOST:PORT")
    host, _, port_s = value.rpartition(":")
    host = host.strip("[]")
    if not host or not port_s.isdigit() or not 0 < int(port_s) <= 65535:
        raise ValueError("expected HOST:PORT with a port from 1 to 65535")
    return host, int(port_s)


def load_file(path: Path) -> dict[str, Any]:
    """Read a TOML config file into option values (not yet merged with the CLI)."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except OSError as e:
        raise ConfigError(f"config file {path}: cannot read it ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path}: not valid TOML ({e})") from None
    values: dict[str, Any] = {}
    known = {f.name for f in fields(Config)}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in known:
            raise ConfigError(
                f"config file {path}: unknown key {key!r}; expected one of "
                + ", ".join(sorted(known))
            )
        if name == "provisioned":
            values[name] = _parse_provisioned(value)
            continue
        check(_BY_NAME[name], value)
        values[name] = tuple(value) if isinstance(value, list) else value
    return values


def build(file: Path | None = None, **cli: Any) -> Config:
    """Defaults, then the config file, then command-line values (CLI wins).

    ``cli`` holds only the options the user actually gave.
    """
    values: dict[str, Any] = {}
    if file is not None:
        values.update(load_file(file))
    values.update(cli)
    for o in OPTIONS:
        v = values.get(o.name)
        if o.type is float and isinstance(v, int) and not isinstance(v, bool):
            values[o.name] = float(v)
    return Config(**values)


_PIPE = "\\|"  # a "|" inside a Markdown table cell


def options_markdown() -> str:
    """The options table of docs/operations.md, generated from :data:`OPTIONS`."""
    rows = ["| config key | command line | default | meaning |", "|---|---|---|---|"]
    for o in OPTIONS:
        if o.type is bool:
            flag = f"`--[no-]{o.name.replace('_', '-')}`"
        elif o.choices:
            flag = f"`{o.flag} {_PIPE.join(o.choices)}`"
        else:
            flag = f"`{o.flag} {o.metavar or o.type.__name__.upper()}`"
        if o.type is tuple:
            default = "`[" + ", ".join(f'"{v}"' for v in o.default) + "]`"
        elif o.type is bool:
            default = f"`{str(o.default).lower()}`"
        elif o.default == "":
            default = "(none)"
        else:
            default = f"`{o.default}`" + (f" {o.unit}" if o.unit else "")
        rows.append(f"| `{o.name}` | {flag} | {default} | {o.help.replace('|', '/')} |")
    return "\n".join(rows) + "\n"
