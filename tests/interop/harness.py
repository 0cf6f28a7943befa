"""Harness for the interop tests: real JGroups JVMs talking through a router under test.

The Java side is ``java/InteropNode.java``: one JChannel per JVM, driven over stdin/stdout with a
line protocol (see the class comment there). This module (with toolchain.py, which compiles it
when needed) starts and stops node JVMs and routers, collects what the nodes print, and waits
for conditions with bounded deadlines. Processes are plain ``subprocess.Popen`` objects with one
reader thread each, so the collected output never depends on the test's event loop; waits are
async (they poll) so the tests can run in pytest-trio's trio_mode.

The router under test comes from ``INTEROP_ROUTER``: ``gossiprouter`` (default, this project's CLI)
or ``java212`` (the real JGroups 2.12 GossipRouter from the Debian jar).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import trio

from .toolchain import (
    JGROUPS_JAR,
    HarnessError,
    classpath,
    ensure_compiled,
    java_executable,
    require_jar,
)

__all__ = ["HarnessError", "ensure_compiled"]  # (re-exported for the interop conftest)

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
LOOPBACK = "127.0.0.1"

ROUTER_ENV = "INTEROP_ROUTER"
ROUTER_GOSSIPROUTER = "gossiprouter"
ROUTER_JAVA212 = "java212"
ROUTER_KINDS = (ROUTER_GOSSIPROUTER, ROUTER_JAVA212)

# Flags for every JVM we start. IPv4 and loopback only; a small heap and the serial collector
# because three or four JVMs share two cores; C1 only, since the JVMs live for seconds.
JVM_FLAGS = (
    "-Djava.net.preferIPv4Stack=true",
    f"-Djgroups.bind_addr={LOOPBACK}",
    "-Xmx128m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
)

POLL_INTERVAL = 0.05


# --------------------------------------------------------------------------------------------
# Small utilities


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def port_accepts(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=timeout):
            return True
    except OSError:
        return False


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def _stop_process(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; always reaps the process."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=10)


async def wait_until(
    condition: Callable[[], bool],
    timeout: float,
    describe: Callable[[], str],
    check: Callable[[], None] | None = None,
) -> float:
    """Poll ``condition`` until it holds; return the seconds waited.

    ``check`` runs on every poll and may raise (e.g. a process died). On timeout an
    AssertionError carries ``describe()``.
    """
    start = trio.current_time()
    deadline = start + timeout
    while True:
        if condition():
            return trio.current_time() - start
        if check is not None:
            check()
        if trio.current_time() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {describe()}")
        await trio.sleep(POLL_INTERVAL)


# --------------------------------------------------------------------------------------------
# Routers


def router_kind() -> str:
    kind = os.environ.get(ROUTER_ENV, ROUTER_GOSSIPROUTER).strip() or ROUTER_GOSSIPROUTER
    if kind not in ROUTER_KINDS:
        raise HarnessError(f"{ROUTER_ENV}={kind!r}; expected one of {', '.join(ROUTER_KINDS)}")
    return kind


def router_command(kind: str, port: int) -> list[str]:
    if kind == ROUTER_JAVA212:
        require_jar()
        return [
            java_executable(),
            *JVM_FLAGS,
            "-cp",
            str(JGROUPS_JAR),
            "org.jgroups.stack.GossipRouter",
            "-port",
            str(port),
            "-bindaddress",
            LOOPBACK,
        ]
    if kind == ROUTER_GOSSIPROUTER:
        return [
            sys.executable,
            "-m",
            "gossiprouter",
            "serve",
            "--host",
            LOOPBACK,
            "--port",
            str(port),
        ]
    raise HarnessError(f"unknown router kind {kind!r}")


class Router:
    """The router under test as a child process on 127.0.0.1:``port``; restartable on that port."""

    def __init__(self, kind: str, port: int, log_dir: Path, args: Sequence[str] = (),
                 name: str = "router") -> None:
        self.kind = kind
        self.port = port
        self.log_dir = log_dir
        # More command-line options (e.g. a federation bridge); gossiprouter only.
        self.args = list(args)
        self.name = name
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.log_path = log_dir / f"{name}-0.log"

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        """Start the router and return once its port accepts connections."""
        if self.proc is not None and self.proc.poll() is None:
            raise HarnessError("router already running")
        self.starts += 1
        self.log_path = self.log_dir / f"{self.name}-{self.starts}.log"
        cmd = router_command(self.kind, self.port) + self.args
        with self.log_path.open("wb") as log:
            log.write(("$ " + " ".join(cmd) + "\n").encode())
            log.flush()
            self.proc = subprocess.Popen(
                cmd,
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while not port_accepts(self.port):
            code = self.proc.poll()
            if code is not None:
                raise HarnessError(
                    f"{self.kind} router exited with {code} before listening on {self.address}:\n"
                    f"{tail(self.log_path)}"
                )
            if time.monotonic() >= deadline:
                self.stop()
                raise HarnessError(
                    f"{self.kind} router not listening on {self.address} after {timeout:.0f}s:\n"
                    f"{tail(self.log_path)}"
                )
            time.sleep(0.1)

    async def astart(self, timeout: float = 30.0) -> None:
        await trio.to_thread.run_sync(self.start, timeout)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM (SIGKILL after ``grace`` s); the port is free again when this returns."""
        if self.proc is not None:
            _stop_process(self.proc, grace)

    async def astop(self, grace: float = 10.0) -> None:
        await trio.to_thread.run_sync(self.stop, grace)

    def logs(self) -> str:
        return tail(self.log_path)


# --------------------------------------------------------------------------------------------
# JGroups nodes


@dataclass(frozen=True)
class Received:
    sender: str
    text: str
    at: float


class JavaNode:
    """One InteropNode JVM (one JChannel) and everything it printed."""

    def __init__(
        self,
        name: str,
        cluster: str,
        stack: str,
        router_port: int | str,
        log_dir: Path,
        router_host: str = LOOPBACK,
    ) -> None:
        self.name = name
        self.cluster = cluster
        self.stack = stack
        self.router_host = router_host
        self.router_port = router_port
        self.out_path = log_dir / f"node-{name}.out"
        self.err_path = log_dir / f"node-{name}.err"
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._lines: list[str] = []
        self._views: list[tuple[str, ...]] = []
        self._received: list[Received] = []
        self._reader: threading.Thread | None = None
        self.started_at = 0.0
        self.uuid: str | None = None

    # ---- process lifecycle

    def command(self) -> list[str]:
        return [
            java_executable(),
            *JVM_FLAGS,
            "-cp",
            classpath(),
            "InteropNode",
            self.name,
            self.cluster,
            self.stack,
            self.router_host,
            str(self.router_port),
        ]

    def start(self) -> None:
        """Launch the JVM; returns at once (JVM start-up and the join happen in the background)."""
        if self.proc is not None:
            raise HarnessError(f"node {self.name} already started")
        self.started_at = time.monotonic()
        with self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        stdout = self.proc.stdout
        assert stdout is not None
        self._reader = threading.Thread(
            target=self._read_loop, args=(stdout,), name=f"node-{self.name}-reader", daemon=True
        )
        self._reader.start()

    def _read_loop(self, stdout: IO[bytes]) -> None:
        with self.out_path.open("w", encoding="utf-8") as log:
            for raw in stdout:
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                now = time.monotonic()
                log.write(f"{now - self.started_at:9.3f} {line}\n")
                self._parse(line, now)

    def _parse(self, line: str, now: float) -> None:
        kind, _, rest = line.partition(" ")
        with self._lock:
            self._lines.append(line)
            if kind == "VIEW":
                parts = rest.split()
                self._views.append(tuple(parts[1:]))
            elif kind == "RECV":
                sender, _, text = rest.partition(" ")
                self._received.append(Received(sender, text, now))
            elif kind == "CONNECTED":
                fields = rest.split()
                if len(fields) >= 2:
                    self.uuid = fields[1]

    def send_command(self, command: str) -> None:
        proc = self.proc
        if proc is None or proc.stdin is None:
            raise HarnessError(f"node {self.name} not started")
        try:
            proc.stdin.write(command.encode() + b"\n")
            proc.stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise HarnessError(
                f"node {self.name}: cannot send {command!r} ({exc})\n{self.diagnostics()}"
            ) from exc

    def kill(self) -> None:
        """SIGKILL the JVM: an abrupt death, nothing is sent to the router or the peers."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    async def quit(self, timeout: float = 20.0) -> None:
        """Clean leave: JChannel.close(), then the JVM exits."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        self.send_command("QUIT")
        await wait_until(
            lambda: proc.poll() is not None,
            timeout,
            lambda: f"node {self.name} to exit after QUIT\n{self.diagnostics()}",
        )

    def close(self) -> None:
        """Make sure the JVM is gone and the reader finished (for fixture teardown)."""
        if self.proc is None:
            return
        self.kill()
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        if self._reader is not None:
            self._reader.join(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise HarnessError(
                f"node {self.name} exited with {self.proc.returncode}\n{self.diagnostics()}"
            )

    # ---- collected output

    @property
    def lines(self) -> list[str]:
        with self._lock:
            return list(self._lines)

    @property
    def view(self) -> tuple[str, ...] | None:
        """The latest view the node printed (coordinator first), or None before the first."""
        with self._lock:
            return self._views[-1] if self._views else None

    @property
    def views(self) -> list[tuple[str, ...]]:
        with self._lock:
            return list(self._views)

    def received(self, sender: str | None = None, prefix: str | None = None) -> list[str]:
        """Texts received (in delivery order), optionally only from ``sender`` / with ``prefix``."""
        with self._lock:
            items = list(self._received)
        return [
            r.text
            for r in items
            if (sender is None or r.sender == sender)
            and (prefix is None or r.text.startswith(prefix + "-"))
        ]

    def received_count(self, prefix: str) -> int:
        start = prefix + "-"
        with self._lock:
            return sum(1 for r in self._received if r.text.startswith(start))

    def errors(self) -> list[str]:
        with self._lock:
            return [line for line in self._lines if line.startswith("ERR ")]

    def diagnostics(self, lines: int = 25) -> str:
        with self._lock:
            out_tail = self._lines[-lines:]
            views = self._views[-5:]
        code = None if self.proc is None else self.proc.poll()
        return (
            f"--- node {self.name} (exit={code}) last views: {views}\n"
            f"--- stdout tail:\n" + "\n".join(out_tail) + "\n"
            f"--- stderr tail ({self.err_path}):\n{tail(self.err_path, lines)}"
        )

    # ---- waits

    async def wait_line(self, predicate: Callable[[str], bool], timeout: float, what: str) -> str:
        found: list[str] = []

        def condition() -> bool:
            with self._lock:
                for line in self._lines:
                    if predicate(line):
                        found.append(line)
                        return True
            return False

        await wait_until(
            condition,
            timeout,
            lambda: f"{what} on node {self.name}\n{self.diagnostics()}",
            self.check_alive,
        )
        return found[0]

    async def wait_sent(self, kind: str, prefix: str, timeout: float) -> None:
        """Wait for ``SENT <kind> <count> <prefix>``; fails at once on ``ERR <kind>``."""

        def condition() -> bool:
            for line in self.lines:
                if line.startswith(f"ERR {kind}"):
                    raise AssertionError(f"node {self.name}: {line}\n{self.diagnostics()}")
                parts = line.split()
                if parts[:2] == ["SENT", kind] and parts[3:4] == [prefix]:
                    return True
            return False

        await wait_until(
            condition,
            timeout,
            lambda: f"SENT {kind} {prefix} on node {self.name}\n{self.diagnostics()}",
            self.check_alive,
        )


# --------------------------------------------------------------------------------------------
# Groups of nodes


def describe_views(nodes: Iterable[JavaNode]) -> str:
    return "; ".join(f"{n.name}: {n.view}" for n in nodes)


def _diagnostics(nodes: Sequence[JavaNode], router: Router | None) -> str:
    parts = [n.diagnostics() for n in nodes]
    if router is not None:
        parts.append(f"--- router {router.kind} log ({router.log_path}):\n{router.logs()}")
    return "\n".join(parts)


async def wait_for_view(
    nodes: Sequence[JavaNode],
    members: Iterable[str],
    timeout: float,
    router: Router | None = None,
) -> float:
    """Wait until every node's latest view has exactly ``members`` (any order); return seconds."""
    expected = sorted(members)

    def condition() -> bool:
        views = [n.view for n in nodes]
        return all(v is not None and sorted(v) == expected for v in views) and (
            len({v for v in views}) == 1  # the same view (same coordinator) everywhere
        )

    def check() -> None:
        for n in nodes:
            n.check_alive()

    return await wait_until(
        condition,
        timeout,
        lambda: (
            f"view {expected} everywhere; have {describe_views(nodes)}\n"
            + _diagnostics(nodes, router)
        ),
        check,
    )


def start_nodes(
    names: Sequence[str], cluster: str, stack: str, router_port: int | str, log_dir: Path
) -> list[JavaNode]:
    """``router_port`` may be "P1,P2" for several routers (TUNNEL gossip_router_hosts)."""
    # Launch one JVM per name at once (JVM start-up is slow; they start concurrently).
    nodes = [JavaNode(name, cluster, stack, router_port, log_dir) for name in names]
    for node in nodes:
        node.start()
    return nodes


def expected_texts(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-{i}" for i in range(count)]


def summarize_counts(nodes: Sequence[JavaNode], prefixes: Sequence[str]) -> str:
    return "; ".join(f"{n.name}: { {p: n.received_count(p) for p in prefixes} }" for n in nodes)


class NodeFactory:
    """Starts InteropNode JVMs against the test's router and kills leftovers at teardown."""

    def __init__(self, router: Router, log_dir: Path) -> None:
        self.router = router
        self.log_dir = log_dir
        self.nodes: list[JavaNode] = []

    def start(self, names: list[str], cluster: str, stack: str,
              routers: Sequence[Router] = ()) -> list[JavaNode]:
        """Start nodes using the test's router, or every router in ``routers``."""
        ports = ",".join(str(r.port) for r in routers) if routers else self.router.port
        nodes = start_nodes(names, cluster, stack, ports, self.log_dir)
        self.nodes.extend(nodes)
        return nodes

    def close(self) -> None:
        for node in self.nodes:
            node.close()
