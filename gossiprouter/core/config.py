"""One typed configuration object shared by the CLI, the config file and tests.

Every router option is declared once, as a field of :class:`Config`: its name, type,
default, unit and help text (:func:`~gossiprouter.core.options.option`). :data:`OPTIONS` reads
them back; the click options of ``gossiprouter serve``, the keys of the TOML config file and the
option table of ``docs/operations.md`` are all derived from it, so they cannot drift apart.
A bad value is refused (:func:`check`) with the key, the value and what was expected;
:func:`load_file` reads the TOML config file and :func:`build` merges it with the command line.
"""

from __future__ import annotations

import difflib
import json
import math
import textwrap
import tomllib
import typing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from gossiprouter.core import addresses
from gossiprouter.core.options import (
    Option,
    bridge_urls,
    check_federation_id,
    option,
    parse_bridge_prefix,
    parse_bridge_url,
    parse_listen,
    parse_network,
    parse_secret_ref,
)
from gossiprouter.protocol.native_frames import DEFAULT_MAX_FRAME


class ConfigError(ValueError):
    """A bad option value or config file; the message names the key, the value and
    what was expected, and is shown to the user as it is."""


@dataclass(frozen=True)
class Provisioned:
    """A sticky member from the config file: listed, never expired, never replaced."""

    group: str
    addr: bytes
    name: str | None = None
    physical: tuple[tuple[str, int], ...] = ()



@dataclass(frozen=True)
class Config:
    """The router's settings: one field per option, declared here with its help text, unit
    and bounds (:func:`~gossiprouter.core.options.option`), and the provisioned members of the
    config file."""

    host: str = option("127.0.0.1", "Address to listen on (0.0.0.0 or :: for every interface).")
    port: int = option(12001, "TCP port for every protocol (native, JGroups 2.12, JGroups 5.x).",
        minimum=0)
    max_frame: int = option(DEFAULT_MAX_FRAME, "Largest native frame accepted or sent; a longer "
        "length prefix is refused before any allocation with ERROR frame_too_large (JGroups: "
        "jgroups-max-frame).", minimum=64, unit="bytes")
    outbound_queue_bytes: int = option(2 * DEFAULT_MAX_FRAME, "Bound on bytes queued for one "
        "connection; at least 2 x max-frame.", minimum=1024, unit="bytes")
    outbound_queue_frames: int = option(100_000, "Bound on chunks queued for one connection (a "
        "chunk is one frame, or a run of frames that arrived together for it).", minimum=1)
    slow_consumer_policy: str = option("disconnect", "What happens when a receiver's queue is "
        "full: 'disconnect' (ERROR slow_consumer, then close) or 'drop' (the frame is dropped for "
        "that receiver and counted).", choices=("disconnect", "drop"))
    idle_timeout: float = option(60.0, "Close a connection from which nothing (PING included) was "
        "received for this long (ERROR idle_timeout); 0 disables.", minimum=0, unit="seconds")
    heartbeat_interval: float = option(10.0, "How often clients should PING when idle (announced "
        "in WELCOME).", minimum=0.01, unit="seconds")
    suspect_events: bool = option(True, "Send EVENT suspect to a group when a member vanishes "
        "without DISCONNECT.")
    grace: float = option(0.0, "Reconnect grace: keep a member whose last connection dropped for "
        "this long, holding its traffic; 0 disables.", minimum=0, unit="seconds")
    grace_buffer_bytes: int = option(1 << 20, "Traffic held per member during reconnect grace; "
        "beyond it frames are dropped and counted.", minimum=0, unit="bytes")
    max_connections: int = option(20_000, "Most client connections at once; one more gets ERROR "
        "limit.", minimum=1)
    addresses_per_connection: int = option(1024, "Most (group, address) registrations on one "
        "connection (ERROR limit); 0 = no limit.", minimum=0)
    groups_per_connection: int = option(256, "Most groups one connection may register in (ERROR "
        "limit); 0 = no limit.", minimum=0)
    # --- bounds on what a client may store (see docs/operations.md, "Stored names")
    max_name_bytes: int = option(255, "Longest logical name, and longest physical host, a member "
        "may register (UTF-8 bytes); longer is refused (native ERROR too_long, JGroups 2.12 "
        "OP_FAIL, 5.x skipped and logged). JGroups names are host names plus a few digits.",
        minimum=1, unit="bytes")
    max_group_bytes: int = option(1024, "Longest group (cluster) name a member may register in "
        "(UTF-8 bytes; the native protocol's own limit); longer is refused as for max_name_bytes.",
        minimum=1, unit="bytes")
    max_physical_addresses: int = option(16, "Most physical addresses one member may register; "
        "more is refused as for max_name_bytes.", minimum=0)
    max_address_bytes: int = option(512, "Longest JGroups address encoding a member may register "
        "(its logical address, e.g. an ExtendedUUID with its keys, or a physical one), kept to be "
        "written back in member lists; longer is refused as for max_name_bytes.", minimum=32,
        unit="bytes")
    handshake_timeout: float = option(10.0, "Close a connection whose whole handshake (TLS, "
        "preamble and HELLO; for JGroups the first complete frame) is not done within this time.",
        minimum=0.1, unit="seconds")
    shutdown_timeout: float = option(5.0, "On SIGINT/SIGTERM, how long clients get to receive "
        "what is queued for them.", minimum=0, unit="seconds")
    close_timeout: float = option(10.0, "When the router closes a connection (slow consumer, "
        "idle, protocol error), how long it keeps trying to deliver the final ERROR frame behind "
        "what was already being written. The connection's members leave at once.", minimum=0,
        unit="seconds")
    # --- memory a client can pin, and JGroups-specific limits (docs/operations.md "Incomplete
    # frames"; docs/jgroups.md §6)
    preauth_max_frame: int = option(64 * 1024, "Largest frame a connection may send before it is "
        "authenticated (native: until its HELLO is accepted; JGroups: until it has registered a "
        "member); a longer length prefix closes the connection (native: ERROR frame_too_large).",
        minimum=64, unit="bytes")
    partial_frames_budget: int = option(256 * 1024 * 1024, "Router-wide bound on bytes held in "
        "incomplete frames larger than preauth-max-frame. When exhausted, a JGroups frame is "
        "skipped (counted as drops reason partial_frames_budget); a native connection gets ERROR "
        "limit and is closed. At least max-frame and jgroups-max-frame.", minimum=0, unit="bytes")
    jgroups_max_frame: int = option(64 * 1024 * 1024, "Largest JGroups message routed (JGroups "
        "5.x frame; 2.12 message buffer); a longer one is skipped as it streams past, never "
        "buffered, counted (drops reason frame_too_large) and the connection stays open.",
        minimum=64, unit="bytes")
    jgroups_slow_consumer_policy: str = option("drop", "slow_consumer_policy for JGroups "
        "connections: 'drop' (a stalled member keeps its queue up to outbound_queue_bytes, its "
        "oldest frames dropped beyond, none for time; JGroups retransmits them; a 5.x RouterStub "
        "survives only one router-side close) or 'disconnect'.", choices=("disconnect", "drop"))
    backlog: int = option(1024, "Listen backlog.", minimum=1)
    direct_send: bool = option(True, "Let a connection's reader write routed frames straight to "
        "an idle receiver's socket instead of waking its writer task (fewer task switches per "
        "message).")
    dispatcher: bool = option(True, "Read every established plain-TCP connection from one "
        "dispatcher task over an inner level-triggered epoll (fewer task switches and epoll "
        "re-arms per message under light load); off: one reader task per connection. TLS "
        "connections always use their own reader.")
    coalesce_writes: bool = option(False, "With the dispatcher: when one wake-up reads several "
        "connections, hold its direct sends of small messages and write what it routed to each "
        "receiver in one send when it ends (fewer system calls in fan-out under medium load; adds "
        "the wake-up's processing time to the first messages' latency). See docs/performance.md. "
        "Not used by the compiled fast path, which writes what one read routes to a receiver in "
        "one send.")
    fast_path: str = option("auto", "The compiled fast path (gossiprouter.server._relay, built by "
        "scripts/setup): a relay thread reads plain-TCP connections (native, JGroups 2.12 and "
        "5.x) and relays their routed frames in C, repeating the routing decisions Python made, "
        "without the GIL (less CPU and latency per message under light load; "
        "docs/performance.md). 'auto': on when built (the environment variable "
        "GOSSIPROUTER_FAST_PATH=on/off overrides it); 'on': required; 'off': the pure-Python path.",
        choices=("auto", "on", "off"))
    fast_path_max_bytes: int = option(64 * 1024 * 1024, "Router-wide bound on what the fast "
        "path's thread holds: frames cut between reads and bytes a receiver's socket did not take "
        "(counted in the partial_frame_bytes and outbound_queued_bytes gauges). A frame whose "
        "copies could take it over goes through Python instead, under Python's own bounds.",
        minimum=0, unit="bytes")
    fast_path_threads: int = option(16, "Threads of their own for the fast path's busiest "
        "connections, at most: a connection that reads often (about 200 reads/s or more) is "
        "read by a thread that waits on it alone and is woken straight by its sender, as Java's "
        "GossipRouter reads every connection (lower latency at light load on machines whose "
        "idle CPUs sleep); it goes back to the one relay thread after 2 s without a read. The "
        "idle connections stay on the relay thread. 0: one relay thread reads every "
        "connection. See docs/performance.md.", minimum=0, maximum=256)
    fast_path_sched: str = option("batch", "Scheduling policy of the fast path's threads (the "
        "relay thread and the busy connections' ones; Python's thread keeps its own). 'batch' "
        "(SCHED_BATCH): a thread woken by a sender's write does not preempt the running one but "
        "runs when it sleeps or on an idle core: at light load about a third less router CPU a "
        "message and half the latency (docs/performance.md). 'normal' (SCHED_OTHER): such a "
        "wake-up may preempt, for machines whose CPU-bound processes must give way to the "
        "router at once.", choices=("batch", "normal"))
    router_id: str = option("", "Name announced in WELCOME (default: gossiprouter@HOST:PORT).")
    log_level: str = option("info", "Log level.", choices=("debug", "info", "warning", "error"))
    # --- operations and security (gossiprouter.ops; see docs/operations.md)
    log_format: str = option("text", "Log line format: 'text' for people, 'json' for log shippers "
        "(one object per line).", choices=("text", "json"))
    metrics: str = option("", "HOST:PORT of the read-only HTTP endpoint: Prometheus /metrics and "
        "the admin view /groups; empty disables. Bind it to a private address.",
        parse=parse_listen, metavar="HOST:PORT")
    tls_cert: str = option("", "PEM certificate chain: the router port speaks TLS (every "
        "protocol); reloaded on SIGHUP.", metavar="FILE")
    tls_key: str = option("", "PEM private key of tls_cert (default: read from the tls_cert file).",
        metavar="FILE")
    tls_client_ca: str = option("", "PEM CA bundle that client certificates are verified against "
        "(mutual TLS).", metavar="FILE")
    tls_require_client_cert: bool = option(False, "Refuse TLS clients without a certificate "
        "signed by tls_client_ca.")
    tokens_file: str = option("", "TOML file of native-protocol tokens (identity, allowed "
        "groups); when set, HELLO must carry a known token. Reloaded on SIGHUP.", metavar="FILE")
    jgroups: bool = option(True, "Serve the JGroups 2.12 and 5.x protocols (they carry no "
        "credentials); false refuses them.")
    allow_native: tuple[str, ...] = option(("0.0.0.0/0", "::/0"), "Client networks (CIDR) allowed "
        "to speak the native protocol.", parse=parse_network, metavar="CIDR")
    allow_jgroups2: tuple[str, ...] = option(("0.0.0.0/0", "::/0"), "Client networks (CIDR) "
        "allowed to speak JGroups 2.12.", parse=parse_network, metavar="CIDR")
    allow_jgroups5: tuple[str, ...] = option(("0.0.0.0/0", "::/0"), "Client networks (CIDR) "
        "allowed to speak JGroups 3.6.5+/5.x.", parse=parse_network, metavar="CIDR")
    # --- hostile clients: limits, budgets, deadlines (issue 12; docs/operations.md)
    watches_per_connection: int = option(256, "Most groups one native connection may WATCH (ERROR "
        "limit); 0 = no limit.", minimum=0)
    max_groups: int = option(100_000, "Most groups in the router (registered or watched); a "
        "CONNECT, REGISTER or WATCH that would create one more is refused (ERROR limit); 0 = no "
        "limit.", minimum=0)
    control_rate: float = option(1000.0, "Control frames (anything but routed messages: PING, "
        "HEARTBEAT, CONNECT, GET_MEMBERS, ...) one connection may send per second on average; "
        "beyond it its input is read at that pace. 0 = no budget.", minimum=0, unit="per second")
    control_burst: int = option(10_000, "Control frames one connection may send at once above "
        "control_rate.", minimum=1)
    control_grace: float = option(5.0, "A connection over its control budget for this long is "
        "closed (ERROR rate_limited).", minimum=0.1, unit="seconds")
    write_timeout: float = option(10.0, "A receiver with data queued whose socket took nothing "
        "for this long is a slow consumer (its slow_consumer_policy applies; a JGroups receiver "
        "under policy drop keeps its queue: the stall is only counted); 0 disables.",
        minimum=0, unit="seconds")
    max_connections_per_ip: int = option(0, "Most connections at once from one client IP address "
        "(refused at accept); 0 = no limit.", minimum=0)
    auth_backoff: float = option(5.0, "Longest delay before answering a HELLO from an address "
        "whose recent HELLOs failed authentication (the delay doubles per failure from 50 ms); 0 "
        "disables.", minimum=0, unit="seconds")
    admin_token: str = option("", "Bearer token required by the metrics/admin endpoint: "
        "'file:PATH' (first line of the file, re-read on SIGHUP) or 'env:NAME' (an environment "
        "variable); empty: no token.", parse=parse_secret_ref, metavar="SOURCE")
    # --- topic multicast and the MQTT federation bridge (docs/topics.md)
    subscriptions_per_member: int = option(1024, "Most topic patterns one member may hold at once "
        "(ERROR limit beyond); 0 = no bound.", minimum=0)
    # A single URL (a string, as before several were accepted) is a list of one.
    bridge: tuple[str, ...] = option((), "Federate through an MQTT 5 broker: mqtt://HOST:PORT or "
        "mqtts://HOST:PORT (TLS). Groups then span every router on it (membership and traffic, "
        "docs/federation.md) and global topic publications go through it; empty disables. Several "
        "URLs (one broker cluster, or bridged brokers, all of one scheme): the bridge uses the "
        "first and fails over to the next when it loses the one it uses.", parse=parse_bridge_url,
        metavar="URL")
    bridge_prefix: str = option("gossiprouter", "First level of every MQTT topic the bridge uses "
        "(one federation per prefix).", parse=parse_bridge_prefix)
    bridge_username: str = option("", "MQTT user name (empty: none).")
    federation_id: str = option("", "This router's stable identity in the federation: its topic "
        "subtree %fed/PREFIX/ID/ and its MQTT client id. Give it the router's MQTT user name, so "
        "the broker's ACL confines the router to its own topics (docs/federation.md, 'Locked-down "
        "deployment'). Default: bridge_username; without one, a random id at each start (with a "
        "warning).", parse=check_federation_id)
    federation_members_per_router: int = option(100_000, "Most members this router takes from the "
        "records of one other router of the federation (beyond: left out and counted in "
        "conflicts); 0 = no bound. Remote groups count in max_groups like local ones.", minimum=0)
    federation_key_file: str = option("", "File holding a key shared by every router of the "
        "federation (at least 16 bytes): every federation message is then signed (HMAC-SHA256) "
        "and nothing unsigned, badly signed or replayed is read. For a broker that cannot confine "
        "each router to its own topics (docs/federation.md, 'Threat model').", metavar="FILE")
    bridge_password_file: str = option("", "File holding the MQTT password (first line), so it is "
        "not on the command line.", metavar="FILE")
    bridge_tls_ca: str = option("", "PEM CA bundle the broker's certificate is verified against "
        "(mqtts://; default: the system store).", metavar="FILE")
    bridge_tls_cert: str = option("", "PEM client certificate for the broker (mutual TLS).",
        metavar="FILE")
    bridge_tls_key: str = option("", "PEM key of bridge_tls_cert (default: in that file).",
        metavar="FILE")
    bridge_qos: int = option(0, "MQTT QoS of bridged publications and subscriptions: 0 (at most "
        "once, like the router itself) or 1 (at least once while connected; duplicates possible).",
        minimum=0)
    bridge_keepalive: int = option(5, "MQTT keepalive of the bridge's broker connection: a router "
        "cut off or killed is declared dead by the broker (its Last Will) after 1.5 times this, "
        "and its members leave every other router of the federation (docs/federation.md).",
        minimum=1, unit="seconds")
    bridge_reconnect_max: float = option(1.0, "Upper bound of the bridge's reconnect backoff "
        "(full jitter, from 0.5 s doubling).", minimum=0.1, unit="seconds")
    bridge_queue_bytes: int = option(16 * 1024 * 1024, "Bound on the bytes of routed frames and "
        "global publications waiting for the broker (a broker that reads slowly or not at all); "
        "beyond, they are dropped and counted (gossiprouter_bridge_queue_full).", minimum=65536,
        unit="bytes")
    federation_heartbeat: float = option(2.0, "Interval of the heartbeats each router sends every "
        "other router on the path its routed frames take (docs/federation.md), on its multiples "
        "on the wall clock, so routers whose clocks agree beat together; 0 sends none.",
        minimum=0, unit="seconds")
    federation_peer_timeout: float = option(10.0, "Another router whose heartbeats stop for this "
        "long is unreachable (a cut between bridged brokers): its members are held for "
        "federation_grace, then dropped as suspected; 0 never times a router out.", minimum=0,
        unit="seconds")
    federation_frame_age: float = option(10.0, "Routed frames older than this when they arrive "
        "(measured against the sender's heartbeats, so a clock offset between hosts cancels out) "
        "are dropped and counted, never delivered late; 0 delivers them whatever their age.",
        minimum=0, unit="seconds")
    federation_grace: float = option(30.0, "How long the members of another router that is out of "
        "reach (its Last Will, a broker outage, not seen after a reconnect) are held before they "
        "are dropped as suspected: a broker outage shorter than this makes no member leave; 0 "
        "drops them at once (docs/federation.md).", minimum=0, unit="seconds")
    provisioned: tuple[Provisioned, ...] = field(default=())

    def __post_init__(self) -> None:
        if isinstance(self.bridge, str):
            object.__setattr__(self, "bridge", bridge_urls(self.bridge))
        for o in OPTIONS:
            check(o, getattr(self, o.name))
        if self.outbound_queue_bytes < 2 * self.max_frame:
            raise ConfigError(
                f"outbound_queue_bytes = {self.outbound_queue_bytes}: expected at least "
                f"2 x max_frame ({2 * self.max_frame}), so one whole frame always fits"
            )
        for name in ("max_frame", "jgroups_max_frame"):
            if self.partial_frames_budget < getattr(self, name):
                raise ConfigError(
                    f"partial_frames_budget = {self.partial_frames_budget}: expected at least "
                    f"{name} ({getattr(self, name)}), or no such frame could ever be buffered"
                )

    def with_(self, **changes: Any) -> Config:
        return replace(self, **changes)

    @property
    def name(self) -> str:
        return self.router_id or f"gossiprouter@{self.host}:{self.port}"



def _declared() -> tuple[Option, ...]:
    hints = typing.get_type_hints(Config)
    return tuple(Option(f.name, typing.get_origin(hints[f.name]) or hints[f.name], f.default,
                        **f.metadata["option"])
                 for f in fields(Config) if "option" in f.metadata)


# Every router option, in declaration order, read from Config's fields.
OPTIONS: tuple[Option, ...] = _declared()
_BY_NAME = {o.name: o for o in OPTIONS}


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
    if o.type is float and not math.isfinite(value):
        # nan passes every comparison below and inf overflows int(seconds * 1000) later.
        raise ConfigError(f"{o.name} = {value!r}: expected a finite number")
    if o.minimum is not None and value < o.minimum:
        raise ConfigError(f"{o.name} = {value!r}: expected a value >= {o.minimum:g}")
    if o.maximum is not None and value > o.maximum:
        raise ConfigError(f"{o.name} = {value!r}: expected a value <= {o.maximum:g}")
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


def _parse_addr(value: Any, where: str) -> bytes:
    if not isinstance(value, str):
        raise ConfigError(f"{where} = {value!r}: expected a string (hex bytes or text)")
    try:
        return addresses.parse_addr(value)
    except ValueError as e:
        raise ConfigError(f"{where} = {value!r}: {e}") from None


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
    return addresses.parse_hostport(value)


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
            close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
            raise ConfigError(
                f"config file {path}: unknown key {key!r}; "
                + (f"did you mean {close[0]!r}?" if close
                   else "expected one of " + ", ".join(sorted(known)))
            )
        try:
            if name == "provisioned":
                values[name] = _parse_provisioned(value)
                continue
            if name == "bridge" and isinstance(value, str):
                value = list(bridge_urls(value))
            check(_BY_NAME[name], value)
        except ConfigError as e:
            raise ConfigError(f"config file {path}: {e}") from None
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


_EXAMPLE_HEAD = """\
# gossiprouter configuration: every option, at its default. Generated from the option
# declarations (gossiprouter/core/config.py) by scripts/example-config; do not edit by hand.
# Use:  gossiprouter serve --config /etc/gossiprouter/gossiprouter.toml
# Any option given on the command line wins over this file. Keys may be written with
# '_' or '-'. An unknown key or a bad value stops the router at start-up with a message
# naming the key, the value and what was expected. docs/operations.md explains them.
"""

_EXAMPLE_TAIL = """
# Provisioned (sticky) members: listed by GET_MEMBERS, never expired or replaced.
# [[provisioned]]
# group = "billing"
# addr = "hex:0a0b0c0d"             # or plain text
# name = "billing-db"
# physical = ["10.0.0.9:7800"]
"""


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)  # a TOML basic string is a JSON string for these values


def example_toml() -> str:
    """docs/gossiprouter.example.toml: every option of :data:`OPTIONS` at its default, with
    its help as a comment."""
    out = [_EXAMPLE_HEAD.rstrip("\n")]
    for o in OPTIONS:
        text = o.help
        if o.unit:
            text += f" Unit: {o.unit}."
        if o.choices:
            text += f" One of: {', '.join(o.choices)}."
        out.append("")
        out.extend(f"# {line}" for line in textwrap.wrap(text, 88))
        out.append(f"{o.name} = {_toml_value(o.default)}")
    return "\n".join(out) + "\n" + _EXAMPLE_TAIL
