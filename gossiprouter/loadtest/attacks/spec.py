"""The ``[[attacks]]`` tables of a load-test scenario: the kinds, their options, their check.

Each table has a ``kind`` and the options below (defaults in brackets)::

    kind = "ping-flood"       native PINGs, answers read         connections [1],
                              bytes_per_s [1048576, or "max": as fast as the router reads],
                              burst [65536] (bytes per write)
    kind = "heartbeat-flood"  JGroups 5.x HEARTBEATs, answers read; same options
    kind = "partial-frames"   connections [40] each sending the start of a frame whose length
                              says size [8388608] and all of it but the last byte, held for
                              hold [5.0] s, then closed and opened again; protocol
                              ["native": preamble + HELLO, "jgroups2": a MESSAGE, "jgroups5": a
                              MESSAGE, or "mixed": connections take turns]
    kind = "huge-names"       members [2] registering in group ["hostile-names"] with names
                              of name_bytes [65536] and asking for the group's members every
                              query_interval [1.0] s; protocol ["native", "jgroups2",
                              "jgroups5"]; raw_nul [false]: JGroups names made of raw NUL
                              bytes, which are twice as long when the router writes them back
    kind = "watch-flood"      one native connection WATCHing groups [50000] distinct groups,
                              watches_per_s [10000 or "max"]
    kind = "admin-poll"       GET of each of paths [["/groups", "/metrics"]] every
                              interval [0.5] s on the router's HTTP endpoint; with
                              --spawn-router the driver enables it (--metrics on a free port)

:func:`parse_attacks` fills in the defaults and refuses anything else with a one-line
:class:`~gossiprouter.loadtest.scenario_checks.ScenarioError`, as the rest of the scenario.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from gossiprouter.loadtest.scenario_checks import Checker, ScenarioError, is_int, is_number

__all__ = ["KINDS", "AttackSpec", "MiB", "parse_attacks"]

MAX_NAME_BYTES: Final = 64 << 20
MiB: Final = 1 << 20

# Per kind: option -> (default, check, what the check expects). "max" is allowed where the
# default says so (a rate of None = unpaced).
_Check = Callable[[Any], bool]


def _int_in(lo: int, hi: int) -> tuple[_Check, str]:
    return (lambda v: is_int(v) and lo <= v <= hi, f"an integer from {lo} to {hi}")


def _num_in(lo: float, hi: float) -> tuple[_Check, str]:
    return (lambda v: is_number(v) and math.isfinite(v) and lo < v <= hi,
            f"a number > {lo:g} and <= {hi:g}")


def _rate(hi: float) -> tuple[_Check, str]:
    ok, what = _num_in(0, hi)
    return (lambda v: v == "max" or ok(v), f'{what}, or "max"')


def _choice(*choices: str) -> tuple[_Check, str]:
    return (lambda v: v in choices, "one of " + ", ".join(f'"{c}"' for c in choices))


_BOOL: Final = (lambda v: isinstance(v, bool), "true or false")
_FLOOD: Final = {
    "connections": (1, *_int_in(1, 1000)),
    "bytes_per_s": (MiB, *_rate(1e10)),
    "burst": (65536, *_int_in(16, 64 * MiB)),
}
_SCHEMA: Final[dict[str, dict[str, tuple[Any, _Check, str]]]] = {
    "ping-flood": _FLOOD,
    "heartbeat-flood": _FLOOD,
    "partial-frames": {
        "connections": (40, *_int_in(1, 10_000)),
        "size": (8 * MiB, *_int_in(16, 1 << 31)),
        "hold": (5.0, *_num_in(0, 3600)),
        "protocol": ("native", *_choice("native", "jgroups2", "jgroups5", "mixed")),
    },
    "huge-names": {
        "members": (2, *_int_in(1, 1000)),
        "group": ("hostile-names", (lambda v: isinstance(v, str) and 0 < len(v) <= 1024),
                  "a group name of 1 to 1024 characters"),
        "name_bytes": (65536, *_int_in(1, MAX_NAME_BYTES)),
        "query_interval": (1.0, *_num_in(0, 3600)),
        "protocol": ("native", *_choice("native", "jgroups2", "jgroups5")),
        "raw_nul": (False, *_BOOL),
    },
    "watch-flood": {
        "groups": (50_000, *_int_in(1, 10_000_000)),
        "watches_per_s": (10_000, *_rate(1e9)),
    },
    "admin-poll": {
        "interval": (0.5, *_num_in(0, 3600)),
        "paths": (["/groups", "/metrics"],
                  (lambda v: isinstance(v, list) and bool(v)
                   and all(isinstance(p, str) and p.startswith("/") for p in v)),
                  'a non-empty list of paths starting with "/"'),
    },
}
KINDS: Final = tuple(_SCHEMA)


@dataclass(frozen=True)
class AttackSpec:
    """One ``[[attacks]]`` table, every option filled in."""

    kind: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.options[key]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.options}


def parse_attacks(raw: Any, source: str) -> tuple[AttackSpec, ...]:
    """Validate the ``attacks`` array of a scenario; ScenarioError names key and value."""
    error = Checker(source).error

    if not isinstance(raw, list) or not all(isinstance(a, Mapping) for a in raw):
        raise error("attacks", "an array of tables ([[attacks]])", raw)
    out: list[AttackSpec] = []
    for i, table in enumerate(raw):
        where = f"attacks[{i}]"
        kind = table.get("kind")
        if kind not in _SCHEMA:
            raise error(f"{where}.kind", "one of " + ", ".join(f'"{k}"' for k in KINDS), kind)
        schema = _SCHEMA[kind]
        for key in table:
            if key != "kind" and key not in schema:
                raise ScenarioError(f"{source}: unknown key {key!r} in {where} (kind "
                                    f"{kind!r}; expected one of: kind, {', '.join(schema)})")
        options: dict[str, Any] = {}
        for key, (default, check, expected) in schema.items():
            value = table.get(key, default)
            if not check(value):
                raise error(f"{where}.{key}", expected, value)
            options[key] = float(value) if isinstance(default, float) else value
        if kind == "huge-names" and options["protocol"] != "native" \
                and options["name_bytes"] > 0xFFFF:
            raise error(f"{where}.name_bytes", "at most 65535 for a JGroups protocol (its "
                        "strings have a 16-bit length)", options["name_bytes"])
        out.append(AttackSpec(kind, options))
    return tuple(out)
