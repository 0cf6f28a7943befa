"""Reading a load-test scenario: the TOML file, its validation and the plans derived from it.

:func:`load_scenario` reads a file, :func:`parse_scenario` a mapping (the driver hands the
peers the normalised mapping of :meth:`~gossiprouter.loadtest.scenario.Scenario.to_dict`, so
both sides go through the same validation); both give a
:class:`~gossiprouter.loadtest.scenario.Scenario` (the model and the format's limits:
:mod:`gossiprouter.loadtest.scenario`). Besides checking every value, the validation derives
the plan of the run: which process and which router carry each member (round-robin, in file
order), and whether the timed events can be played in their order (no leave while absent,
nothing for a member of a killed process, ...).

Every mistake raises :class:`~gossiprouter.loadtest.scenario_checks.ScenarioError` whose
message is one line naming the file, the key, the value found and what was expected, e.g.
``small.toml: send.rate: expected a number > 0 or "max", got -5``.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from gossiprouter.loadtest.attacks.spec import parse_attacks
from gossiprouter.loadtest.scenario import (
    ACTIONS,
    MAX_DURATION,
    MAX_GROUP_NAME,
    MAX_MEMBERS,
    MAX_MEMBERS_PER_GROUP,
    MAX_PAYLOAD,
    MAX_PROCESSES,
    MAX_RATE,
    MAX_ROUTERS,
    MAX_THRESHOLD_MS,
    MIN_PAYLOAD,
    THRESHOLD_KEYS,
    Event,
    GroupSpec,
    MemberSpec,
    Scenario,
    SendPattern,
    StubOptions,
)
from gossiprouter.loadtest.scenario_checks import Checker, ScenarioError, is_int, is_number

__all__ = ["load_scenario", "parse_scenario", "parse_thresholds"]

_GROUP_NAME: Final = re.compile(r"[A-Za-z0-9_.]+")


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
    p = Checker(source)
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


class _Parser(Checker):
    """The whole scenario, table by table, on top of the value checks of :class:`Checker`."""

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
                is_int(p) and 0 <= p < processes for p in receive_only):
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
            elif (is_number(value) and math.isfinite(value) and 0 < value <= MAX_RATE):
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
            if not is_number(value) or not 0 <= value <= 1:
                raise self.error(f"{where}.unicast",
                                 "a fraction from 0 to 1 (the share of unicast messages)", value)
            unicast = float(value)
        return SendPattern(rate, sizes, size_range, unicast)

    def sizes(self, value: Any, key: str) -> tuple[tuple[int, ...] | None,
                                                    tuple[int, int] | None]:
        def ok(v: Any) -> bool:
            return is_int(v) and MIN_PAYLOAD <= v <= MAX_PAYLOAD

        span = f"from {MIN_PAYLOAD} to {MAX_PAYLOAD}"
        if is_int(value):
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
            if not is_number(at) or not 0 <= at < duration:
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
