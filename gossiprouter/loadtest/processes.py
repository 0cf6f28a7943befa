"""The load test's child processes: the spawned routers, broker and peers, supervised.

:class:`SpawnedRouter` runs ``gossiprouter serve`` on 127.0.0.1 (and stops and restarts it);
:class:`SpawnedBroker` runs the mosquitto a federation of spawned routers bridges to, its
config written by :func:`mosquitto_config` (also used by the tests and benchmarks, so a
broker, bridged or not, is configured in one place);
:class:`PeerProcess` runs one ``python -m gossiprouter.loadtest.peer`` and speaks its control
channel (JSON lines over stdin/stdout, see :mod:`gossiprouter.loadtest.peer`). Both raise
:class:`~gossiprouter.loadtest.errors.LoadTestError` when their process dies unexpectedly, and
every wait here is bounded. What to do with them, and when, is the driver's
(:mod:`gossiprouter.loadtest.driver`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import trio

from gossiprouter.loadtest.errors import LoadTestError
from gossiprouter.loadtest.progress import PeerView
from gossiprouter.loadtest.scenario import MemberSpec

__all__ = [
    "CLEANUP_WAIT",
    "HOST",
    "MOSQUITTO",
    "ExitedAtStart",
    "PeerProcess",
    "SpawnedBroker",
    "SpawnedFederation",
    "SpawnedRouter",
    "can_connect",
    "free_port",
    "mosquitto_config",
    "wait_exit",
]

HOST: Final = "127.0.0.1"
ROUTER_START_TIMEOUT: Final = 20.0
ROUTER_STOP_TIMEOUT: Final = 15.0
CLEANUP_WAIT: Final = 5.0
CONTROL_WRITE_TIMEOUT: Final = 10.0
MOSQUITTO: Final = "/usr/sbin/mosquitto"


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def _last_line(path: Path) -> str:
    """The last non-empty line of a log, for error messages."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln]
    return lines[-1][:300] if lines else ""


def _exit_status(rc: int | None) -> str:
    """``exited with status 1`` / ``was killed by SIGKILL``."""
    if rc is not None and rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with status {rc}"


async def can_connect(port: int) -> bool:
    try:
        with trio.move_on_after(1.0):
            stream = await trio.open_tcp_stream(HOST, port)
            await stream.aclose()
            return True
    except OSError:
        return False
    return False


async def wait_exit(proc: trio.Process, timeout: float) -> bool:
    """Wait up to ``timeout`` for ``proc`` to exit; True if it did."""
    with trio.move_on_after(timeout):
        await proc.wait()
    return proc.returncode is not None


class ExitedAtStart(LoadTestError):
    """A spawned process exited before it listened: ``what``, its exit ``status`` and the
    ``log`` that says why."""

    def __init__(self, what: str, status: int | None, log: Path) -> None:
        super().__init__(f"{what} {_exit_status(status)} at start: {_last_line(log)} "
                         f"(log: {log})")
        self.what, self.status, self.log = what, status, log


class _Spawned:
    """A child the driver starts, waits for on its port, supervises and stops: its exit is
    a :class:`LoadTestError` unless the driver is stopping it."""

    what = "the router"

    def __init__(self, port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path
        self.proc: trio.Process | None = None
        self.stopping = False  # the driver is stopping it: its exit is expected

    def argv(self) -> list[str]:
        raise NotImplementedError

    async def start(self, nursery: trio.Nursery) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = await trio.lowlevel.open_process(
                self.argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True)
        proc = self.proc
        deadline = trio.current_time() + ROUTER_START_TIMEOUT
        while not await can_connect(self.port):
            if proc.returncode is not None or proc.poll() is not None:
                raise ExitedAtStart(self.what, proc.returncode, self.log_path)
            if trio.current_time() > deadline:
                raise LoadTestError(f"{self.what} did not listen on {HOST}:{self.port} within "
                                    f"{ROUTER_START_TIMEOUT:g} s (log: {self.log_path})")
            await trio.sleep(0.05)
        self.stopping = False
        nursery.start_soon(self._supervise, proc)

    async def _supervise(self, proc: trio.Process) -> None:
        await proc.wait()
        if not self.stopping and proc is self.proc:
            raise LoadTestError(f"{self.what} {_exit_status(proc.returncode)} unexpectedly: "
                                f"{_last_line(self.log_path)} (log: {self.log_path})")

    async def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        self.stopping = True
        proc.send_signal(sig)
        if not await wait_exit(proc, ROUTER_STOP_TIMEOUT):
            proc.kill()
            await wait_exit(proc, CLEANUP_WAIT)


class SpawnedRouter(_Spawned):
    """``gossiprouter serve`` on 127.0.0.1:port, run (and restarted) by the driver."""

    def __init__(self, port: int, args: tuple[str, ...], log_path: Path,
                 name: str = "the router") -> None:
        super().__init__(port, log_path)
        self.args = args
        self.what = name
        self.restarts = 0

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "gossiprouter", "serve", "--host", HOST,
                "--port", str(self.port), *self.args]

    async def restart(self, nursery: trio.Nursery, sig: signal.Signals, down: float) -> None:
        await self.stop(sig)
        await trio.sleep(down)
        await self.start(nursery)
        self.restarts += 1


def mosquitto_config(port: int, *, bridge_to: int | None = None,
                     prefix: str = "gossiprouter") -> str:
    """A mosquitto config listening on 127.0.0.1:port, anonymous, without persistence.

    With ``bridge_to`` the broker also bridges to the mosquitto on 127.0.0.1:bridge_to (a
    ``connection`` section): everything under ``prefix/`` (topic publications) and
    ``%fed/prefix/`` (the federation's own topics) both ways, which is all a federation of
    routers publishes. That is the multi-broker deployment in small.
    """
    # set_tcp_nodelay: a batch's PUBLISH is not held for the delayed ACK (docs/federation.md).
    lines = [f"listener {port} {HOST}", "allow_anonymous true", "persistence false",
             "set_tcp_nodelay true"]
    if bridge_to is not None:
        lines += [
            f"connection bridge-{port}-{bridge_to}",
            f"address {HOST}:{bridge_to}",
            f"topic {prefix}/# both 0",
            f"topic %fed/{prefix}/# both 0",  # the federation's own topics (mqtt_topics)
            # MQTT 5 both ways: the routers' user properties (origin, sequence number,
            # sender) must cross the bridge unchanged, and 3.1.1 has none.
            "bridge_protocol_version mqttv50",
            # A mosquitto at each end: neither sends back what came over the bridge.
            "try_private true",
            "cleansession true",
            "notifications false",
            "start_type automatic",
            # Back within a second when the other broker restarts (the default backs off
            # from 5 s to 30 s).
            "restart_timeout 1",
            "keepalive_interval 5",
        ]
    return "\n".join(lines) + "\n"


class SpawnedBroker(_Spawned):
    """A mosquitto on 127.0.0.1:port that a federation of spawned routers bridges to."""

    what = "mosquitto"

    def __init__(self, directory: Path, port: int | None = None, *,
                 bridge_to: int | None = None, prefix: str = "gossiprouter") -> None:
        port = port or free_port()
        super().__init__(port, directory / f"mosquitto-{port}.log")
        self.conf = directory / f"mosquitto-{port}.conf"
        self.conf.write_text(mosquitto_config(port, bridge_to=bridge_to, prefix=prefix))

    @property
    def url(self) -> str:
        return f"mqtt://{HOST}:{self.port}"

    def argv(self) -> list[str]:
        return [MOSQUITTO, "-c", str(self.conf)]

    async def start(self, nursery: trio.Nursery) -> None:
        if not os.access(MOSQUITTO, os.X_OK):
            raise LoadTestError(f"{MOSQUITTO} is not installed (scripts/setup installs it)")
        await super().start(nursery)


class SpawnedFederation:
    """A mosquitto and ``routers`` routers bridged to it (``--bridge``, ``--router-id rN``),
    every one on a free port of 127.0.0.1: the federation the topic and federated load tests
    run against. The routers' logs are ``router-N.log`` in ``log_dir``. With ``metrics``
    each router also serves its metrics on a port of its own (``self.metrics``, in the
    routers' order)."""

    def __init__(self, routers: int, args: tuple[str, ...], log_dir: Path, *,
                 metrics: bool = False) -> None:
        self.broker = SpawnedBroker(log_dir)
        # A router whose broker was away reconnects within half a second, not the
        # production default's 30 s: runs are short.
        bridge = ("--bridge", self.broker.url, "--bridge-reconnect-max", "0.5")
        self.metrics = [f"{HOST}:{free_port()}" for _ in range(routers)] if metrics else []
        self.routers = [
            SpawnedRouter(free_port(), (*args, *bridge, "--router-id", f"r{i}",
                                        *(("--metrics", self.metrics[i]) if metrics else ())),
                          log_dir / f"router-{i}.log", name=f"router {i}")
            for i in range(routers)]

    @property
    def addresses(self) -> list[str]:
        return [f"{HOST}:{r.port}" for r in self.routers]

    async def start(self, nursery: trio.Nursery) -> None:
        await self.broker.start(nursery)
        for r in self.routers:
            await r.start(nursery)

    async def stop(self) -> None:
        for r in self.routers:
            await r.stop()
        await self.broker.stop()


class PeerProcess:
    """One peer process and its control channel."""

    def __init__(self, proc_no: int, members: list[MemberSpec], log_path: Path) -> None:
        self.proc_no = proc_no
        self.members = members
        self.log_path = log_path
        self.process: trio.Process | None = None
        self.state = "starting"
        self.joined: dict[str, str] = {}  # member -> group, as the peer reported
        self.ready = trio.Event()
        self.finished = trio.Event()  # "bye" received
        self.stats: dict[str, Any] = {}
        self.rates = (0.0, 0.0)
        self.error: str | None = None
        self.expected_exit = False  # killed by the driver, or cleaning up
        self._buffer = bytearray()
        self._replies: dict[int, dict[str, Any]] = {}
        self._reply_events: dict[int, trio.Event] = {}
        self._next_id = 0
        self._send_lock = trio.Lock()

    @property
    def name(self) -> str:
        return f"p{self.proc_no}"

    async def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "gossiprouter.loadtest.peer"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                start_new_session=True)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def send(self, msg: dict[str, Any]) -> None:
        assert self.process is not None and self.process.stdin is not None
        data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        async with self._send_lock:
            try:
                with trio.fail_after(CONTROL_WRITE_TIMEOUT):
                    await self.process.stdin.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise LoadTestError(f"peer process {self.proc_no} is gone "
                                    f"({self.error or _last_line(self.log_path)})") from None
            except trio.TooSlowError:
                raise LoadTestError(f"peer process {self.proc_no} has not read its control "
                                    f"channel for {CONTROL_WRITE_TIMEOUT:g} s "
                                    f"(log: {self.log_path})") from None

    async def request(self, msg: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        """Send a command and wait up to ``timeout`` for its reply (None if none came)."""
        self._next_id += 1
        req = self._next_id
        ev = self._reply_events[req] = trio.Event()
        try:
            await self.send({**msg, "id": req})
            with trio.move_on_after(timeout):
                await ev.wait()
            return self._replies.pop(req, None)
        finally:
            self._reply_events.pop(req, None)

    async def read_loop(self, on_message: Callable[[PeerProcess, dict[str, Any]], None]) -> None:
        assert self.process is not None and self.process.stdout is not None
        stdout = self.process.stdout
        while True:
            try:
                data = await stdout.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            self._buffer += data
            while (i := self._buffer.find(b"\n")) >= 0:
                line = bytes(self._buffer[:i])
                del self._buffer[:i + 1]
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue  # not ours (cannot happen: the peer keeps fd 1 for the channel)
                if isinstance(msg, dict):
                    self._dispatch(msg, on_message)

    def _dispatch(self, msg: dict[str, Any],
                  on_message: Callable[[PeerProcess, dict[str, Any]], None]) -> None:
        ev = msg.get("ev")
        if ev == "reply":
            req = msg.get("id")
            if isinstance(req, int) and req in self._reply_events:
                self._replies[req] = msg
                self._reply_events[req].set()
            return
        if ev in ("stats", "bye"):
            old = self.stats
            if old and msg.get("t_ns", 0) > old.get("t_ns", 0):
                dt = (msg["t_ns"] - old["t_ns"]) / 1e9
                self.rates = ((msg["sent"] - old["sent"]) / dt,
                              (msg["received"] - old["received"]) / dt)
            self.stats = msg
            if ev == "bye":
                self.state = "done"
                self.rates = (0.0, 0.0)
                self.finished.set()
        elif ev == "ready":
            self.ready.set()
        elif ev == "error":
            self.error = str(msg.get("message"))
        on_message(self, msg)

    async def supervise(self) -> None:
        assert self.process is not None
        rc = await self.process.wait()
        if self.expected_exit or (self.finished.is_set() and rc == 0):
            return
        self.state = "failed"
        why = self.error or _last_line(self.log_path) or "no message in its log"
        raise LoadTestError(f"peer process {self.proc_no} {_exit_status(rc)}: {why} "
                            f"(log: {self.log_path})")

    def view(self) -> PeerView:
        s = self.stats
        return PeerView(self.proc_no, len(self.members), len(self.joined), self.state,
                        int(s.get("sent", 0)), int(s.get("received", 0)),
                        int(s.get("errors", 0)), int(s.get("dropped", 0)), *self.rates)
