"""Load-test scenarios: the model of the TOML format that scripts the peers.

A scenario says which groups exist and how many members each has, how many peer processes
carry those members, how every member sends (rate, payload sizes, unicast/multicast mix), for
how long, and what happens at given times (a member leaves or joins, a peer process is killed,
the router is restarted). :class:`Scenario` is a validated one: read it with
:func:`gossiprouter.loadtest.scenario_file.load_scenario` (a file) or
:func:`~gossiprouter.loadtest.scenario_file.parse_scenario` (a mapping; the driver hands the
peers the normalised mapping of :meth:`Scenario.to_dict`, so both sides go through the same
validation).

Members are named ``{group}-{i}`` (``i`` from 0) and are spread round-robin over the
processes in file order (all members of the first group, then the second, ...): member
number ``k`` overall lives in process ``k % processes``, so each process holds members of
several groups. A member whose first timed event is a ``join`` starts absent; every other
member joins before sending starts. With ``[federation] routers = N`` the run spawns N routers
federated through a mosquitto, and member number ``k`` overall connects to router ``k % N``
(so every group spans the routers). Format reference: ``docs/loadtest.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal

from gossiprouter.loadtest.attacks.spec import AttackSpec

__all__ = [
    "ACTIONS",
    "MAX_PAYLOAD",
    "MIN_PAYLOAD",
    "THRESHOLD_KEYS",
    "Event",
    "GroupSpec",
    "MemberSpec",
    "Scenario",
    "SendPattern",
    "StubOptions",
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
# [thresholds]: the most a latency percentile of the run may be, in milliseconds, as k6's
# thresholds (``p(99)<50``); the analysis fails the verdict when one is exceeded.
THRESHOLD_KEYS: Final = ("p50_ms", "p90_ms", "p95_ms", "p99_ms", "p999_ms", "max_ms")
MAX_THRESHOLD_MS: Final = 600_000.0


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
    """A validated scenario. Build it with :func:`.scenario_file.load_scenario` or
    :func:`.scenario_file.parse_scenario`."""

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
        :func:`~gossiprouter.loadtest.scenario_file.parse_scenario` turns it back into an equal
        Scenario. JSON-serialisable."""
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
