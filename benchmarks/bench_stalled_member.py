"""A stalled real JGroups 5.x member: what the healthy ones get, and how fast it catches up
(issue 31).

``--members`` JChannel members (benchmarks/jgroups5/StallMember.java, the stock 5.x
``tunnel.xml`` stack: TUNNEL, NAKACK2, UNICAST3, ...) join one cluster through a router on
127.0.0.1 and each multicasts ``--rate`` msg/s of ``--size`` bytes. After ``--settle`` seconds
the last member is stopped with SIGSTOP for ``--stall`` seconds, then continued with SIGCONT.
Per run it measures:

* **healthy**: of the messages the healthy members sent each other during the stall, how many
  were delivered by the SIGCONT (summed over the healthy receivers);
* **catch-up**: from the SIGCONT until the stalled member had been delivered every message the
  others sent before it (the members stamp ``System.nanoTime()``, which is
  ``CLOCK_MONOTONIC`` on Linux like ``time.monotonic_ns()``); ``steady``: traffic goes on,
  ``quiet``: every member stops sending ``--quiet-after`` seconds into the stall.

Routers (``--routers``): ``defaults`` (``gossiprouter serve`` from ``--src``, the checkout to
measure, by default this one), ``wt0`` (the same with ``--write-timeout 0``; ``--gr-args``
adds options to both) and ``java`` (``org.jgroups.stack.GossipRouter`` of the JGroups
given). Medians of ``--runs`` runs.

It needs JGroups 5.x (``--jgroups``: a jar or a classes directory; the 2.12 jar that
scripts/setup installs will not do) and javac. A benchmark, not a test: it asserts nothing.

    .venv/bin/python benchmarks/bench_stalled_member.py --jgroups /path/to/jgroups-5.5.6.jar
    .venv/bin/python benchmarks/bench_stalled_member.py --jgroups J --src /tmp/base \\
        --routers defaults --label "before"
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.routers import free_port, serving, wait_listening  # noqa: E402

MEMBER_SRC = REPO / "benchmarks" / "jgroups5" / "StallMember.java"
ROUTERS = ("defaults", "wt0", "java")
CASES = ("steady", "quiet")
NS = 1_000_000_000
REPLIES = ("CONNECTED", "READY", "GO", "HALTAT", "SENTBY", "GOTBY", "LASTOF", "ERR")


class BenchError(Exception):
    """A run that cannot go on: the cause, for the user."""


def compile_member(jgroups: Path) -> Path:
    """StallMember compiled against ``jgroups`` (cached per source and JGroups path)."""
    javac = shutil.which("javac")
    if javac is None:
        raise BenchError("no javac on PATH (install a JDK, 11 or newer)")
    key = hashlib.sha256(MEMBER_SRC.read_bytes() + str(jgroups.resolve()).encode()).hexdigest()
    out = Path(tempfile.gettempdir()) / f"stallmember-{key[:16]}"
    if (out / "StallMember.class").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([javac, "-nowarn", "-cp", str(jgroups), "-d", str(out),
                           str(MEMBER_SRC)], capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(out, ignore_errors=True)
        raise BenchError(f"javac failed: is {jgroups} JGroups 5.x?\n{done.stderr[-2000:]}")
    return out


class Member:
    """One StallMember process, driven line by line."""

    def __init__(self, index: int, members: int, port: int, cp: str, deadline: float,
                 log: Path) -> None:
        self.index = index
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            ["java", "-Xmx256m", "-Djava.net.preferIPv4Stack=true",
             "-Djgroups.bind_addr=127.0.0.1",
             f"-Djgroups.tunnel.gossip_router_hosts=127.0.0.1[{port}]",
             "-cp", cp, "StallMember", str(index), str(members), "stall", str(deadline)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
            bufsize=1)

    def expect(self, word: str) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        while line and line.split(maxsplit=1)[:1] not in ([w] for w in REPLIES):
            line = self.proc.stdout.readline()  # what JGroups prints (GMS: address=...)
        if not line.startswith(word):
            raise BenchError(f"member {self.index}: expected {word}, got {line.strip()!r} "
                             f"(exit {self.proc.poll()}; log {self._log.name})")
        return line.split(maxsplit=1)[1].strip() if " " in line.strip() else ""

    def ask(self, command: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.expect(command.split()[0])

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
                assert self.proc.stdin is not None
                self.proc.stdin.write("QUIT\n")
                self.proc.stdin.close()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@contextmanager
def router(kind: str, src: Path, jgroups: Path, port: int,
           gr_args: Sequence[str]) -> Iterator[None]:
    """The router ``kind`` on 127.0.0.1:``port`` for the block."""
    if kind in ("defaults", "wt0"):
        extra = ("--write-timeout", "0") if kind == "wt0" else ()
        with ExitStack() as stack:
            try:
                stack.enter_context(serving(src, port, *gr_args, *extra))
            except (RuntimeError, TimeoutError) as e:
                raise BenchError(f"gossiprouter serve {' '.join([*gr_args, *extra])}: {e} "
                                 "(try the same options by hand)") from None
            yield
        return
    proc = subprocess.Popen(
        ["java", "-Djava.net.preferIPv4Stack=true", "-cp", str(jgroups),
         "org.jgroups.stack.GossipRouter", "-port", str(port), "-bind_addr", "127.0.0.1",
         "-diag_enabled", "false"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not wait_listening(proc, port, 30.0):
            raise BenchError(f"the Java GossipRouter did not listen (exit {proc.poll()})")
        yield
    finally:
        proc.terminate()
        proc.wait(10)


@dataclass
class Run:
    healthy_got: int
    healthy_sent: int
    catch_up: float | None  # seconds; None: not within the limit


def one_run(a: argparse.Namespace, kind: str, case: str, cp: str, logs: Path) -> Run:
    port = free_port()
    n = a.members
    stalled = n - 1
    deadline = a.settle + a.stall + a.catchup_limit + 60
    with ExitStack() as stack, router(kind, a.src, a.jgroups, port, shlex.split(a.gr_args)):
        members: list[Member] = []
        for i in range(n):  # one after another: a single coordinator, no merge to wait for
            m = Member(i, n, port, cp, deadline, logs / f"{kind}-{case}-m{i}.log")
            stack.callback(m.close)
            members.append(m)
            m.expect("CONNECTED")
        for m in members:
            m.expect("READY")
        for m in members:
            m.ask(f"GO {a.rate} {a.size}")
        time.sleep(a.settle)
        t_stop = time.monotonic_ns()
        if case == "quiet":
            for m in members:
                m.ask(f"HALTAT {t_stop + int(a.quiet_after * NS)}")
        os.kill(members[stalled].proc.pid, signal.SIGSTOP)
        time.sleep(a.stall)
        t_cont = time.monotonic_ns()
        os.kill(members[stalled].proc.pid, signal.SIGCONT)
        healthy = members[:stalled]
        before_stop = {m.index: int(m.ask(f"SENTBY {t_stop}")) for m in healthy}
        before_cont = {m.index: int(m.ask(f"SENTBY {t_cont}")) for m in healthy}
        got = sent = 0
        for h in healthy:
            for j in healthy:
                if j is not h:
                    a_j, b_j = before_stop[j.index], before_cont[j.index]
                    got += int(h.ask(f"GOTBY {j.index} {a_j} {b_j} {t_cont}"))
                    sent += b_j - a_j
        limit = time.monotonic() + a.catchup_limit
        catch_up: float | None = None
        while time.monotonic() < limit:
            lasts = [int(members[stalled].ask(f"LASTOF {j} {k}").split()[0])
                     for j, k in before_cont.items()]
            if min(lasts) >= 0:
                catch_up = max(0, max(lasts) - t_cont) / NS
                break
            time.sleep(0.1)
        return Run(got, sent, catch_up)


@dataclass
class Row:
    runs: dict[str, list[Run]] = field(default_factory=dict)


def fmt_s(values: Sequence[float | None], limit: float) -> str:
    shown = [f"{v:.2f}" if v is not None else f">{limit:g}" for v in values]
    known = [v for v in values if v is not None]
    if len(known) == len(values) and known:
        med = f"{statistics.median(known):.2f} s"
    else:  # runs that never caught up sort last
        ordered = sorted(values, key=lambda v: float("inf") if v is None else v)
        mid = ordered[len(ordered) // 2]
        med = f"{mid:.2f} s" if mid is not None else f">{limit:g} s"
    return f"{med} ({', '.join(shown)})"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--jgroups", type=Path, required=True,
                    help="a JGroups 5.x jar or classes directory (with tunnel.xml)")
    ap.add_argument("--src", type=Path, default=REPO, help="the router checkout to run")
    ap.add_argument("--label", default="gossiprouter", help="the checkout's name in the table")
    ap.add_argument("--gr-args", default="", metavar="ARGS",
                    help="more gossiprouter serve options, e.g. '--outbound-queue-bytes 2097152'")
    ap.add_argument("--routers", default=",".join(ROUTERS),
                    help=f"comma-separated, of {', '.join(ROUTERS)}")
    ap.add_argument("--cases", default=",".join(CASES), help="steady, quiet or both")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--members", type=int, default=3)
    ap.add_argument("--rate", type=int, default=200, help="msg/s per member")
    ap.add_argument("--size", type=int, default=1024, help="bytes per message")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds of traffic before")
    ap.add_argument("--stall", "--seconds", type=float, default=15.0,
                    help="seconds the member is stopped")
    ap.add_argument("--quiet-after", type=float, default=5.0,
                    help="quiet case: seconds into the stall when all stop sending")
    ap.add_argument("--catchup-limit", type=float, default=90.0,
                    help="seconds after SIGCONT to wait for the catch-up")
    a = ap.parse_args(argv)
    kinds = [k for k in a.routers.split(",") if k]
    cases = [c for c in a.cases.split(",") if c]
    bad = sorted(set(kinds) - set(ROUTERS)) + sorted(set(cases) - set(CASES))
    if bad or a.members < 2 or a.rate < 1:
        ap.error(f"unknown router or case: {', '.join(bad)}" if bad
                 else "--members >= 2 and --rate >= 1")
    if not a.jgroups.exists():
        ap.error(f"--jgroups {a.jgroups}: no such file or directory")
    try:
        cp = f"{a.jgroups}{os.pathsep}{compile_member(a.jgroups)}"
        logs = Path(tempfile.mkdtemp(prefix="stallmember-logs-"))
        print(f"{a.members} members x {a.rate} msg/s x {a.size} B; stall {a.stall:g} s after "
              f"{a.settle:g} s; quiet: stop {a.quiet_after:g} s into the stall; "
              f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}; logs {logs}", flush=True)
        rows: dict[str, Row] = {}
        for run in range(a.runs):  # interleaved, so a change of load hits every router alike
            for kind in kinds:
                for case in cases:
                    r = one_run(a, kind, case, cp, logs)
                    rows.setdefault(kind, Row()).runs.setdefault(case, []).append(r)
                    print(f"run {run + 1} {kind:8} {case:6} healthy {r.healthy_got}/"
                          f"{r.healthy_sent} catch-up "
                          f"{'-' if r.catch_up is None else f'{r.catch_up:.2f} s'}", flush=True)
    except BenchError as e:
        print(f"bench_stalled_member: {e}", file=sys.stderr)
        return 2
    print(f"\nload {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| router | healthy members during the stall | catch-up, traffic steady | "
          "catch-up, traffic stopped |")
    print("|---|---|---|---|")
    for kind, row in rows.items():
        name = {"defaults": f"{a.label}, defaults", "wt0": f"{a.label}, --write-timeout 0",
                "java": "Java GossipRouter"}[kind]
        steady = row.runs.get("steady", [])
        quiet = row.runs.get("quiet", [])
        healthy = "-"
        if steady:
            got = [r.healthy_got for r in steady]
            healthy = (f"{int(statistics.median(got)):,} / "
                       f"{int(statistics.median([r.healthy_sent for r in steady])):,} "
                       f"({', '.join(f'{g:,}' for g in got)})")
        cells = [fmt_s([r.catch_up for r in rs], a.catchup_limit) if rs else "-"
                 for rs in (steady, quiet)]
        print(f"| {name} | {healthy} | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
