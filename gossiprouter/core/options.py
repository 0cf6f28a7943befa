"""What a router option is, how one is declared, and the parsers of option values.

Every router option is declared once, as a field of :class:`~gossiprouter.core.config.Config`
made with :func:`option`: the field gives its name, type and default, :func:`option` its help
text, unit and bounds. :data:`~gossiprouter.core.config.OPTIONS` reads them back as
:class:`Option` records, from which the click options of ``gossiprouter serve``, the keys of the
TOML config file and the option table of ``docs/operations.md`` are all derived, so they cannot
drift apart. The parsers below check an option's value (``Option.parse``), and are what the
operations layer and the bridge use to read those values.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gossiprouter.core import addresses

T = TypeVar("T")


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
    maximum: float | None = None
    unit: str = ""
    # Checks a non-empty str value, or each item of a list (type tuple) option;
    # raises ValueError saying what was expected.
    parse: Callable[[str], object] | None = None
    metavar: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def section(self) -> str:
        """The heading it is listed under in ``gossiprouter serve --help``."""
        return section_of(self.name)


# The headings of ``gossiprouter serve --help``, in order; every option is under one.
LISTENING = "Listening and connections"
LIMITS = "Limits"
JGROUPS = "JGroups"
TLS_AUTH = "TLS and authentication"
FEDERATION = "Federation (MQTT bridge)"
OPERATIONS = "Operations"
OTHER = "Other options"  # none: an option found here needs a line below (a test says so)
SECTIONS = (LISTENING, LIMITS, JGROUPS, TLS_AUTH, FEDERATION, OPERATIONS, OTHER)

_SECTION_OF = {
    **dict.fromkeys(("host", "port", "backlog", "router_id", "idle_timeout",
                     "heartbeat_interval", "handshake_timeout", "close_timeout",
                     "shutdown_timeout", "grace", "grace_buffer_bytes", "suspect_events"),
                    LISTENING),
    **dict.fromkeys(("outbound_queue_bytes", "outbound_queue_frames", "slow_consumer_policy",
                     "preauth_max_frame", "partial_frames_budget", "control_rate",
                     "control_burst", "control_grace", "write_timeout"), LIMITS),
    **dict.fromkeys(("tokens_file", "auth_backoff", "admin_token"), TLS_AUTH),
    **dict.fromkeys(("log_level", "log_format", "metrics", "direct_send", "dispatcher",
                     "coalesce_writes", "fast_path", "fast_path_max_bytes",
                     "fast_path_threads", "fast_path_sched"), OPERATIONS),
}
# Then by name: the families the option names already make.
_SECTION_BY_PREFIX = (("jgroups", JGROUPS), ("tls_", TLS_AUTH), ("allow_", TLS_AUTH),
                      ("bridge", FEDERATION), ("federation_", FEDERATION), ("max_", LIMITS))


def section_of(name: str) -> str:
    """The ``serve --help`` heading of the option ``name`` (:data:`SECTIONS`)."""
    if name in _SECTION_OF:
        return _SECTION_OF[name]
    for prefix, section in _SECTION_BY_PREFIX:
        if name.startswith(prefix):
            return section
    return LIMITS if "_per_" in name else OTHER



def option(default: T, help: str, *, choices: tuple[str, ...] | None = None,
           minimum: float | None = None, maximum: float | None = None, unit: str = "",
           parse: Callable[[str], object] | None = None, metavar: str = "") -> T:
    """Declare one router option as a field of :class:`~gossiprouter.core.config.Config`, with
    ``default``; the rest is what its :class:`Option` says (the field's name and type are the
    option's own)."""
    about = {"help": help, "choices": choices, "minimum": minimum, "maximum": maximum,
             "unit": unit,
             "parse": parse, "metavar": metavar}
    return field(default=default, metadata={"option": about})


def parse_bridge_url(value: str) -> tuple[str, str, int]:
    """``mqtt://HOST:PORT`` / ``mqtts://HOST:PORT`` -> (scheme, host, port); port defaults
    to 1883 / 8883."""
    from urllib.parse import urlsplit

    u = urlsplit(value)
    if u.scheme not in ("mqtt", "mqtts") or not u.hostname or u.path not in ("", "/") \
            or u.query or u.username:
        raise ValueError("expected mqtt://HOST:PORT or mqtts://HOST:PORT (credentials go in "
                         "bridge_username / bridge_password_file)")
    try:
        port = u.port
    except ValueError:
        raise ValueError("port must be 1..65535") from None
    return u.scheme, u.hostname, port or (8883 if u.scheme == "mqtts" else 1883)



def check_federation_id(value: str) -> str:
    if value and not (value.isascii() and value.isprintable() and len(value) <= 128
                      and not any(c in value for c in "/+#% ")):
        raise ValueError("at most 128 printable ASCII characters without '/', '+', '#', "
                         "'%' or spaces (one MQTT topic level, as the broker's user name)")
    return value



def bridge_urls(value: str) -> tuple[str, ...]:
    """A ``bridge`` given as one string: its comma-separated URLs (empty: none)."""
    return tuple(u.strip() for u in value.split(",") if u.strip())



def parse_bridge_prefix(value: str) -> str:
    """``bridge_prefix``: one MQTT topic level; ValueError says what was expected."""
    if not value or any(c in value for c in "/+#%") or value.startswith("$") \
            or not value.isprintable():
        raise ValueError("one MQTT topic level of printable characters without '/', '+', "
                         "'#', '%', not starting with '$'")
    return value



def parse_network(value: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """A client network in CIDR notation; ValueError says what was expected."""
    try:
        return ipaddress.ip_network(value, strict=True)
    except ValueError as e:
        raise ValueError(
            f"expected a network in CIDR notation, e.g. 10.0.0.0/8 or fd00::/8 ({e})"
        ) from None



def parse_secret_ref(value: str) -> tuple[str, str]:
    """``file:PATH`` or ``env:NAME``: where a secret is read from (never the secret itself,
    so it does not show in ``ps`` or in a config file)."""
    kind, sep, where = value.partition(":")
    if not sep or kind not in ("file", "env") or not where:
        raise ValueError("expected file:PATH or env:NAME")
    return kind, where



def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` to listen on; port 0 picks a free port (tests)."""
    return addresses.parse_hostport(value, allow_zero=True)

