"""Run the router as a real subprocess for tests that need one (signals, restarts, RSS)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from gossiprouter.loadtest.processes import MOSQUITTO, mosquitto_config

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A port on 127.0.0.1 where a connection is refused for as long as the block runs: the
    port stays bound (not listening, no SO_REUSEADDR), so no other process of the run (a
    sanitizer job's router, a broker) can take it meanwhile, as it could take a port that
    `free_port` has let go."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen[bytes] | None = None,
                   timeout: float = 20.0) -> None:
    """Wait until 127.0.0.1:port accepts; fail at once if ``proc`` exits first."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"router exited with status {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listening on 127.0.0.1:{port}") from None
            time.sleep(0.05)


def proc_cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a whole process (every thread), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU of a whole process (every thread), from /proc/PID/stat."""
    return sum(proc_cpu_split(pid))


class RouterProcess:
    """``python -m gossiprouter serve`` on 127.0.0.1:port, stopped with SIGTERM on exit."""

    def __init__(self, port: int | None = None, *args: str, log: Path | None = None) -> None:
        self.port = port or free_port()
        self.args = args
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        """What :meth:`start` runs: a process listening on 127.0.0.1:``port``."""
        return [sys.executable, "-m", "gossiprouter", "serve", "--host", "127.0.0.1",
                "--port", str(self.port), *self.args]

    def start(self) -> RouterProcess:
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(self.command(), stdout=out, stderr=out, cwd=REPO)
        wait_listening(self.port, self.proc)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.pid)

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, wait; returns the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def __enter__(self) -> RouterProcess:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class BrokerProcess:
    """Debian's mosquitto on 127.0.0.1:port, configured by the load test's
    ``mosquitto_config`` (optionally bridged to another broker); stopped on exit."""

    def __init__(self, directory: Path, *, bridge_to: int | None = None,
                 prefix: str = "gossiprouter") -> None:
        self.port = free_port()
        self.conf = directory / f"mosquitto-{self.port}.conf"
        self.conf.write_text(mosquitto_config(self.port, bridge_to=bridge_to, prefix=prefix))
        self.log = directory / f"mosquitto-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> BrokerProcess:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=out,
                                         stderr=out)
        wait_listening(self.port, self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_bridged(a: BrokerProcess, b: BrokerProcess, prefix: str = "gossiprouter",
                 timeout: float = 20.0) -> None:
    """Return once a message published under ``prefix/`` on each broker reaches a subscriber
    of the other (the mosquitto bridge between them is up both ways); raise TimeoutError
    otherwise. A probe topic of three levels matches no router's filter."""
    import threading

    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

    deadline = time.monotonic() + timeout
    for src, dst in ((a, b), (b, a)):
        got = threading.Event()
        sub, pub = (mqtt.Client(CallbackAPIVersion.VERSION2,
                                            protocol=MQTTProtocolVersion.MQTTv5)
                    for _ in range(2))
        sub.on_message = lambda *_, got=got: got.set()
        topic = f"{prefix}/probe/{src.port}"
        try:
            sub.connect("127.0.0.1", dst.port)
            sub.subscribe(topic)
            sub.loop_start()
            pub.connect("127.0.0.1", src.port)
            pub.loop_start()
            while not got.wait(0.1):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the mosquitto bridge {src.port} -> {dst.port} "
                                       f"carried nothing within {timeout:g} s")
                pub.publish(topic, b"probe")
        finally:
            for c in (sub, pub):
                c.loop_stop()
                c.disconnect()
