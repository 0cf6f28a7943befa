"""gossiprouter against the Java JGroups 2.12 GossipRouter (``scripts/bench-vs-jgroups``).

Three routers take turns, each run on a fresh router process on 127.0.0.1:

* ``java``: ``org.jgroups.stack.GossipRouter`` from the Debian ``jgroups.jar`` (2.12.2),
  driven over the JGroups 2.12 protocol;
* ``gr-2.12``: ``python -m gossiprouter serve``, driven over the same JGroups 2.12 protocol;
* ``gr-native``: the same server, driven over gossiprouter's native protocol.

With ``--jgroups5 CLASSPATH`` (a local JGroups 5.x build: a jar or a classes directory; none is
shipped or built here) two more take part, as a fourth protocol column:

* ``java5``: ``org.jgroups.stack.GossipRouter`` from that classpath, with its defaults;
* ``gr-5``: gossiprouter driven over the JGroups 5.x protocol (``gossiprouter.protocol.jgroups5``).

and the light-load floor (issue 30), in every run unless ``--routers`` leaves it out:

* ``floor``: ``benchmarks/floor/relay.c``, a minimal single-threaded C epoll relay of the native
  framing (preamble, HELLO/WELCOME, CONNECT/OK, ROUTE forwarded byte for byte, nothing else),
  compiled with the system ``cc`` into ``build/`` on first use (``benchmarks/floor/build.py``)
  and driven over the native protocol by the same Blaster loaders, the same frames as
  ``gr-native``. What any relay pays per message in wake-ups and system calls: the
  ``gr ... / C floor`` columns are gossiprouter's distance to it. It answers no GET_MEMBERS, so
  its idle-case registrations are checked only by the loaders (each waits for its OK).

The load generator is ``benchmarks/jgroups/Blaster.java``, compiled on first use into
``benchmarks/jgroups/classes``. It is protocol-agnostic: this script pre-encodes every byte
sequence (registration, message frames, the router's replies) with the project's codecs
(``gossiprouter.protocol.jgroups2`` and ``native``) and hands them to several Blaster processes.
Senders write pre-encoded frames in large writes (or paced, stamped with
``System.nanoTime()``); receivers count frames (every delivered frame of a case has one known
length) and check a few fixed bytes of each.

Deliveries: a copy of a message that reaches a member other than its sender. A multicast in
the group of 8 therefore makes 7 deliveries with every router. The 2.12 routers (Java, and
gossiprouter speaking 2.12, which is compatible) also send each multicast back to its sender;
those echoes are recognised by a sender-id byte in the payload, counted apart (``echo_per_s``)
and not included in deliveries.

Router CPU per delivered message = the router process's user+system CPU seconds
(``/proc/PID/stat``, all threads) over the measured window ÷ deliveries in that window.

A benchmark, not a test: it prints tables and asserts nothing about speed. Figures are
medians over ``--runs`` runs; the routers alternate run by run so that drift hits all three.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import queue
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Protocol

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.floor import build as floor_build  # noqa: E402
from gossiprouter.protocol import jgroups2 as j2  # noqa: E402
from gossiprouter.protocol import jgroups5 as j5  # noqa: E402
from gossiprouter.protocol import native as wire  # noqa: E402
from gossiprouter.protocol.jgroups_common import V2, V5, JAddress  # noqa: E402
from tests.procs import free_port, proc_cpu_seconds, wait_listening  # noqa: E402

JAR = Path("/usr/share/java/jgroups.jar")
JAVA_SRC = REPO / "benchmarks" / "jgroups" / "Blaster.java"
CLASSES = REPO / "benchmarks" / "jgroups" / "classes"
JAVA = "java"

ROUTERS = ("java", "gr-2.12", "gr-native")
# Only with --jgroups5 CLASSPATH: the Java 5.x router and gossiprouter over the 5.x protocol.
ROUTERS5 = ("java5", "gr-5")
# The light-load floor: benchmarks/floor/relay.c over the native protocol.
FLOOR = "floor"
ALL_ROUTERS = (*ROUTERS, *ROUTERS5, FLOOR)
ROUTER_TITLES = {
    "java": "Java 2.12", "gr-2.12": "gossiprouter 2.12", "gr-native": "gossiprouter native",
    "java5": "Java 5.x", "gr-5": "gossiprouter 5.x", FLOOR: "C floor",
}
# The Java router each gossiprouter column is compared with (same protocol for gr-5).
RATIO_BASE = {"gr-2.12": "java", "gr-native": "java", "gr-5": "java5"}
# The gossiprouter columns also compared with the floor: native (the floor's own frames) and 5.x.
FLOOR_RATIO = ("gr-native", "gr-5")
# With --variant ARGS every gossiprouter router also runs as "<router>+v" with ARGS added,
# alternating with the others, so that a change is measured against its baseline in one run.
VARIANT = "+v"


def base_kind(router: str) -> str:
    return router.removesuffix(VARIANT)


def title(router: str) -> str:
    t = ROUTER_TITLES[base_kind(router)]
    return t + " (variant)" if router.endswith(VARIANT) else t
# The Java router is thread-per-connection: a small stack per thread keeps 10,000 connections
# cheap in address space; 512 MiB of heap is plenty for the router's per-connection buffers.
JAVA_ROUTER_OPTS = ("-Xmx512m", "-Xss256k")
LOADER_OPTS = ("-Xms64m", "-Xmx256m", "-Xss256k", "-XX:+UseSerialGC")

GROUP = "bench"
PAIRS = 4  # unicast cases: 4 sender -> receiver pairs
FANOUT_MEMBERS = 8  # fan-out: a group of 8 ...
FANOUT_SENDERS = 2  # ... with 2 senders
IDLE_BASE = 1000  # member indexes of idle connections start here

Kind = Literal["unicast", "fanout", "paced", "idle"]


@dataclass(frozen=True)
class Case:
    name: str
    kind: Kind
    size: int  # payload bytes
    rate: int = 0  # total messages/s for paced load; 0 = flood
    idle: int = 0  # idle registered connections besides the active members

    @property
    def title(self) -> str:
        if self.kind == "unicast":
            return f"unicast {PAIRS} pairs, {self.size} B"
        if self.kind == "fanout" and self.rate:
            return (f"fan-out 1→{FANOUT_MEMBERS - 1}, {FANOUT_SENDERS} senders, "
                    f"{self.rate * (FANOUT_MEMBERS - 1):,} deliveries/s, {self.size} B")
        if self.kind == "fanout":
            return f"fan-out 1→{FANOUT_MEMBERS - 1}, {FANOUT_SENDERS} senders, {self.size} B"
        if self.kind == "paced":
            return f"paced {self.rate:,} msg/s, {self.size} B"
        return f"{self.idle:,} idle + {self.rate:,} msg/s, {self.size} B"


CASES = (
    Case("unicast-100", "unicast", 100),
    Case("unicast-1000", "unicast", 1000),
    Case("fanout-100", "fanout", 100),
    Case("fanout-1000", "fanout", 1000),
    Case("paced-100", "paced", 100, rate=10_000),
    # Medium-load fan-out (issue 16's second row): 2 senders x 1,144 msg/s into a group of 8,
    # 16,016 deliveries/s; several messages of one wake-up may go to the same receiver.
    Case("fanout-paced", "fanout", 100, rate=2_288),
    Case("idle-5000", "idle", 100, rate=1_000, idle=5_000),
    Case("idle-10000", "idle", 100, rate=1_000, idle=10_000),
)


# --------------------------------------------------------------------------- child processes

_CHILDREN: list[subprocess.Popen[bytes] | subprocess.Popen[str]] = []
_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when this driver dies, however it dies."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _kill(p: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    if p.poll() is None:
        p.kill()
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:  # pragma: no cover - a SIGKILLed child always ends
        print(f"warning: process {p.pid} did not end after SIGKILL", file=sys.stderr)
    if p in _CHILDREN:
        _CHILDREN.remove(p)


def kill_children() -> None:
    for p in list(_CHILDREN):
        _kill(p)


def _on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def proc_status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/{pid}/status")


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent not idle (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return (sum(parts[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class Router:
    """One router process on 127.0.0.1:port; SIGKILLed on stop (each run uses a fresh one)."""

    def __init__(self, kind: str, port: int, log: Path, jgroups5: str | None = None,
                 gr_args: Sequence[str] = (), tree: Path = REPO) -> None:
        self.kind = kind
        self.port = port
        if kind == "java":
            cmd = [JAVA, *JAVA_ROUTER_OPTS, "-cp", str(JAR), "org.jgroups.stack.GossipRouter",
                   "-port", str(port), "-bindaddress", "127.0.0.1"]
        elif kind == "java5":
            if not jgroups5:
                raise ValueError("the java5 router needs --jgroups5 CLASSPATH")
            # 5.x renamed -bindaddress to -bind_addr; everything else stays at its defaults
            # (blocking TcpServer, one reader thread per connection).
            cmd = [JAVA, *JAVA_ROUTER_OPTS, "-cp", jgroups5, "org.jgroups.stack.GossipRouter",
                   "-port", str(port), "-bind_addr", "127.0.0.1"]
        elif kind == FLOOR:
            cmd = [str(floor_build.built()), str(port)]
        else:
            cmd = [sys.executable, "-m", "gossiprouter", "serve", "--host", "127.0.0.1",
                   "--port", str(port), "--log-level", "warning", *gr_args]
        with open(log, "ab") as out:
            # gossiprouter runs from ``tree`` (python -m puts the working directory first on
            # sys.path): --variant-tree measures another checkout against this one.
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                         cwd=tree, preexec_fn=_die_with_parent)
        _CHILDREN.append(self.proc)
        wait_listening(port, self.proc)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.pid)

    def rss_mib(self) -> float:
        return proc_status_kib(self.pid, "VmRSS") / 1024

    def threads(self) -> int:
        return proc_status_kib(self.pid, "Threads")

    def stop(self) -> None:
        _kill(self.proc)


class Loader:
    """One Blaster process; its stdout lines are read by a thread into a queue."""

    def __init__(self, config: Path, log: Path) -> None:
        with open(log, "ab") as err:
            self.proc: subprocess.Popen[str] = subprocess.Popen(
                [JAVA, *LOADER_OPTS, "-cp", str(CLASSES), "Blaster", str(config)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                bufsize=1, cwd=REPO, preexec_fn=_die_with_parent)
        _CHILDREN.append(self.proc)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.log = log
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def send(self, cmd: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def expect(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"loader {self.proc.pid}: no {prefix} within {timeout:g} s")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"loader {self.proc.pid} exited (see {self.log})")
            if line.startswith("ERROR"):
                raise RuntimeError(f"loader {self.proc.pid}: {line}")
            if line.startswith(prefix):
                return line

    def cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        try:
            if self.proc.poll() is None:
                self.send("STOP")
                self.proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        _kill(self.proc)


def ensure_compiled() -> None:
    target = CLASSES / "Blaster.class"
    if target.exists() and target.stat().st_mtime >= JAVA_SRC.stat().st_mtime:
        return
    print(f"compiling {JAVA_SRC.relative_to(REPO)} -> {CLASSES.relative_to(REPO)}/", flush=True)
    CLASSES.mkdir(parents=True, exist_ok=True)
    subprocess.run(["javac", "-d", str(CLASSES), str(JAVA_SRC)], check=True)


# --------------------------------------------------------------------------- protocols


class Proto(Protocol):
    def register(self, i: int) -> tuple[bytes, int, bytes]:
        """Registration bytes of member i, reply frames to skip, and the exact reply expected."""

    def send_frame(self, sender: int, dest: int | None, payload: bytes) -> bytes:
        """A message as the sender writes it (dest None = multicast)."""

    def recv_frame(self, sender: int, dest: int | None, payload: bytes) -> bytes:
        """The same message as the router delivers it."""

    def count_members(self, port: int) -> int:
        """How many members the router lists for the group."""


def _uuid_bits(i: int) -> tuple[int, int]:
    return 0x6272_0000_0000_0000 + i, 0x4A47_0000_0000_0000 + i


class JGroups212:
    """JGroups 2.12 GossipData: what TUNNEL / RouterStub 2.12 send."""

    def _addr(self, i: int) -> JAddress:
        msb, lsb = _uuid_bits(i)
        return JAddress.from_uuid(msb, lsb, version=V2)

    def register(self, i: int) -> tuple[bytes, int, bytes]:
        phys = JAddress.from_ip("127.0.0.1", 10000 + i % 50000, version=V2)
        return j2.connect(GROUP, self._addr(i), f"m{i}", [phys]), 0, j2.connect_ok()

    def send_frame(self, sender: int, dest: int | None, payload: bytes) -> bytes:
        return j2.message(GROUP, None if dest is None else self._addr(dest), payload)

    def recv_frame(self, sender: int, dest: int | None, payload: bytes) -> bytes:
        return j2.message_to_client(None if dest is None else self._addr(dest), payload)

    def count_members(self, port: int) -> int:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            dec = j2.ClientDecoder(max_frame=64 << 20)
            dec.expect_members_reply()
            s.sendall(j2.gossip_get(GROUP))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                data = s.recv(1 << 20)
                if not data:
                    raise RuntimeError("router closed the GOSSIP_GET connection")
                dec.feed(data)
                ev = dec.next_event()
                if isinstance(ev, j2.MembersReply):
                    return len(ev.members)
            raise TimeoutError("no GOSSIP_GET reply")


class Native:
    """gossiprouter's native protocol (docs/protocol.md)."""

    def _addr(self, i: int) -> bytes:
        return struct.pack(">QQ", *_uuid_bits(i))

    def register(self, i: int) -> tuple[bytes, int, bytes]:
        reg = (wire.PREAMBLE + wire.encode(wire.Hello((1,), "bench-vs-jgroups"))
               + wire.encode(wire.Connect(1, GROUP, self._addr(i), f"m{i}",
                                          (("127.0.0.1", 10000 + i % 50000),))))
        return reg, 1, wire.encode(wire.Ok(1, None))  # skip WELCOME, then OK

    def send_frame(self, sender: int, dest: int | None, payload: bytes) -> bytes:
        return wire.encode_route(GROUP, None if dest is None else self._addr(dest),
                                 self._addr(sender), payload)

    def recv_frame(self, sender: int, dest: int | None, payload: bytes) -> bytes:
        return self.send_frame(sender, dest, payload)  # forwarded byte for byte

    def count_members(self, port: int) -> int:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(wire.PREAMBLE + wire.encode(wire.Hello((1,), "bench-check"))
                      + wire.encode(wire.GetMembers(7, GROUP)))
            dec = wire.Decoder(max_frame=64 << 20)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                data = s.recv(1 << 20)
                if not data:
                    raise RuntimeError("router closed the GET_MEMBERS connection")
                dec.feed(data)
                for f in dec.frames():
                    if isinstance(f, wire.Ok) and f.req == 7:
                        return len(f.members or ())
                    if isinstance(f, wire.Error):
                        raise RuntimeError(f"GET_MEMBERS: {f}")
            raise TimeoutError("no GET_MEMBERS reply")


class JGroups5:
    """JGroups 3.6.5+ / 4.x / 5.x GossipData: what TUNNEL / RouterStub 5.x send.

    REGISTER has no reply in 5.x, so registration is REGISTER followed by a HEARTBEAT on the
    same connection: the router answers the HEARTBEAT only after it has handled the REGISTER,
    which makes the echoed HEARTBEAT the exact reply that says "registered".
    """

    def _addr(self, i: int) -> JAddress:
        msb, lsb = _uuid_bits(i)
        return JAddress.from_uuid(msb, lsb, version=V5)

    def register(self, i: int) -> tuple[bytes, int, bytes]:
        phys = JAddress.from_ip("127.0.0.1", 10000 + i % 50000, version=V5)
        reg = j5.register(GROUP, self._addr(i), f"m{i}", phys) + j5.heartbeat()
        return reg, 0, j5.heartbeat()

    def send_frame(self, sender: int, dest: int | None, payload: bytes) -> bytes:
        return j5.message(GROUP, None if dest is None else self._addr(dest), self._addr(sender),
                          payload)

    def recv_frame(self, sender: int, dest: int | None, payload: bytes) -> bytes:
        return self.send_frame(sender, dest, payload)  # forwarded byte for byte

    def count_members(self, port: int) -> int:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            dec = j5.Decoder(max_frame=64 << 20)
            s.sendall(j5.get_members(GROUP))
            seen = 0
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                data = s.recv(1 << 20)
                if not data:
                    raise RuntimeError("router closed the GET_MBRS connection")
                dec.feed(data)
                while (ev := dec.next_event()) is not None:
                    if isinstance(ev, j5.MembersReply):
                        # Clients before 5.4.4 get one reply; newer ones may get several,
                        # the last one flagged.
                        seen += len(ev.members)
                        if ev.last or ev.group is not None:
                            return seen
            raise TimeoutError("no GET_MBRS reply")


def proto_for(router: str) -> Proto:
    router = base_kind(router)
    if router in ("java5", "gr-5"):
        return JGroups5()
    return Native() if router in ("gr-native", FLOOR) else JGroups212()


# --------------------------------------------------------------------------- loader configs


@dataclass(frozen=True)
class Member:
    index: int  # address number
    sender_id: int | None  # set for senders (the id byte in their payload)
    dest: int | None  # unicast destination; None = multicast (senders only)
    rate: int  # messages/s, 0 = flood


def layout(case: Case) -> list[Member]:
    """The active members of a case, senders first."""
    if case.kind == "fanout":
        senders = [Member(k, k, None, case.rate // FANOUT_SENDERS) for k in range(FANOUT_SENDERS)]
        receivers = [Member(k, None, None, 0) for k in range(FANOUT_SENDERS, FANOUT_MEMBERS)]
        return senders + receivers
    per_sender = case.rate // PAIRS
    out = []
    for p in range(PAIRS):
        out.append(Member(2 * p, p, 2 * p + 1, per_sender))
        out.append(Member(2 * p + 1, None, None, 0))
    return out


def _payload(size: int, sender_id: int) -> bytes:
    """Payload: 8-byte timestamp slot (filled by a paced sender), the sender-id byte, zeros."""
    p = bytearray(size)
    p[8] = sender_id
    return bytes(p)


def loader_configs(case: Case, proto: Proto, port: int, nloaders: int,
                   deadline: float) -> list[list[str]]:
    """Config lines of each loader process."""
    members = layout(case)
    senders = [m for m in members if m.sender_id is not None]
    # What each sender sends, and what the router delivers for it (one length for the case).
    sent = {m.index: proto.send_frame(m.index, m.dest, _payload(case.size, m.sender_id or 0))
            for m in senders}
    delivered = [proto.recv_frame(m.index, m.dest, _payload(case.size, m.sender_id or 0))
                 for m in senders]
    rlen = len(delivered[0])
    if any(len(f) != rlen for f in delivered):
        raise AssertionError("delivered frames of one case must have one length")
    pay_off = rlen - case.size  # the payload is the last field in both protocols
    timed = case.rate > 0
    # The checked prefix: what every delivered frame shares, short of a paced sender's stamp.
    limit = min(16, rlen, pay_off if timed else rlen)
    common = 0
    while common < limit and len({f[common] for f in delivered}) == 1:
        common += 1
    check = delivered[0][:max(common, 1)].hex()
    configs: list[list[str]] = [
        [f"port {port}", f"deadline {deadline:.0f}", "connect_threads 4"] for _ in range(nloaders)
    ]
    # Pairs stay together in one loader (so sender and receiver share a JVM and a clock).
    for k, m in enumerate(members):
        slot = (k // 2) % nloaders if case.kind != "fanout" else k % nloaders
        reg, skip, ok = proto.register(m.index)
        words = [f"member reg={reg.hex()} skip={skip} ok={ok.hex()}", f"rlen={rlen}",
                 f"check={check}", f"idoff={pay_off + 8}",
                 f"self={255 if m.sender_id is None else m.sender_id}",
                 f"tsoff={pay_off if timed else -1}"]
        if m.sender_id is not None:
            frame = sent[m.index]
            words += [f"send={frame.hex()}", f"rate={m.rate}",
                      f"stsoff={len(frame) - case.size if timed else -1}"]
        configs[slot].append(" ".join(words))
    for n in range(case.idle):
        reg, skip, ok = proto.register(IDLE_BASE + n)
        configs[n % nloaders].append(f"idle reg={reg.hex()} skip={skip} ok={ok.hex()}")
    return configs


# --------------------------------------------------------------------------- one run


@dataclass
class RunResult:
    case: str
    router: str
    run: int
    seconds: float
    deliveries_per_s: float
    echo_per_s: float
    sent_per_s: float
    router_cpu_us_per_msg: float
    router_cpu_cores: float
    loader_cpu_cores: float
    machine_busy_cores: float
    other_cpu_cores: float  # everything else the machine ran meanwhile (other workloads)
    p50_us: float | None = None
    p90_us: float | None = None
    p99_us: float | None = None
    p999_us: float | None = None
    max_us: float | None = None
    rss_mib: float | None = None
    router_threads: int | None = None
    registered: int | None = None
    expected_registered: int | None = None
    bad_frames: int = 0
    closed_connections: int = 0
    setup_s: float = 0.0


@dataclass
class Mark:
    t: float
    router_cpu: float
    loader_cpu: float
    busy: float
    recv: int = 0
    echo: int = 0
    sent: int = 0
    bad: int = 0
    closed: int = 0
    hist: dict[int, int] = field(default_factory=dict)


def take_mark(router: Router, loaders: Sequence[Loader]) -> Mark:
    for ld in loaders:
        ld.send("MARK")
    m = Mark(time.monotonic(), router.cpu_seconds(), sum(ld.cpu_seconds() for ld in loaders),
             machine_busy_seconds())
    for ld in loaders:
        line = ld.expect("MARK", 30)
        for word in line.split()[1:]:
            key, _, value = word.partition("=")
            if key == "lat":
                for item in filter(None, value.split(",")):
                    us, _, count = item.partition(":")
                    m.hist[int(us)] = m.hist.get(int(us), 0) + int(count)
            elif key in ("recv", "echo", "sent", "bad", "closed"):
                setattr(m, key, getattr(m, key) + int(value))
    return m


def percentile(hist: dict[int, int], q: float) -> float | None:
    total = sum(hist.values())
    if not total:
        return None
    rank = q * (total - 1)
    seen = 0
    for us in sorted(hist):
        seen += hist[us]
        if seen > rank:
            return float(us)
    return float(max(hist))


def run_one(case: Case, router_kind: str, run: int, seconds: float, warmup: float,
            nloaders: int, tmp: Path, jgroups5: str | None = None,
            gr_args: Sequence[str] = (), tree: Path = REPO) -> RunResult:
    proto = proto_for(router_kind)
    port = free_port()
    t_setup = time.monotonic()
    deadline = 120 + warmup + seconds + case.idle / 100
    configs = loader_configs(case, proto, port, nloaders, deadline)
    tag = f"{case.name}-{router_kind}-{run}"
    router = Router(router_kind, port, tmp / f"router-{tag}.log", jgroups5, gr_args, tree)
    loaders: list[Loader] = []
    try:
        for n, lines in enumerate(configs):
            cfg = tmp / f"loader-{tag}-{n}.cfg"
            cfg.write_text("\n".join(lines) + "\n")
            loaders.append(Loader(cfg, tmp / f"loader-{tag}-{n}.log"))
            if n == 0:
                # The first loader registers its members one by one before anyone else
                # connects: the Java 2.12 router loses registrations when the first CONNECTs
                # to a new group race (get-then-put on its routing table).
                loaders[0].expect("MEMBERS", deadline)
        for ld in loaders:
            ld.expect("READY", deadline)
        setup = time.monotonic() - t_setup
        for ld in loaders:
            ld.send("GO")
        time.sleep(warmup)
        m0 = take_mark(router, loaders)
        time.sleep(seconds)
        m1 = take_mark(router, loaders)
        if not router.alive():
            raise RuntimeError(f"{router_kind} router died during the run")
        dt = m1.t - m0.t
        delivered = m1.recv - m0.recv
        cpu = m1.router_cpu - m0.router_cpu
        res = RunResult(
            case=case.name, router=router_kind, run=run, seconds=dt,
            deliveries_per_s=delivered / dt, echo_per_s=(m1.echo - m0.echo) / dt,
            sent_per_s=(m1.sent - m0.sent) / dt,
            router_cpu_us_per_msg=cpu / delivered * 1e6 if delivered else float("nan"),
            router_cpu_cores=cpu / dt, loader_cpu_cores=(m1.loader_cpu - m0.loader_cpu) / dt,
            machine_busy_cores=(m1.busy - m0.busy) / dt,
            other_cpu_cores=((m1.busy - m0.busy) - cpu - (m1.loader_cpu - m0.loader_cpu)) / dt,
            bad_frames=m1.bad, closed_connections=m1.closed, setup_s=setup,
        )
        if case.rate:
            res.p50_us = percentile(m1.hist, 0.50)
            res.p90_us = percentile(m1.hist, 0.90)
            res.p99_us = percentile(m1.hist, 0.99)
            res.p999_us = percentile(m1.hist, 0.999)
            res.max_us = percentile(m1.hist, 1.0)
        res.rss_mib = router.rss_mib()
        res.router_threads = router.threads()
        if case.kind == "idle" and router_kind != FLOOR:  # the floor has no GET_MEMBERS
            res.registered = proto.count_members(port)
            res.expected_registered = case.idle + len(layout(case))
        return res
    finally:
        # The router goes first: closing 10,000 registered connections while it runs would make
        # it send SUSPECTs to the whole group for each one, which is not what is measured.
        router.stop()
        for ld in loaders:
            ld.stop()


# --------------------------------------------------------------------------- report


def median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None and v == v]
    return statistics.median(vals) if vals else None


METRICS: tuple[tuple[str, str, str], ...] = (
    # (RunResult field, label, format)
    ("deliveries_per_s", "deliveries/s", "{:,.0f}"),
    ("router_cpu_us_per_msg", "router CPU µs/msg", "{:.2f}"),
    ("p50_us", "p50 latency µs", "{:,.0f}"),
    ("p99_us", "p99 latency µs", "{:,.0f}"),
    ("echo_per_s", "echoes to the sender/s (not counted)", "{:,.0f}"),
    ("rss_mib", "router RSS MiB", "{:,.1f}"),
    ("registered", "registered (fewest of the runs)", "{:,.0f}"),
    ("router_cpu_cores", "router CPU (cores)", "{:.2f}"),
    ("loader_cpu_cores", "loader CPU (cores)", "{:.2f}"),
)


NO_RATIO = frozenset({"echo_per_s", "registered"})


def _metrics_for(case: Case) -> list[tuple[str, str, str]]:
    wanted = ["deliveries_per_s", "router_cpu_us_per_msg", "router_cpu_cores", "loader_cpu_cores"]
    if case.rate:
        wanted[1:1] = ["p50_us", "p99_us"]
    if case.kind == "idle":
        wanted[1:1] = ["rss_mib", "registered"]
    if case.kind == "fanout":
        wanted[1:1] = ["echo_per_s"]
    return [m for m in METRICS if m[0] in wanted]


def summarize(cases: Sequence[Case], routers: Sequence[str],
              results: Sequence[RunResult]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for case in cases:
        for r in routers:
            runs = [x for x in results if x.case == case.name and x.router == r]
            if not runs:
                continue
            row: dict[str, object] = {"case": case.name, "router": r, "runs": len(runs)}
            for key in (*(m[0] for m in METRICS), "sent_per_s",
                        "machine_busy_cores", "other_cpu_cores", "p90_us", "p999_us",
                        "max_us", "expected_registered", "router_threads"):
                row[key] = median([getattr(x, key) for x in runs])
            # A lost registration in any run must show: the fewest listed, not the median.
            regs = [x.registered for x in runs if x.registered is not None]
            row["registered"] = min(regs) if regs else None
            row["bad_frames"] = sum(x.bad_frames for x in runs)
            row["closed_connections"] = sum(x.closed_connections for x in runs)
            out.append(row)
    return out


def _fmt(v: object, fmt: str) -> str:
    return "n/a" if not isinstance(v, int | float) else fmt.format(v)


def print_table(cases: Sequence[Case], routers: Sequence[str],
                summary: Sequence[dict[str, object]]) -> None:
    cols = [title(r) for r in routers]
    # Each gossiprouter column against the Java router of its protocol family, when it ran,
    # and the native and 5.x ones against the C floor.
    others = [(r, RATIO_BASE[base_kind(r)]) for r in routers
              if RATIO_BASE.get(base_kind(r)) in routers]
    if FLOOR in routers:
        others += [(r, FLOOR) for r in routers if base_kind(r) in FLOOR_RATIO]
    ratio_cols = [_ratio_title(r, base) for r, base in others]
    print("| case | metric | " + " | ".join(cols + ratio_cols) + " |")
    print("|---|---|" + "---:|" * (len(cols) + len(ratio_cols)))
    for case in cases:
        rows = {str(s["router"]): s for s in summary if s["case"] == case.name}
        if not rows:
            continue
        first = True
        for key, label, fmt in _metrics_for(case):
            cells = [_fmt(rows[r][key], fmt) if r in rows else "n/a" for r in routers]
            if key == "registered":
                cells = [
                    f"{c} / {_fmt(rows[r]['expected_registered'], '{:,.0f}')}" if r in rows else c
                    for c, r in zip(cells, routers, strict=True)
                ]
            ratios = []
            if ratio_cols and key in NO_RATIO:
                ratios = [""] * len(others)
            elif ratio_cols:
                ratios = [_ratio(rows, r, base, key) for r, base in others]
            print(f"| {case.title if first else ''} | {label} | "
                  + " | ".join(cells + ratios) + " |")
            first = False


def _ratio_title(router: str, base: str) -> str:
    return f"{title(router).replace('gossiprouter', 'gr')} / {ROUTER_TITLES[base]}"


def _ratio(rows: dict[str, dict[str, object]], router: str, base: str, key: str) -> str:
    b = rows.get(base, {}).get(key)
    v = rows.get(router, {}).get(key)
    if isinstance(v, int | float) and isinstance(b, int | float) and b:
        return f"{v / b:.3g}x"
    return "n/a"


def print_floor_table(cases: Sequence[Case], routers: Sequence[str],
                      summary: Sequence[dict[str, object]]) -> None:
    """The light-load floor table of each paced case: router CPU per message, p50 and p99 of
    every router beside the C floor, and each gossiprouter column over the floor."""
    if FLOOR not in routers:
        return
    others = [r for r in routers if base_kind(r) in FLOOR_RATIO]
    for case in cases:
        rows = {str(s["router"]): s for s in summary if s["case"] == case.name}
        if case.kind != "paced" or FLOOR not in rows:
            continue
        print()
        print(f"Light-load floor, {case.title}: the same Blaster loaders drive every router "
              "(native frames for gossiprouter native and the C floor, JGroups 5.x frames for "
              "Java 5.x and gossiprouter 5.x, 2.12 frames for the 2.12 columns).")
        print()
        ratio_cols = [_ratio_title(r, FLOOR) for r in others]
        print("| metric | " + " | ".join([title(r) for r in routers] + ratio_cols) + " |")
        print("|---|" + "---:|" * (len(routers) + len(ratio_cols)))
        for key, label, fmt in METRICS:
            if key not in ("router_cpu_us_per_msg", "p50_us", "p99_us"):
                continue
            cells = [_fmt(rows[r][key], fmt) if r in rows else "n/a" for r in routers]
            cells += [_ratio(rows, r, FLOOR, key) for r in others]
            print(f"| {label} | " + " | ".join(cells) + " |")


def machine_info() -> dict[str, str]:
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kib = int(f.readline().split()[1])
    java = subprocess.run([JAVA, "-version"], capture_output=True, text=True).stderr.splitlines()
    return {
        "cores": str(os.cpu_count()),
        "cpu": model,
        "ram": f"{mem_kib / 1024 / 1024:.1f} GiB",
        "kernel": platform.release(),
        "java": java[0] if java else "?",
        "python": platform.python_version(),
        "jgroups_jar": str(JAR),
    }


def jgroups5_version(classpath: str) -> str | None:
    """The version a JGroups build on ``classpath`` reports, if it is 5.x; None otherwise."""
    try:
        out = subprocess.run([JAVA, "-cp", classpath, "org.jgroups.Version"],
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        if line.startswith("Version:"):
            v = line.split(":", 1)[1].strip()
            return v if v.startswith("5.") else None
    return None


def background_load(seconds: float = 1.0) -> float:
    """Cores the machine keeps busy while this script does nothing."""
    b0 = machine_busy_seconds()
    time.sleep(seconds)
    return (machine_busy_seconds() - b0) / seconds


def progress(i: int, total: int, r: RunResult, elapsed: float) -> None:
    extra = ""
    if r.echo_per_s:
        extra += f", echoes {r.echo_per_s:,.0f}/s"
    if r.p99_us is not None:
        extra += (f", latency µs p50 {r.p50_us:,.0f} p90 {r.p90_us or 0:,.0f} "
                  f"p99 {r.p99_us:,.0f} p99.9 {r.p999_us or 0:,.0f} max {r.max_us or 0:,.0f}")
    if r.registered is not None:
        extra += (f", RSS {r.rss_mib:,.1f} MiB, registered {r.registered:,}"
                  f"/{r.expected_registered:,}")
    if r.bad_frames or r.closed_connections:
        extra += f", WARNING bad frames {r.bad_frames}, closed {r.closed_connections}"
    print(f"[{i}/{total} {elapsed:5.0f}s] {r.case} run {r.run} {r.router}: "
          f"{r.deliveries_per_s:,.0f} deliveries/s, {r.router_cpu_us_per_msg:.2f} µs router "
          f"CPU/msg, CPU cores: router {r.router_cpu_cores:.2f}, loaders "
          f"{r.loader_cpu_cores:.2f}, others {r.other_cpu_cores:.2f}{extra} "
          f"(setup {r.setup_s:.1f} s)", flush=True)


@contextmanager
def cleanup_on_exit() -> Iterator[None]:
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        kill_children()
        signal.signal(signal.SIGTERM, old)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Benchmark gossiprouter against the Java JGroups 2.12 (and, with --jgroups5, "
                    "5.x) GossipRouter.")
    ap.add_argument("--runs", type=int, default=3, help="runs per case and router (median)")
    ap.add_argument("--seconds", type=float, default=4.0, help="measured seconds per run")
    ap.add_argument("--warmup", type=float, default=2.0,
                    help="seconds of load before measuring (lets the JVM compile)")
    ap.add_argument("--cases", nargs="+", choices=[c.name for c in CASES],
                    default=[c.name for c in CASES], metavar="CASE",
                    help="cases to run: " + ", ".join(c.name for c in CASES))
    ap.add_argument("--routers", nargs="+", choices=ALL_ROUTERS, default=None,
                    help="routers to run (default: all three, the C floor, plus java5 and gr-5 "
                         "with --jgroups5)")
    ap.add_argument("--gr-args", default="", metavar="ARGS",
                    help="extra options for every gossiprouter router, e.g. '--no-dispatcher'")
    ap.add_argument("--variant", default="", metavar="ARGS",
                    help="also run every gossiprouter router with these extra options "
                         "(columns marked 'variant'), alternating with the plain ones")
    ap.add_argument("--variant-tree", type=Path, default=None, metavar="DIR",
                    help="run the variant's gossiprouter from this source tree (e.g. an older "
                         "commit unpacked with git archive), with --variant's options if any")
    ap.add_argument("--jgroups5", metavar="CLASSPATH",
                    help="a local JGroups 5.x build (jar or classes directory, ':'-separated): "
                         "adds the Java 5.x GossipRouter (java5) and gossiprouter over the 5.x "
                         "protocol (gr-5)")
    ap.add_argument("--loaders", type=int, default=2, help="load generator processes")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 run, 1 s per case, idle cases with a tenth of the "
                         "connections")
    ap.add_argument("--json", type=Path, help="also write the runs and medians here")
    ap.add_argument("--logs", type=Path,
                    help="keep router and loader logs and loader configs in this directory")
    args = ap.parse_args(argv)
    if args.quick:
        args.runs, args.seconds, args.warmup = 1, 1.0, 0.5
    if args.runs < 1 or args.seconds <= 0 or args.loaders < 1 or args.warmup < 0:
        ap.error("--runs and --loaders must be >= 1, --seconds > 0, --warmup >= 0")
    if args.variant_tree is not None:
        if not (args.variant_tree / "gossiprouter" / "__main__.py").is_file():
            ap.error(f"--variant-tree: no gossiprouter package in {args.variant_tree}")
        args.variant_tree = args.variant_tree.resolve()
    else:
        args.variant_tree = REPO
    if args.routers is None:
        args.routers = [*ROUTERS, *(ROUTERS5 if args.jgroups5 else ()), FLOOR]
    if "java5" in args.routers and not args.jgroups5:
        ap.error("the java5 router needs --jgroups5 CLASSPATH (a local JGroups 5.x build)")
    if args.jgroups5:
        missing = [p for p in args.jgroups5.split(os.pathsep) if p and not Path(p).exists()]
        if missing:
            ap.error(f"--jgroups5: no such file or directory: {', '.join(missing)}")
    return args


def run_all(cases: Sequence[Case], routers: Sequence[str], args: argparse.Namespace,
            t0: float) -> list[RunResult]:
    """Every run, routers alternating within each case and run number."""
    results: list[RunResult] = []
    total = len(cases) * args.runs * len(routers)
    i = 0
    with tempfile.TemporaryDirectory(prefix="bench-vs-jgroups-") as tmpdir:
        tmp = Path(tmpdir)
        if args.logs:
            args.logs.mkdir(parents=True, exist_ok=True)
            tmp = args.logs
        for case in cases:
            for run in range(1, args.runs + 1):
                for r in routers:
                    i += 1
                    variant = r.endswith(VARIANT)
                    try:
                        res = run_one(case, r, run, args.seconds, args.warmup, args.loaders, tmp,
                                      args.jgroups5,
                                      args.gr_args.split() + (args.variant.split()
                                                              if variant else []),
                                      args.variant_tree if variant else REPO)
                    except (RuntimeError, TimeoutError, OSError) as e:
                        print(f"[{i}/{total}] {case.name} run {run} {r}: FAILED: {e}",
                              flush=True)
                        _dump_logs(tmp, f"{case.name}-{r}-{run}")
                        continue
                    results.append(res)
                    progress(i, total, res, time.monotonic() - t0)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cases = [c for c in CASES if c.name in args.cases]
    if args.quick:
        cases = [Case(f"idle-{c.idle // 10}", c.kind, c.size, c.rate, c.idle // 10)
                 if c.kind == "idle" else c for c in cases]
    routers: list[str] = []
    for r in ALL_ROUTERS:
        if r in args.routers:
            routers.append(r)
            if (args.variant or args.variant_tree != REPO) and r in RATIO_BASE:
                routers.append(r + VARIANT)
    if "java" in routers and not JAR.exists():
        print(f"no {JAR}: install libjgroups-java (scripts/setup does)", file=sys.stderr)
        return 1
    if "java5" in routers:
        version = jgroups5_version(args.jgroups5)
        if version is None:
            print(f"--jgroups5 {args.jgroups5}: no JGroups 5.x there "
                  "(org.jgroups.Version did not report a 5.x version)", file=sys.stderr)
            return 1
        print(f"JGroups 5.x router: {version} from {args.jgroups5}", flush=True)
    ensure_compiled()
    if FLOOR in routers:
        print(f"C floor: {floor_build.built().relative_to(REPO)}", flush=True)
    info = machine_info()
    total = len(cases) * args.runs * len(routers)
    print(f"bench-vs-jgroups: {info['cores']} cores ({info['cpu']}), {info['ram']} RAM, "
          f"{info['java']}, Python {info['python']}", flush=True)
    print(f"{len(cases)} cases x {args.runs} runs x {len(routers)} routers = {total} runs, "
          f"{args.warmup:g} s warm-up + {args.seconds:g} s measured each, "
          f"{args.loaders} loader processes", flush=True)
    background = background_load()
    print(f"background CPU load before starting: {background:.2f} cores", flush=True)
    if background > 0.25:
        print("warning: something else is using the CPU; every figure will be skewed "
              "(see the others column of the progress lines)", flush=True)
    t0 = time.monotonic()
    try:
        with cleanup_on_exit():
            results = run_all(cases, routers, args, t0)
    except KeyboardInterrupt:
        print("\ninterrupted; routers and loaders stopped", file=sys.stderr)
        return 130
    summary = summarize(cases, routers, results)
    print()
    print(f"Medians of {args.runs} run(s); {args.seconds:g} s measured per run after "
          f"{args.warmup:g} s warm-up; total {time.monotonic() - t0:.0f} s.")
    print("Deliveries count copies reaching members other than the sender; 2.12 echoes of a "
          "multicast to its sender are excluded (see echo_per_s in the JSON).")
    print()
    print_table(cases, routers, summary)
    print_floor_table(cases, routers, summary)
    if args.json:
        args.json.write_text(json.dumps({
            "machine": info,
            "background_cpu_cores": background,
            "settings": {"runs": args.runs, "seconds": args.seconds, "warmup": args.warmup,
                         "loaders": args.loaders, "routers": routers,
                         "cases": [asdict(c) for c in cases],
                         "java_router_opts": list(JAVA_ROUTER_OPTS),
                         "loader_opts": list(LOADER_OPTS), "jgroups5": args.jgroups5,
                         "gr_args": args.gr_args, "variant": args.variant,
                         "variant_tree": str(args.variant_tree)},
            "medians": summary,
            "runs": [asdict(r) for r in results],
        }, indent=2))
        print(f"\nwrote {args.json}")
    return 0


def _dump_logs(tmp: Path, tag: str) -> None:
    for log in sorted(tmp.glob(f"*{tag}*.log")):
        text = log.read_text(errors="replace").strip()
        if text:
            tail = "\n    ".join(text.splitlines()[-8:])
            print(f"  {log.name}:\n    {tail}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
