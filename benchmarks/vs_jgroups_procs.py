"""bench_vs_jgroups.py's child processes and what it reads of the machine: the routers (Java,
gossiprouter or the C floor, one fresh process a run), the Blaster load generators, their
clean-up however the driver ends, and CPU and memory from /proc.
"""

from __future__ import annotations

import ctypes
import os
import platform
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from benchmarks.floor import build as floor_build
from benchmarks.machine import cpu_idle
from tests.procs import proc_cpu_seconds, wait_listening

REPO = Path(__file__).resolve().parent.parent
JAR = Path("/usr/share/java/jgroups.jar")
JAVA_SRC = REPO / "benchmarks" / "jgroups" / "Blaster.java"
CLASSES = REPO / "benchmarks" / "jgroups" / "classes"
JAVA = "java"
# The light-load floor's router kind: benchmarks/floor/relay.c, built with cc into build/.
FLOOR = "floor"
# The floor with a blocked reader thread per connection (Java 5.x's threading):
# benchmarks/floor/threads.c, built beside it.
FLOOR_THREADS = "floor-threads"

# The Java router is thread-per-connection: a small stack per thread keeps 10,000 connections
# cheap in address space; 512 MiB of heap is plenty for the router's per-connection buffers.
JAVA_ROUTER_OPTS = ("-Xmx512m", "-Xss256k")
LOADER_OPTS = ("-Xms64m", "-Xmx256m", "-Xss256k", "-XX:+UseSerialGC")

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
            cmd = [str(ensure_floor_built()), str(port)]
        elif kind == FLOOR_THREADS:
            cmd = [str(ensure_floor_threads_built()), str(port)]
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


def ensure_floor_built() -> Path:
    """The C floor's binary, compiled first if relay.c is newer (SystemExit with the cause when
    it cannot be built)."""
    return floor_build.built()


def ensure_floor_threads_built() -> Path:
    """The thread-per-connection floor's binary (threads.c), as :func:`ensure_floor_built`."""
    return floor_build.built_threads()


@contextmanager
def cleanup_on_exit() -> Iterator[None]:
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        kill_children()
        signal.signal(signal.SIGTERM, old)


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
        "cpuidle": cpu_idle(),
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
