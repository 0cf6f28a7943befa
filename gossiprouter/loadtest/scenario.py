"""Load-test scenarios: the TOML format that scripts the peers, its model and its validation.

A scenario says which groups exist and how many members each has, how many peer processes
carry those members, how every member sends (rate, payload sizes, unicast/multicast mix), for
how long, and what happens at given times (a member leaves or joins, a peer process is killed,
the router is restarted). :func:`load_scenario` reads a file, :func:`parse_scenario` a mapping
(the driver hands the peers the normalised mapping of :meth:`Scenario.to_dict`, so both sides
go through the same validation).

Every mistake raises :class:`ScenarioError` whose message is one line naming the file, the
key, the value found and what was expected, e.g.
``small.toml: send.rate: expected a number > 0 or "max", got -5``.

Members are named ``{group}-{i}`` (``i`` from 0) and are spread round-robin over the
processes in file order (all members of the first group, then the second, ...): member
number ``k`` overall lives in process ``k % processes``, so each process holds members of
several groups. A member whose first timed event is a ``join`` starts absent; every other
member joins before sending starts. With ``[federation] routers = N`` the run spawns N routers
federated through a mosquitto, and member number ``k`` overall connects to router ``k % N``
(so every group spans the routers). Format reference: ``docs/loadtest.md``.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:
    from gossiprouter.loadtest.attacks import AttackSpec

__all__ = [
    "ACTIONS",
    "MAX_PAYLOAD",
    "MIN_PAYLOAD",
    "THRESHOLD_KEYS",
    "Event",
    "GroupSpec",
    "MemberSpec",
    "Scenario",
    "ScenarioError",
    "SendPattern",
    "StubOptions",
    "load_scenario",
    "parse_scenario",
    "parse_thresholds",
]

Action = Literal["leave", "join", "kill", "restart-router"]
ACTIONS: Final[tuple[Action, ...]] = ("leave", "join", "kill", "restart-router")
StubSharing = Literal["per-member", "per-process"]

# The payload header (peer.py) is 21 bytes plus the sender and dest names, at most 21 bytes
# each with the limits below, so every payload of at least MIN_PAYLOAD bytes has exactly the
# size asked for.
MIN_PAYLOAD: Final = 64
MAX_PAYLOAD: Final = 1 << 20  # well under the router's default max_frame (8 MiB)
MAX_GROUP_NAME: Final = 16
MAX_MEMBERS_PER_GROUP: Final = 9999
MAX_MEMBERS: Final = 10_000
MAX_PROCESSES: Final = 256
MAX_DURATION: Final = 24 * 3600.0
MAX_RATE: Final = 1_000_000.0
MAX_ROUTERS: Final = 8
_GROUP_NAME: Final = re.compile(r"[A-Za-z0-9_.]+")
# [thresholds]: the most a latency percentile of the run may be, in milliseconds, as k6's
# thresholds (``p(99)<50``); the analysis fails the verdict when one is exceeded.
THRESHOLD_KEYS: Final = ("p50_ms", "p90_ms", "p95_ms", "p99_ms", "p999_ms", "max_ms")
MAX_THRESHOLD_MS: Final = 600_000.0


class ScenarioError(ValueError):
    """A scenario that cannot be used. The message is one line: file, key, value, expected."""


@dataclass(frozen=True)
class SendPattern:
    """How each member of a group sends.

    ``rate`` is messages per second per member, None for as fast as possible. A payload size
    is drawn uniformly from ``sizes`` when it is set, else uniformly from the inclusive range
    ``size_range``. Each message is a unicast (to another member of the group, uniformly)
    with probability ``unicast``, else a multicast to the group.
    """

    rate: float | None = 10.0
    sizes: tuple[int, ...] | None = (256,)
    size_range: tuple[int, int] | None = None
    unicast: float = 0.0

    def sizes_value(self) -> list[int] | dict[str, int]:
        """The ``sizes`` value as written in TOML."""
        if self.size_range is not None:
            return {"min": self.size_range[0], "max": self.size_range[1]}
        return list(self.sizes or ())

    def to_dict(self) -> dict[str, Any]:
        return {"rate": "max" if self.rate is None else self.rate, "sizes": self.sizes_value(),
                "unicast": self.unicast}


@dataclass(frozen=True)
class GroupSpec:
    """One group: its name, number of members and send pattern."""

    name: str
    members: int
    send: SendPattern


@dataclass(frozen=True)
class MemberSpec:
    """One member: ``name`` (also its address), group, index in the group, process number.

    ``initially_joined`` is False for a member whose first timed event is a ``join``.
    """

    name: str
    group: str
    index: int
    proc: int
    initially_joined: bool = True
    router: int = 0  # which of the federation's routers its stub connects to


@dataclass(frozen=True)
class Event:
    """A timed event, ``at`` seconds after sending starts.

    ``member`` is set for ``leave`` / ``join``, ``process`` for ``kill``; ``down`` (seconds
    between stop and start), ``signal`` (how the router is stopped) and ``router`` (which
    router of a federation, 0 without one) for ``restart-router``.
    """

    at: float
    action: Action
    member: str | None = None
    process: int | None = None
    down: float = 1.0
    signal: Literal["TERM", "KILL"] = "TERM"
    router: int = 0

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"at": self.at, "action": self.action}
        if self.action in ("leave", "join"):
            d["member"] = self.member
        elif self.action == "kill":
            d["process"] = self.process
        else:
            d["down"] = self.down
            d["signal"] = self.signal
            d["router"] = self.router
        return d

    def describe(self) -> str:
        """A few words for progress lines: ``leave g1-2``, ``kill process 2``, ..."""
        if self.action in ("leave", "join"):
            return f"{self.action} {self.member}"
        if self.action == "kill":
            return f"kill process {self.process}"
        which = f" {self.router}" if self.router else ""
        return f"restart router{which} (SIG{self.signal}, down {self.down:g} s)"


@dataclass(frozen=True)
class StubOptions:
    """RouterStub options used by the peers (the reconnect backoff is shorter than the
    stub's defaults so that a restarted router is rejoined within a second or two)."""

    receive_buffer: int = 65536
    send_timeout: float = 5.0
    reconnect_initial: float = 0.2
    reconnect_max: float = 2.0

    def to_dict(self) -> dict[str, Any]:
        return {"receive_buffer": self.receive_buffer, "send_timeout": self.send_timeout,
                "reconnect_initial": self.reconnect_initial,
                "reconnect_max": self.reconnect_max}


@dataclass(frozen=True)
class Scenario:
    """A validated scenario. Build it with :func:`load_scenario` or :func:`parse_scenario`."""

    name: str
    duration: float
    groups: tuple[GroupSpec, ...]
    description: str = ""
    drain: float = 2.0
    seed: int = 0
    processes: int = 1
    stubs: StubSharing = "per-member"
    receive_only: frozenset[int] = frozenset()
    stub: StubOptions = StubOptions()
    router_args: tuple[str, ...] = ()
    # Routers federated through a spawned mosquitto; 0: one router, no broker.
    federation: int = 0
    events: tuple[Event, ...] = ()
    # Hostile clients run beside the members (gossiprouter.loadtest.attacks); not members.
    attacks: tuple[AttackSpec, ...] = ()
    thresholds: tuple[tuple[str, float], ...] = ()
    """(key of THRESHOLD_KEYS, milliseconds), in THRESHOLD_KEYS order."""
    source: str = "<scenario>"
    members: tuple[MemberSpec, ...] = field(default=(), compare=False)

    def member(self, name: str) -> MemberSpec:
        """The member called ``name`` (KeyError if none)."""
        for m in self.members:
            if m.name == name:
                return m
        raise KeyError(name)

    def group(self, name: str) -> GroupSpec:
        """The group called ``name`` (KeyError if none)."""
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(name)

    def members_of_process(self, proc: int) -> list[MemberSpec]:
        return [m for m in self.members if m.proc == proc]

    def members_of_group(self, group: str) -> list[MemberSpec]:
        return [m for m in self.members if m.group == group]

    def to_dict(self) -> dict[str, Any]:
        """The scenario as a complete TOML-shaped mapping (every default filled in);
        :func:`parse_scenario` turns it back into an equal Scenario. JSON-serialisable."""
        return {
            "name": self.name,
            "description": self.description,
            "duration": self.duration,
            "drain": self.drain,
            "seed": self.seed,
            "peers": {"processes": self.processes, "stubs": self.stubs,
                      "receive_only": sorted(self.receive_only)},
            "stub": self.stub.to_dict(),
            "router": {"args": list(self.router_args)},
            **({"federation": {"routers": self.federation}} if self.federation else {}),
            # The global [send] is folded into each group: that is all the peers need.
            "groups": [{"name": g.name, "members": g.members, **g.send.to_dict()}
                       for g in self.groups],
            "events": [e.to_dict() for e in self.events],
            "attacks": [a.to_dict() for a in self.attacks],
            "thresholds": dict(self.thresholds),
        }


# --------------------------------------------------------------------------- loading


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate the scenario file at ``path``; :class:`ScenarioError` if unusable."""
    p = Path(path)
    source = p.name
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ScenarioError(f"{path}: no such scenario file") from None
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read the scenario file: {e.strerror or e}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ScenarioError(f"{source}: not valid TOML: the file is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{source}: not valid TOML: {e}") from None
    return parse_scenario(data, source=source, default_name=p.stem)


def parse_thresholds(value: Any, source: str) -> tuple[tuple[str, float], ...]:
    """The ``[thresholds]`` table of a scenario (either kind): ``p99_ms = 50`` and the
    like; :class:`ScenarioError` naming the key, the value and what was expected."""
    p = _Parser(source)
    if not isinstance(value, Mapping):
        raise p.error("thresholds", "a table such as [thresholds] p99_ms = 50", value)
    p.check_keys(value, "[thresholds]", THRESHOLD_KEYS)
    return tuple((k, p.number(value, k, f"thresholds.{k}", 0.0, low=0, high=MAX_THRESHOLD_MS,
                              low_open=True))
                 for k in THRESHOLD_KEYS if k in value)


def parse_scenario(
    data: Mapping[str, Any], *, source: str = "<scenario>", default_name: str = "scenario"
) -> Scenario:
    """Validate a TOML-shaped mapping (see the module docstring) and build the Scenario."""
    return _Parser(source).scenario(data, default_name)


# --------------------------------------------------------------------------- validation


def _show(value: Any) -> str:
    """A short rendering of a bad value for an error message."""
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list) and len(repr(value)) > 60:
        return f"a list of {len(value)} values"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_number(value: Any) -> bool:
    # TOML booleans are Python bools, which are ints: a rate of ``true`` is a mistake.
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, key: str, expected: str, value: Any) -> ScenarioError:
        return ScenarioError(f"{self.source}: {key}: expected {expected}, got {_show(value)}")

    def fail(self, key: str, message: str) -> ScenarioError:
        return ScenarioError(f"{self.source}: {key}: {message}")

    def check_keys(self, table: Mapping[str, Any], where: str, allowed: Sequence[str]) -> None:
        for key in table:
            if key not in allowed:
                place = f" in {where}" if where else ""
                raise ScenarioError(
                    f"{self.source}: unknown key {key!r}{place} "
                    f"(expected one of: {', '.join(allowed)})")

    def table(self, data: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
        value = data.get(key, {})
        if not isinstance(value, Mapping):
            raise self.error(path, "a table", value)
        return value

    def number(self, data: Mapping[str, Any], key: str, path: str, default: float | None, *,
               low: float, high: float, low_open: bool = False) -> float:
        if key not in data:
            if default is None:
                raise self.fail(path, "missing (a number of seconds is required)")
            return default
        value = data[key]
        low_s = f"> {low:g}" if low_open else f">= {low:g}"
        expected = f"a number {low_s} and <= {high:g}"
        if not _is_number(value) or not math.isfinite(value):
            raise self.error(path, expected, value)
        if value > high or value < low or (low_open and value == low):
            raise self.error(path, expected, value)
        return float(value)

    def integer(self, data: Mapping[str, Any], key: str, path: str, default: int, *,
                low: int, high: int) -> int:
        value = data.get(key, default)
        if not _is_int(value) or not low <= value <= high:
            raise self.error(path, f"an integer from {low} to {high}", value)
        return int(value)

    def choice(self, data: Mapping[str, Any], key: str, path: str, default: str,
               choices: Sequence[str]) -> str:
        value = data.get(key, default)
        if value not in choices or not isinstance(value, str):
            raise self.error(path, "one of " + ", ".join(f'"{c}"' for c in choices), value)
        return value

    # -- top level --------------------------------------------------------------------------

    def scenario(self, data: Mapping[str, Any], default_name: str) -> Scenario:
        if not isinstance(data, Mapping):
            raise ScenarioError(f"{self.source}: expected a TOML table at the top level")
        self.check_keys(data, "", ("name", "description", "duration", "drain", "seed",
                                   "peers", "send", "stub", "router", "federation",
                                   "groups", "events", "attacks", "thresholds"))
        name = data.get("name", default_name)
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
            raise self.error("name", "1 to 64 letters, digits, '_', '.' or '-'", name)
        description = data.get("description", "")
        if not isinstance(description, str):
            raise self.error("description", "a string", description)
        duration = self.number(data, "duration", "duration", None, low=0, high=MAX_DURATION,
                               low_open=True)
        drain = self.number(data, "drain", "drain", 2.0, low=0, high=600)
        seed = self.integer(data, "seed", "seed", 0, low=0, high=2**63 - 1)

        peers = self.table(data, "peers", "peers")
        self.check_keys(peers, "[peers]", ("processes", "stubs", "receive_only"))
        processes = self.integer(peers, "processes", "peers.processes", 1, low=1,
                                 high=MAX_PROCESSES)
        stubs = self.choice(peers, "stubs", "peers.stubs", "per-member",
                            ("per-member", "per-process"))
        receive_only = peers.get("receive_only", [])
        if not isinstance(receive_only, list) or not all(
                _is_int(p) and 0 <= p < processes for p in receive_only):
            raise self.error("peers.receive_only",
                             f"a list of process numbers from 0 to {processes - 1}", receive_only)

        send = self.table(data, "send", "send")
        self.check_keys(send, "[send]", ("rate", "sizes", "unicast"))
        default_send = self.send_pattern(send, "send", SendPattern())

        stub_t = self.table(data, "stub", "stub")
        self.check_keys(stub_t, "[stub]", ("receive_buffer", "send_timeout",
                                           "reconnect_initial", "reconnect_max"))
        stub = StubOptions(
            receive_buffer=self.integer(stub_t, "receive_buffer", "stub.receive_buffer", 65536,
                                        low=1, high=10_000_000),
            send_timeout=self.number(stub_t, "send_timeout", "stub.send_timeout", 5.0,
                                     low=0, high=600, low_open=True),
            reconnect_initial=self.number(stub_t, "reconnect_initial", "stub.reconnect_initial",
                                          0.2, low=0, high=600),
            reconnect_max=self.number(stub_t, "reconnect_max", "stub.reconnect_max", 2.0,
                                      low=0, high=3600, low_open=True),
        )

        router = self.table(data, "router", "router")
        self.check_keys(router, "[router]", ("args",))
        router_args = router.get("args", [])
        if not isinstance(router_args, list) or not all(isinstance(a, str) for a in router_args):
            raise self.error("router.args", "a list of strings (extra options for the "
                             "spawned router's serve command)", router_args)
        for forbidden in ("--host", "--port", "--config"):
            if any(a == forbidden or a.startswith(forbidden + "=") for a in router_args):
                raise self.error("router.args", f"options other than {forbidden} (the tool "
                                 "sets the address itself)", router_args)

        fed = self.table(data, "federation", "federation")
        self.check_keys(fed, "[federation]", ("routers",))
        federation = 0
        if "federation" in data:
            federation = self.integer(fed, "routers", "federation.routers", 2, low=2,
                                      high=MAX_ROUTERS)
            if "--bridge" in router_args or any(a.startswith("--bridge=") for a in router_args):
                raise self.error("router.args", "no --bridge with [federation] (the tool "
                                 "starts the broker and bridges the routers itself)",
                                 router_args)

        groups = self.groups(data, default_send)
        members = self.assign(groups, processes, max(1, federation))
        if processes > len(members):
            raise self.error("peers.processes", f"at most {len(members)} (the number of "
                             "members: a process without members has nothing to do)",
                             processes)
        events = self.events(data, duration, processes, members, max(1, federation))
        from gossiprouter.loadtest.attacks import parse_attacks  # it imports this module
        attacks = parse_attacks(data.get("attacks", []), self.source)
        thresholds = parse_thresholds(data.get("thresholds", {}), self.source)
        first: dict[str, str] = {}
        for e in events:
            if e.member is not None:
                first.setdefault(e.member, e.action)
        members = [
            MemberSpec(m.name, m.group, m.index, m.proc, first.get(m.name) != "join", m.router)
            for m in members
        ]
        return Scenario(
            name=name, description=description, duration=duration, drain=drain, seed=seed,
            processes=processes, stubs=stubs,  # type: ignore[arg-type]
            receive_only=frozenset(receive_only), stub=stub, router_args=tuple(router_args),
            federation=federation,
            groups=tuple(groups), events=tuple(events), attacks=attacks,
            thresholds=thresholds, source=self.source,
            members=tuple(members),
        )

    # -- send patterns ------------------------------------------------------------------------

    def send_pattern(self, t: Mapping[str, Any], where: str, base: SendPattern) -> SendPattern:
        rate: float | None = base.rate
        if "rate" in t:
            value = t["rate"]
            if value == "max":
                rate = None
            elif (_is_number(value) and math.isfinite(value) and 0 < value <= MAX_RATE):
                rate = float(value)
            else:
                raise self.error(f"{where}.rate",
                                 f'a number > 0 and <= {MAX_RATE:g} (messages per second per '
                                 'member) or "max"', value)
        sizes, size_range = base.sizes, base.size_range
        if "sizes" in t:
            sizes, size_range = self.sizes(t["sizes"], f"{where}.sizes")
        unicast = base.unicast
        if "unicast" in t:
            value = t["unicast"]
            if not _is_number(value) or not 0 <= value <= 1:
                raise self.error(f"{where}.unicast",
                                 "a fraction from 0 to 1 (the share of unicast messages)", value)
            unicast = float(value)
        return SendPattern(rate, sizes, size_range, unicast)

    def sizes(self, value: Any, key: str) -> tuple[tuple[int, ...] | None,
                                                    tuple[int, int] | None]:
        def ok(v: Any) -> bool:
            return _is_int(v) and MIN_PAYLOAD <= v <= MAX_PAYLOAD

        span = f"from {MIN_PAYLOAD} to {MAX_PAYLOAD}"
        if _is_int(value):
            if not ok(value):
                raise self.error(key, f"a payload size in bytes {span}", value)
            return (value,), None
        if isinstance(value, list):
            if not value or not all(ok(v) for v in value):
                raise self.error(key, f"a non-empty list of payload sizes in bytes {span}",
                                 value)
            return tuple(value), None
        if isinstance(value, Mapping):
            self.check_keys(value, key, ("min", "max"))
            lo, hi = value.get("min"), value.get("max")
            if not ok(lo):
                raise self.error(f"{key}.min", f"a payload size in bytes {span}", lo)
            if not ok(hi):
                raise self.error(f"{key}.max", f"a payload size in bytes {span}", hi)
            assert isinstance(lo, int) and isinstance(hi, int)
            if hi < lo:
                raise self.error(f"{key}.max", f"a size >= min ({lo})", hi)
            return None, (lo, hi)
        raise self.error(key, f"a size, a list of sizes or a table {{min = ..., max = ...}} "
                         f"(bytes, {span})", value)

    # -- groups -----------------------------------------------------------------------------

    def groups(self, data: Mapping[str, Any], default_send: SendPattern) -> list[GroupSpec]:
        raw = data.get("groups")
        if raw is None:
            raise self.fail("groups", "missing (expected at least one [[groups]] table with "
                            "name and members)")
        if not isinstance(raw, list) or not raw or not all(isinstance(g, Mapping) for g in raw):
            raise self.error("groups", "a non-empty array of tables ([[groups]])", raw)
        groups: list[GroupSpec] = []
        seen: set[str] = set()
        total = 0
        for i, g in enumerate(raw):
            where = f"groups[{i}]"
            self.check_keys(g, where, ("name", "members", "rate", "sizes", "unicast"))
            name = g.get("name")
            if (not isinstance(name, str) or len(name) > MAX_GROUP_NAME
                    or not _GROUP_NAME.fullmatch(name)):
                raise self.error(f"{where}.name", f"1 to {MAX_GROUP_NAME} letters, digits, '_' "
                                 "or '.'", name)
            if name in seen:
                raise self.error(f"{where}.name", "a name not used by another group", name)
            seen.add(name)
            if "members" not in g:
                raise self.fail(f"{where}.members", "missing (the number of members)")
            members = self.integer(g, "members", f"{where}.members", 0, low=1,
                                   high=MAX_MEMBERS_PER_GROUP)
            send = self.send_pattern(g, where, default_send)
            if send.unicast > 0 and members < 2:
                raise self.error(f"{where}.unicast", "0 for a group of one member (a unicast "
                                 "needs another member)", send.unicast)
            total += members
            if total > MAX_MEMBERS:
                raise self.error(f"{where}.members", f"at most {MAX_MEMBERS} members over all "
                                 "groups", members)
            groups.append(GroupSpec(name, members, send))
        return groups

    @staticmethod
    def assign(groups: Sequence[GroupSpec], processes: int, routers: int) -> list[MemberSpec]:
        out: list[MemberSpec] = []
        for g in groups:
            for i in range(g.members):
                out.append(MemberSpec(f"{g.name}-{i}", g.name, i, len(out) % processes,
                                      router=len(out) % routers))
        return out

    # -- events -----------------------------------------------------------------------------

    def events(self, data: Mapping[str, Any], duration: float, processes: int,
               members: Sequence[MemberSpec], routers: int) -> list[Event]:
        raw = data.get("events", [])
        if not isinstance(raw, list) or not all(isinstance(e, Mapping) for e in raw):
            raise self.error("events", "an array of tables ([[events]])", raw)
        by_name = {m.name: m for m in members}
        parsed: list[tuple[float, int, Event]] = []
        for i, e in enumerate(raw):
            where = f"events[{i}]"
            action = e.get("action")
            if action not in ACTIONS:
                raise self.error(f"{where}.action", "one of " + ", ".join(
                    f'"{a}"' for a in ACTIONS), action)
            if action in ("leave", "join"):
                allowed: tuple[str, ...] = ("at", "action", "member")
            elif action == "kill":
                allowed = ("at", "action", "process")
            else:
                allowed = ("at", "action", "down", "signal", "router")
            self.check_keys(e, f"{where} (action {action!r})", allowed)
            if "at" not in e:
                raise self.fail(f"{where}.at", "missing (seconds after sending starts)")
            at = e["at"]
            if not _is_number(at) or not 0 <= at < duration:
                raise self.error(f"{where}.at", f"a number of seconds >= 0 and < the duration "
                                 f"({duration:g})", at)
            if action in ("leave", "join"):
                member = e.get("member")
                if member not in by_name:
                    some = ", ".join(list(by_name)[:4]) + (", ..." if len(by_name) > 4 else "")
                    raise self.error(f"{where}.member", f"the name of a member ({some})",
                                     member)
                ev = Event(float(at), action, member=member)
            elif action == "kill":
                if "process" not in e:
                    raise self.fail(f"{where}.process", "missing (the number of the peer "
                                    "process to kill)")
                proc = self.integer(e, "process", f"{where}.process", 0, low=0,
                                    high=processes - 1)
                ev = Event(float(at), action, process=proc)
            else:
                down = self.number(e, "down", f"{where}.down", 1.0, low=0, high=600)
                sig = self.choice(e, "signal", f"{where}.signal", "TERM", ("TERM", "KILL"))
                which = self.integer(e, "router", f"{where}.router", 0, low=0, high=routers - 1)
                ev = Event(float(at), action, down=down, signal=sig,  # type: ignore[arg-type]
                           router=which)
            parsed.append((ev.at, i, ev))
        parsed.sort(key=lambda x: (x[0], x[1]))
        self.simulate([(i, ev) for _, i, ev in parsed], members)
        return [ev for _, _, ev in parsed]

    def simulate(self, events: Sequence[tuple[int, Event]],
                 members: Sequence[MemberSpec]) -> None:
        """Play the events in time order and refuse impossible ones (leave while absent, ...)."""
        first: dict[str, str] = {}
        for _, e in events:
            if e.member is not None:
                first.setdefault(e.member, e.action)
        joined = {m.name: first.get(m.name) != "join" for m in members}
        proc_of = {m.name: m.proc for m in members}
        killed: dict[int, float] = {}
        for i, e in events:
            where = f"events[{i}]"
            if e.action == "kill":
                assert e.process is not None
                if e.process in killed:
                    raise self.fail(f"{where}.process", f"process {e.process} is already killed "
                                    f"at {killed[e.process]:g} s")
                killed[e.process] = e.at
            elif e.member is not None:
                proc = proc_of[e.member]
                if proc in killed:
                    raise self.fail(f"{where}.member", f"{e.member!r} cannot {e.action} at "
                                    f"{e.at:g} s: its process {proc} is killed at "
                                    f"{killed[proc]:g} s")
                if e.action == "leave" and not joined[e.member]:
                    raise self.fail(f"{where}.member", f"{e.member!r} cannot leave at "
                                    f"{e.at:g} s: it is not joined then")
                if e.action == "join" and joined[e.member]:
                    raise self.fail(f"{where}.member", f"{e.member!r} cannot join at {e.at:g} s: "
                                    "it is already joined then (a member whose first event is "
                                    "'join' starts absent)")
                joined[e.member] = e.action == "join"
