"""Hostile clients for load tests: floods, partial frames, huge names, watch floods, admin polling.

A scenario may list ``[[attacks]]`` next to its honest groups (``scripts/scenarios/hostile.toml``).
Attackers are not members: they never appear in the records or the membership timeline, so
``gossiprouter analyze`` audits only the honest members, and "0 lost" means the attacks cost
the honest members nothing. Each table has a ``kind`` and the options below (defaults in
brackets)::

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

All attacks start with sending and stop at the end of the sending phase. They run in their own
process (``python -m gossiprouter.loadtest.attacks CONFIG``, started by the driver), so their
CPU does not slow the honest peers' event loops; the process writes its counters to
``RUN_DIR/attacks.json`` (connections opened, closed by the router, bytes each way, refusals,
admin answers and their slowest time) and its log to ``RUN_DIR/logs/attacks.log``.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import trio

from gossiprouter.loadtest.resources import metrics_option

__all__ = ["KINDS", "AttackRunner", "AttackSpec", "parse_attacks"]

log = logging.getLogger("gossiprouter.loadtest.attacks")

ATTACKS_FILE: Final = "attacks.json"
RECONNECT_DELAY: Final = 0.5  # before an attacker whose connection was closed tries again
MAX_NAME_BYTES: Final = 64 << 20
MiB: Final = 1 << 20

# Per kind: option -> (default, check, what the check expects). "max" is allowed where the
# default says so (a rate of None = unpaced).
_Check = Callable[[Any], bool]


def _int_in(lo: int, hi: int) -> tuple[_Check, str]:
    return (lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi,
            f"an integer from {lo} to {hi}")


def _num_in(lo: float, hi: float) -> tuple[_Check, str]:
    return (lambda v: isinstance(v, int | float) and not isinstance(v, bool)
            and math.isfinite(v) and lo < v <= hi, f"a number > {lo:g} and <= {hi:g}")


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
    from gossiprouter.loadtest.scenario import ScenarioError, _show

    def error(key: str, expected: str, value: Any) -> ScenarioError:
        return ScenarioError(f"{source}: {key}: expected {expected}, got {_show(value)}")

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


# --------------------------------------------------------------------------- the driver's side


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class AttackRunner:
    """What the driver needs: extra router options, and the attack process for the run."""

    def __init__(self, attacks: tuple[AttackSpec, ...], run_dir: Path, *,
                 router_args: tuple[str, ...], spawned: bool) -> None:
        self.attacks = attacks
        self.run_dir = run_dir
        self.metrics: str | None = None
        self.router_args: tuple[str, ...] = ()
        self.warnings: list[str] = []
        if not any(a.kind == "admin-poll" for a in attacks):
            return
        self.metrics = metrics_option(router_args)
        if self.metrics is None and spawned:
            self.metrics = f"127.0.0.1:{_free_port()}"
            self.router_args = ("--metrics", self.metrics)
        elif self.metrics is None:
            self.warnings.append("admin-poll attack skipped: the router's --metrics address "
                                 "is unknown (give it in router.args, or use --spawn-router)")

    @property
    def active(self) -> bool:
        return bool(self.attacks)

    async def run(self, router: str, t0_ns: int, end_ns: int,
                  say: Callable[[str], None]) -> None:
        """Run the attack process from ``t0_ns`` to ``end_ns``; never raises (an attacker
        that fails is reported, the honest run goes on)."""
        config = self.run_dir / "logs" / "attacks-config.json"
        config.write_text(json.dumps({
            "router": router, "metrics": self.metrics, "t0_ns": t0_ns, "end_ns": end_ns,
            "out": str(self.run_dir / ATTACKS_FILE),
            "attacks": [a.to_dict() for a in self.attacks]}))
        say(f"{len(self.attacks)} attacks start with sending: "
            + ", ".join(a.kind for a in self.attacks))
        with open(self.run_dir / "logs" / "attacks.log", "ab") as logf:
            result = await trio.run_process(
                command(config), stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                check=False, preexec_fn=block_sigterm)
        if result.returncode != 0:
            say(f"the attack process exited with status {result.returncode} (see logs/"
                "attacks.log)")
            return
        try:
            summary = json.loads((self.run_dir / ATTACKS_FILE).read_text())
        except (OSError, ValueError):
            return
        say("attacks done: " + "; ".join(_describe(a) for a in summary.get("attacks", [])))


def command(config: Path) -> list[str]:
    """The attack process for ``config``; start it with ``preexec_fn=block_sigterm``."""
    return [sys.executable, "-m", "gossiprouter.loadtest.attacks", str(config)]


def _describe(a: Mapping[str, Any]) -> str:
    c = a.get("counters", {})
    text = (f"{a.get('kind')}: {c.get('opened', 0)} connections, "
            f"{c.get('closed_by_router', 0)} closed by the router, "
            f"{c.get('bytes_out', 0) / MiB:.1f} MiB out")
    if a.get("kind") == "admin-poll":
        text += (f", {c.get('answers', 0)} answers (slowest {c.get('slowest_s', 0.0):.2f} s), "
                 f"{c.get('failures', 0)} failures")
    if c.get("refused"):
        text += f", {c['refused']} refused"
    return text


# --------------------------------------------------------------------------- the attack process


@dataclass
class Counters:
    opened: int = 0
    closed_by_router: int = 0
    connect_failures: int = 0
    bytes_out: int = 0
    bytes_in: int = 0
    refused: int = 0  # ERROR / OP_FAIL answers (a limit, a bad name, ...)
    answers: int = 0  # admin-poll: 200 answers
    failures: int = 0  # admin-poll: anything else
    slowest_s: float = 0.0  # admin-poll: the slowest answer


class _Closed(Exception):
    """The router closed (or reset) the attacker's connection."""


class Attack:
    def __init__(self, spec: AttackSpec, host: str, port: int, metrics: str | None) -> None:
        self.spec, self.host, self.port, self.metrics = spec, host, port, metrics
        self.c = Counters()

    async def open(self) -> trio.SocketStream:
        try:
            s = await trio.open_tcp_stream(self.host, self.port)
        except OSError:
            self.c.connect_failures += 1
            raise _Closed from None
        self.c.opened += 1
        return s

    async def send(self, s: trio.SocketStream, data: bytes) -> None:
        try:
            await s.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            raise _Closed from None
        if not self.c.bytes_out:
            log.info("%s: first bytes sent", self.spec.kind)  # the attack is under way
        self.c.bytes_out += len(data)

    async def drain(self, s: trio.SocketStream, on_data: Callable[[bytes], None] | None = None
                    ) -> None:
        """Read and count what the router sends until it closes the connection."""
        try:
            while data := await s.receive_some(1 << 20):
                self.c.bytes_in += len(data)
                if on_data is not None:
                    on_data(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        raise _Closed

    async def session(self, body: Callable[[trio.SocketStream], Awaitable[None]],
                      on_data: Callable[[bytes], None] | None = None) -> None:
        """Open a connection and run ``body`` while reading; again after the router closes
        it (until the attack's deadline cancels everything)."""
        while True:
            try:
                s = await self.open()
                try:
                    async with trio.open_nursery() as n:
                        async def reader(s: trio.SocketStream = s) -> None:
                            await self.drain(s, on_data)

                        n.start_soon(reader)
                        await body(s)
                        await trio.sleep_forever()
                finally:
                    await trio.aclose_forcefully(s)
            except* _Closed:
                self.c.closed_by_router += 1
            await trio.sleep(RECONNECT_DELAY)

    async def run(self) -> None:
        raise NotImplementedError


def _native_hello() -> bytes:
    from gossiprouter.protocol import native as wire
    return wire.PREAMBLE + wire.encode(wire.Hello((1,), "loadtest-attacker"))


class Flood(Attack):
    """PINGs (native) or HEARTBEATs (5.x) at bytes_per_s, in writes of ``burst`` bytes."""

    async def run(self) -> None:
        from gossiprouter.protocol import jgroups5 as j5
        from gossiprouter.protocol import native as wire
        if self.spec.kind == "ping-flood":
            head, frame = _native_hello(), wire.encode(wire.Ping(1))
        else:
            head, frame = b"", j5.heartbeat()
        chunk = frame * max(1, self.spec["burst"] // len(frame))
        rate = self.spec["bytes_per_s"]

        async def body(s: trio.SocketStream) -> None:
            if head:
                await self.send(s, head)
            start, sent = trio.current_time(), 0
            while True:
                if rate != "max":
                    await trio.sleep_until(start + sent / rate)
                await self.send(s, chunk)
                sent += len(chunk)

        async with trio.open_nursery() as n:
            for _ in range(self.spec["connections"]):
                n.start_soon(self.session, body)


class PartialFrames(Attack):
    async def run(self) -> None:
        from gossiprouter.protocol import jgroups2 as j2
        from gossiprouter.protocol import jgroups5 as j5
        size = self.spec["size"]
        protos = (["native", "jgroups2", "jgroups5"] if self.spec["protocol"] == "mixed"
                  else [self.spec["protocol"]])
        # Each: the start of one frame of exactly ``size`` bytes (what max_frame is checked
        # against: the body after the length for native and 5.x, the GossipData for 2.12),
        # all but its last byte.
        over2 = len(j2.message("hostile", None, b""))
        over5 = len(j5.message("hostile", None, None, b"")) - 4
        starts = {
            "native": _native_hello()[:4] + struct.pack(">I", size) + bytes(size - 1),
            "jgroups2": j2.message("hostile", None, bytes(max(0, size - over2)))[:-1],
            "jgroups5": j5.message("hostile", None, None, bytes(max(0, size - over5)))[:-1],
        }
        piece = 1 << 20

        async def one(proto: str) -> None:
            async def body(s: trio.SocketStream) -> None:
                data = starts[proto]
                for i in range(0, len(data), piece):  # counted as it goes
                    await self.send(s, data[i:i + piece])
                await trio.sleep(self.spec["hold"])
                raise _Hold

            while True:
                try:
                    await self.session(body)
                except* _Hold:
                    pass  # held long enough: close it ourselves and start again

        async with trio.open_nursery() as n:
            for i in range(self.spec["connections"]):
                n.start_soon(one, protos[i % len(protos)])


class _Hold(Exception):
    """A partial-frame connection was held for its time: close it and open another."""


class HugeNames(Attack):
    def frames(self, i: int) -> tuple[bytes, bytes]:
        """Member ``i``'s registration (after the native HELLO) and its member query."""
        from gossiprouter.protocol import jgroups2 as j2
        from gossiprouter.protocol import jgroups5 as j5
        from gossiprouter.protocol import native as wire
        from gossiprouter.protocol.jgroups_common import V2, V5, JAddress
        proto, group, nbytes = self.spec["protocol"], self.spec["group"], self.spec["name_bytes"]
        if proto == "native":
            reg = _native_hello() + wire.encode(wire.Connect(
                1, group, b"hostile-%d" % i, chr(0x41 + i % 26) * nbytes, ()))
            return reg, wire.encode(wire.GetMembers(2, group))
        # The codec writes NUL as C0 80; a placeholder swapped for raw 00 bytes afterwards
        # gives a name the router reads as NULs and must write back twice as long.
        nul = self.spec["raw_nul"]
        name = "\x1a" * nbytes if nul else chr(0x41 + i % 26) * nbytes
        if proto == "jgroups2":
            addr = JAddress.from_uuid(0x686F7374 + i, 0x696C65 + i, version=V2)
            reg, query = j2.connect(group, addr, name, []), j2.gossip_get(group)
        else:
            addr = JAddress.from_uuid(0x686F7374 + i, 0x696C65 + i, version=V5)
            reg = j5.register(group, addr, name, None)
            query = j5.get_members(group) + j5.get_members(None)
        if nul:
            reg = reg.replace(b"\x1a" * nbytes, bytes(nbytes))
        return reg, query

    async def run(self) -> None:
        from gossiprouter.protocol import jgroups2 as j2
        proto = self.spec["protocol"]

        from gossiprouter.protocol import native as wire
        dec = wire.Decoder(max_frame=64 * MiB)

        def count_refusals(data: bytes) -> None:
            # 2.12 answers a refused CONNECT with the OP_FAIL status byte, native with ERROR
            # (5.x has no answer to REGISTER).
            if proto == "jgroups2" and data[:1] == bytes([j2.OP_FAIL]):
                self.c.refused += 1
            elif proto == "native":
                dec.feed(data)
                self.c.refused += sum(isinstance(f, wire.Error) for f in dec.frames())

        async def member(i: int) -> None:
            reg, query = self.frames(i)

            async def body(s: trio.SocketStream) -> None:
                await self.send(s, reg)
                while True:
                    await trio.sleep(self.spec["query_interval"])
                    await self.send(s, query)

            await self.session(body, count_refusals)

        async with trio.open_nursery() as n:
            for i in range(self.spec["members"]):
                n.start_soon(member, i)


class WatchFlood(Attack):
    async def run(self) -> None:
        from gossiprouter.protocol import native as wire
        rate, groups = self.spec["watches_per_s"], self.spec["groups"]
        dec = wire.Decoder(max_frame=64 * MiB)

        def answers(data: bytes) -> None:
            dec.feed(data)
            for f in dec.frames():
                if isinstance(f, wire.Error):
                    self.c.refused += 1

        async def body(s: trio.SocketStream) -> None:
            await self.send(s, _native_hello())
            start, batch = trio.current_time(), 1000
            for first in range(0, groups, batch):
                if rate != "max":
                    await trio.sleep_until(start + first / rate)
                await self.send(s, b"".join(
                    wire.encode(wire.Watch(i + 1, f"watched-{i}"))
                    for i in range(first, min(groups, first + batch))))

        await self.session(body, answers)


class AdminPoll(Attack):
    async def run(self) -> None:
        if self.metrics is None:
            return
        host, _, port = self.metrics.rpartition(":")
        while True:
            for path in self.spec["paths"]:
                t = trio.current_time()
                status = await self.get(host, int(port), path)
                took = trio.current_time() - t
                if status == 200:
                    self.c.answers += 1
                    self.c.slowest_s = max(self.c.slowest_s, took)
                else:
                    self.c.failures += 1
            await trio.sleep(self.spec["interval"])

    async def get(self, host: str, port: int, path: str) -> int:
        try:
            s = await trio.open_tcp_stream(host, port)
        except OSError:
            return 0
        self.c.opened += 1
        buf = bytearray()
        try:
            request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
            await s.send_all(request.encode())
            while data := await s.receive_some(1 << 20):
                buf += data
        except (trio.BrokenResourceError, OSError):
            pass
        finally:
            await trio.aclose_forcefully(s)
        self.c.bytes_in += len(buf)
        try:
            return int(buf.split(b" ", 2)[1])
        except (IndexError, ValueError):
            return 0


_CLASSES: Final[dict[str, type[Attack]]] = {
    "ping-flood": Flood, "heartbeat-flood": Flood, "partial-frames": PartialFrames,
    "huge-names": HugeNames, "watch-flood": WatchFlood, "admin-poll": AdminPoll,
}


def _attacks(config: dict[str, Any]) -> list[Attack]:
    host, _, port = str(config["router"]).rpartition(":")
    specs = parse_attacks(config["attacks"], "<driver config>")
    return [_CLASSES[s.kind](s, host, int(port), config.get("metrics")) for s in specs]


def _results(attacks: list[Attack]) -> list[dict[str, Any]]:
    return [{**a.spec.to_dict(), "counters": a.c.__dict__} for a in attacks]


async def run_attacks(config: dict[str, Any], stop_on_sigterm: bool = False,
                      attacks: list[Attack] | None = None) -> list[dict[str, Any]]:
    """Run every attack of ``config`` (or ``attacks``, made from it) from t0_ns to end_ns
    (time.monotonic_ns clock), or until SIGTERM with ``stop_on_sigterm``."""
    from gossiprouter.loadtest.peer import trio_time_at
    attacks = _attacks(config) if attacks is None else attacks
    with trio.move_on_at(trio_time_at(int(config["end_ns"]))) as scope:
        async with trio.open_nursery() as n:
            if stop_on_sigterm:
                await n.start(_stop_on_sigterm, scope)
            await trio.sleep_until(trio_time_at(int(config["t0_ns"])))
            for a in attacks:
                n.start_soon(a.run)
    return _results(attacks)


# Set by main()'s first handler: a SIGTERM that came before trio listened for it.
_early_sigterm = False


def _note_sigterm(signum: int, frame: object) -> None:
    global _early_sigterm
    _early_sigterm = True


def block_sigterm() -> None:
    """``preexec_fn`` of the attack process: SIGTERM stays pending until main() has a
    handler, so a driver that stops the process while Python is still importing does not
    kill it before it writes attacks.json (the mask is inherited across exec)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


async def _stop_on_sigterm(scope: trio.CancelScope, *,
                           task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                           ) -> None:
    """The driver stops the attack process with SIGTERM when a run fails (the router died,
    say): stop attacking, but still write the counters."""
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        task_status.started()
        if not _early_sigterm:
            await signals.__anext__()
        log.warning("SIGTERM: stopping the attacks")
        scope.cancel()


def main() -> None:
    # First of all: from here a SIGTERM is noted, not fatal (block_sigterm held it until now).
    signal.signal(signal.SIGTERM, _note_sigterm)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = json.loads(Path(sys.argv[1]).read_text())
    t = time.monotonic()
    attacks = _attacks(config)
    try:
        trio.run(run_attacks, config, True, attacks)
    finally:
        # On any exit, an attack's failure included: the counters of what was done.
        results = _results(attacks)
        Path(config["out"]).write_text(json.dumps({"attacks": results}, indent=2) + "\n")
    for r in results:
        log.info("%s", _describe(r))
    log.info("attacks ran for %.1f s", time.monotonic() - t)


if __name__ == "__main__":
    main()
