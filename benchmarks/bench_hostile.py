"""Hostile-client benchmark: what one client can do to everyone else (issue 12).

Three measurements, each against a fresh router subprocess on 127.0.0.1:

(a) **Round trip under a flood.** Another client's native PING round trip (p50, p99, max),
    alone, then while one connection sends ``--flood-rate`` bytes/s of native PINGs (reading
    its PONGs), then while one connection does the same with JGroups 5.x HEARTBEATs.
(b) **Pre-auth partial frames.** Router started with a tokens file. ``--partial-conns``
    connections each send the native preamble, then a HELLO whose length prefix says
    ``--partial-size`` bytes, followed by all of that but the last byte. Router RSS before,
    while they are open, and ``--settle`` seconds after they close (no forced GC).
(c) **Admin stall.** ``--groups`` groups created by a few connections doing many CONNECTs; a
    PING round-trip loop runs while ``GET /groups`` is fetched (one page, then every page by
    its ``next`` cursor; a router without paging answers everything in one), then
    ``/metrics``; the stall is the longest round trip seen during the fetch (the baseline is
    the longest one before it).

``--router-tree DIR`` runs the router from another checkout (its ``.venv``), e.g. the commit
before a fix, so that before and after come from one run on the same machine.

A benchmark, not a test: it prints one table and asserts nothing. A router that dies during a
case is reported as such (that is the figure). Every loop is bounded in time and count.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing as mp
import os
import queue
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.figures import percentile  # noqa: E402
from gossiprouter.protocol import jgroups5 as j5  # noqa: E402
from gossiprouter.protocol import native as wire  # noqa: E402
from tests.procs import RouterProcess, free_port, wait_listening  # noqa: E402

MiB = 1 << 20
TOKEN = "bench-hostile-token"


class RouterDied(Exception):
    """The router process exited during a case."""


@dataclass
class Row:
    measure: str
    value: str
    note: str = ""


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)

    def add(self, measure: str, value: str, note: str = "") -> None:
        self.rows.append(Row(measure, value, note))
        print(f"  {measure}: {value}" + (f"  ({note})" if note else ""), flush=True)


# --------------------------------------------------------------------------- native helpers


def native_client(port: int, token: str | None = None, timeout: float = 10.0) -> socket.socket:
    """A connected native client past HELLO/WELCOME (blocking socket)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(wire.PREAMBLE + wire.encode(wire.Hello((1,), "bench-hostile", token)))
    dec = wire.Decoder()
    while True:
        f = dec.next_frame()
        if f is not None:
            if not isinstance(f, wire.Welcome):
                raise RuntimeError(f"expected WELCOME, got {f!r}")
            return s
        data = s.recv(65536)
        if not data:
            raise RuntimeError("router closed the connection during HELLO")
        dec.feed(data)


class Pinger:
    """A PING round-trip loop on its own connection, in a thread: (start time, rtt) samples."""

    def __init__(self, port: int, token: str | None = None) -> None:
        self.sock = native_client(port, token)
        self.sock.settimeout(30.0)
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Pinger:
        self.thread.start()
        return self

    def _run(self) -> None:
        dec = wire.Decoder()
        nonce = 0
        try:
            while not self.stop.is_set():
                nonce += 1
                t0 = time.perf_counter()
                self.sock.sendall(wire.encode(wire.Ping(nonce)))
                while True:
                    f = dec.next_frame()
                    if isinstance(f, wire.Pong) and f.nonce == nonce:
                        break
                    if f is None:
                        data = self.sock.recv(65536)
                        if not data:
                            raise EOFError("router closed the connection")
                        dec.feed(data)
                self.samples.append((t0, time.perf_counter() - t0))
                time.sleep(0.002)  # ~400 samples/s: enough, and not a flood itself
        except (OSError, EOFError) as e:
            self.error = f"{type(e).__name__}: {e}"

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(35)
        self.sock.close()

    def rtts(self, t0: float, t1: float) -> list[float]:
        """Round trips that overlap [t0, t1): one stalled across the whole window counts."""
        return [r for t, r in self.samples if t < t1 and t + r > t0]


def ms(v: float) -> str:
    return f"{v * 1e3:.2f} ms" if v < 1 else f"{v:.2f} s"


def rtt_summary(rtts: list[float]) -> str:
    if not rtts:
        return "no round trip completed"
    return (f"p50 {ms(percentile(rtts, 0.5))}, p99 {ms(percentile(rtts, 0.99))}, "
            f"max {ms(max(rtts))} ({len(rtts)} samples)")


# Set by --router-tree: the checkout whose router is measured (None: this one).
ROUTER_TREE: Path | None = None


class TreeRouter(RouterProcess):
    """The router of another checkout, run with that checkout's own interpreter."""

    def start(self) -> RouterProcess:
        assert ROUTER_TREE is not None
        self.proc = subprocess.Popen(
            [str(ROUTER_TREE / ".venv/bin/python"), "-m", "gossiprouter", "serve", "--host",
             "127.0.0.1", "--port", str(self.port), *self.args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROUTER_TREE,
        )
        wait_listening(self.port, self.proc)
        return self


def router_process(*args: str) -> RouterProcess:
    return RouterProcess(None, *args) if ROUTER_TREE is None else TreeRouter(None, *args)


def router_has_option(flag: str) -> bool:
    """Does the measured router know ``flag`` (an older checkout may not)?"""
    tree = ROUTER_TREE or REPO
    exe = str(tree / ".venv/bin/python") if ROUTER_TREE is not None else sys.executable
    out = subprocess.run([exe, "-m", "gossiprouter", "serve", "--help"], cwd=tree,
                         capture_output=True, text=True, timeout=60).stdout
    return flag in out


def check_alive(router: RouterProcess) -> None:
    assert router.proc is not None
    if router.proc.poll() is not None:
        raise RouterDied(f"router exited with status {router.proc.returncode}")


# --------------------------------------------------------------------------- (a) floods


def _flood(port: int, kind: str, rate: float, burst: int, seconds: float,
           out: mp.Queue) -> None:  # type: ignore[type-arg]
    """One flooding connection: ``rate`` bytes/s of PINGs (native) or HEARTBEATs (5.x), sent
    in writes of ``burst`` bytes, for ``seconds``, with a thread reading and discarding the
    answers."""
    if kind == "native":
        s = native_client(port)
        frame = wire.encode(wire.Ping(1))
    else:
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        frame = j5.heartbeat()
    chunk = frame * max(1, burst // len(frame))
    got = [0]

    def reader() -> None:
        try:
            while True:
                data = s.recv(1 << 20)
                if not data:
                    return
                got[0] += len(data)
        except OSError:
            return

    threading.Thread(target=reader, daemon=True).start()
    sent = 0
    t0 = time.monotonic()
    s.settimeout(2.0)
    try:
        while (now := time.monotonic()) < t0 + seconds:
            ahead = sent / rate - (now - t0) if rate else 0.0
            if ahead > 0:
                time.sleep(min(ahead, 0.05))
                continue
            s.sendall(chunk)
            sent += len(chunk)
    except OSError:
        pass
    out.put((sent, got[0], time.monotonic() - t0))
    s.close()


def pause(args: argparse.Namespace, seconds: float) -> float:
    """A pause between phases: ``seconds``, or less for a short --rtt-seconds (a smoke run
    of a few seconds; the default --rtt-seconds keeps every pause whole)."""
    return min(seconds, float(args.rtt_seconds))


def case_floods(args: argparse.Namespace, report: Report) -> None:
    print("(a) PING round trip of another client under a flood", flush=True)
    ctx = mp.get_context("fork")
    with router_process("--log-level", "warning") as router:
        pinger = Pinger(router.port).start()
        try:
            t0 = time.perf_counter()
            time.sleep(args.rtt_seconds)
            report.add("(a) PING RTT, no flood", rtt_summary(pinger.rtts(t0, time.perf_counter())))
            rates = [args.flood_rate] + ([0.0] if args.flood_rate else [])
            floods = [(kind, label, rate) for kind, label in (
                ("native", "native PING flood"), ("jgroups5", "JGroups 5.x HEARTBEAT flood"))
                for rate in rates]
            for kind, label, rate in floods:
                check_alive(router)
                out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
                p = ctx.Process(target=_flood, args=(router.port, kind, rate, args.flood_burst,
                                                      args.rtt_seconds + 1.0, out))
                p.start()
                time.sleep(pause(args, 1.0))  # let the flood build up
                t0 = time.perf_counter()
                time.sleep(args.rtt_seconds)
                t1 = time.perf_counter()
                p.join(args.rtt_seconds + 30)
                try:
                    sent, got, took = out.get(timeout=10)
                except queue.Empty:  # the flood process died: its figures are unknown
                    sent, got, took = 0, 0, 1.0
                check_alive(router)
                how = (f"{rate / MiB:g} MiB/s in {args.flood_burst // 1024} KiB writes" if rate
                       else "unpaced")
                report.add(f"(a) PING RTT, {label} ({how})", rtt_summary(pinger.rtts(t0, t1)),
                           f"flood sent {sent / took / MiB:.2f} MiB/s, answers "
                           f"{got / took / MiB:.2f} MiB/s")
                time.sleep(pause(args, 1.0))
        finally:
            pinger.finish()
        if pinger.error:
            report.add("(a) pinger error", pinger.error)


# --------------------------------------------------------------------------- (b) partial frames


def rss_mib(router: RouterProcess) -> float:
    return router.rss_bytes() / MiB


def case_partial(args: argparse.Namespace, report: Report) -> None:
    print("(b) router RSS with pre-auth partial HELLOs (tokens file set)", flush=True)
    with tempfile.TemporaryDirectory() as d:
        tokens = Path(d) / "tokens.toml"
        tokens.write_text(f'[[token]]\nidentity = "bench"\ntoken = "{TOKEN}"\n'
                          'groups = ["*"]\n')
        os.chmod(tokens, 0o600)
        with router_process("--log-level", "warning", "--tokens-file", str(tokens)) as router:
            # One honest authenticated connection first, so the baseline includes a session.
            honest = native_client(router.port, TOKEN)
            time.sleep(0.5)
            before = rss_mib(router)
            peak = before
            n, size = args.partial_conns, args.partial_size
            head = wire.PREAMBLE + struct.pack(">I", size)
            body = bytes(size - 1)
            for rnd in range(args.partial_rounds):
                conns: list[socket.socket] = []
                errors: list[str] = []

                def one(conns: list[socket.socket] = conns, errors: list[str] = errors) -> None:
                    try:
                        s = socket.create_connection(("127.0.0.1", router.port), timeout=30)
                        conns.append(s)
                        s.sendall(head)
                        s.sendall(body)
                    except OSError as e:
                        errors.append(f"{type(e).__name__}: {e}")

                threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(120)
                # The router reads what was sent; wait until its RSS stops growing.
                last, stable = 0.0, 0
                deadline = time.monotonic() + 20
                while stable < 4 and time.monotonic() < deadline:
                    check_alive(router)
                    time.sleep(0.25)
                    cur = rss_mib(router)
                    stable = stable + 1 if abs(cur - last) < 1 else 0
                    last = cur
                    peak = max(peak, cur)
                held = rss_mib(router)
                report.add(f"(b) RSS with {n} partial {size / MiB:g} MiB HELLOs open"
                           + (f" (round {rnd + 1})" if args.partial_rounds > 1 else ""),
                           f"{held:.0f} MiB (before: {before:.0f} MiB, +{held - before:.0f})",
                           f"{len(conns) - len(errors)}/{n} sent in full"
                           + (f"; {errors[0]}" if errors else ""))
                for s in conns:
                    s.close()
                time.sleep(args.settle)
                check_alive(router)
                after = rss_mib(router)
                report.add(f"(b) RSS {args.settle:g} s after they closed"
                           + (f" (round {rnd + 1})" if args.partial_rounds > 1 else ""),
                           f"{after:.0f} MiB (+{after - before:.0f} over before)")
            honest.close()
            report.add("(b) RSS peak", f"{peak:.0f} MiB")


# --------------------------------------------------------------------------- (c) admin stall


def _make_groups(port: int, first: int, count: int, errors: list[str],
                 keep: list[socket.socket]) -> None:
    """One connection CONNECTing ``count`` groups ``g{first}..``, in pipelined batches."""
    try:
        s = native_client(port, timeout=120)
        dec = wire.Decoder()
        batch = 2000
        for start in range(first, first + count, batch):
            end = min(first + count, start + batch)
            s.sendall(b"".join(wire.encode(wire.Connect(i + 1, f"group-{i:07d}", b"a%d" % i,
                                                        None, ()))
                               for i in range(start, end)))
            want = end - start
            while want:
                f = dec.next_frame()
                if f is None:
                    data = s.recv(1 << 20)
                    if not data:
                        raise EOFError("router closed the connection")
                    dec.feed(data)
                    continue
                if isinstance(f, wire.Error):
                    raise RuntimeError(f"CONNECT refused: {f.code}: {f.message}")
                want -= 1
        keep.append(s)  # the groups live as long as the connection
    except (OSError, EOFError, RuntimeError) as e:
        errors.append(f"{type(e).__name__}: {e}")


def case_admin(args: argparse.Namespace, report: Report) -> None:
    print(f"(c) routing stall during GET /groups with {args.groups:,} groups", flush=True)
    mport = free_port()
    # The router-wide cap on groups (default 100,000) and the control budget (1,000 CONNECTs
    # a second, then ERROR rate_limited) would refuse the setup; what is measured is the
    # admin view, so both are lifted where the router has them.
    cap: tuple[str, ...] = ()
    for flag in ("--max-groups", "--control-rate"):
        if router_has_option(flag):
            cap += (flag, "0")
    with router_process("--log-level", "warning", "--metrics", f"127.0.0.1:{mport}",
                        "--groups-per-connection", "0", "--addresses-per-connection", "0",
                        "--idle-timeout", "0", *cap) as router:
        conns = args.group_conns
        per = args.groups // conns
        errors: list[str] = []
        keep: list[socket.socket] = []
        t = time.monotonic()
        threads = [threading.Thread(target=_make_groups,
                                    args=(router.port, i * per, per, errors, keep), daemon=True)
                   for i in range(conns)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(600)
        if errors:
            report.add("(c) creating groups failed", errors[0])
            for s in keep:
                s.close()
            return
        report.add("(c) groups created", f"{per * conns:,} in {time.monotonic() - t:.1f} s",
                   f"router RSS {rss_mib(router):.0f} MiB")
        pinger = Pinger(router.port).start()
        try:
            time.sleep(pause(args, 2.0))
            base0 = time.perf_counter()
            time.sleep(pause(args, 2.0))
            base1 = time.perf_counter()

            def get(path: str) -> tuple[bytes, str]:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{mport}{path}",
                                                timeout=120) as r:
                        return r.read(), str(r.status)
                except OSError as e:
                    return b"", f"{type(e).__name__}: {e}"

            def fetch(path: str) -> tuple[float, float, int, str]:
                f0 = time.perf_counter()
                body, status = get(path)
                return f0, time.perf_counter(), len(body), status

            def fetch_all_pages() -> tuple[float, float, int, str]:
                """Every page of /groups by its ``next`` cursor (bounded in count and time)."""
                f0 = time.perf_counter()
                path, total, pages, listed = "/groups", 0, 0, 0
                status = "no page"
                while pages < 10 * args.groups // 1000 + 10 and time.perf_counter() - f0 < 600:
                    body, status = get(path)
                    pages += 1
                    total += len(body)
                    try:
                        view = json.loads(body)
                    except ValueError:
                        break
                    listed += len(view.get("groups", ()))
                    cursor = view.get("next")
                    if not cursor:
                        break
                    path = "/groups?after=" + urllib.parse.quote(cursor, safe="")
                return (f0, time.perf_counter(), total,
                        f"{status}; {pages:,} pages, {listed:,} groups listed")

            results: list[tuple[str, tuple[float, float, int, str]]] = []
            cases: list[tuple[str, Callable[[], tuple[float, float, int, str]]]] = [
                ("/groups (first page)", functools.partial(fetch, "/groups")),
                ("/groups (every page)", fetch_all_pages),
                ("/metrics", functools.partial(fetch, "/metrics"))]
            for label, fn in cases:
                results.append((label, fn()))
                time.sleep(pause(args, 1.0))  # let the pinger see the end of any stall
                check_alive(router)
        finally:
            pinger.finish()
        base = pinger.rtts(base0, base1)
        report.add("(c) PING RTT before the fetch", rtt_summary(base))
        for path, (f0, f1, n, status) in results:
            during = pinger.rtts(f0, f1)
            stall = max(during) if during else float("nan")
            report.add(f"(c) stall during GET {path}", ms(stall),
                       f"fetch took {ms(f1 - f0)}, {n / MiB:.1f} MiB, status {status}; "
                       f"{len(during)} round trips overlapped")
        if pinger.error:
            report.add("(c) pinger error", pinger.error)
        for s in keep:
            s.close()


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rtt-seconds", type=float, default=5.0,
                    help="measured seconds per round-trip case (a); also bounds the pauses "
                         "between phases (1-2 s)")
    ap.add_argument("--flood-rate", type=float, default=1.0 * MiB,
                    help="paced flood bytes/s (a); an unpaced flood (as fast as the router "
                    "reads) is measured too; 0 = only that")
    ap.add_argument("--flood-burst", type=int, default=64 * 1024,
                    help="bytes per flood write (a): a client may write as much as it likes")
    ap.add_argument("--partial-conns", type=int, default=40, help="partial HELLOs (b)")
    ap.add_argument("--partial-size", type=int, default=8 * MiB,
                    help="HELLO length prefix, bytes (b); at most the router's max_frame")
    ap.add_argument("--partial-rounds", type=int, default=1, help="rounds of (b)")
    ap.add_argument("--settle", type=float, default=3.0,
                    help="seconds after the partial connections close before RSS is read (b)")
    ap.add_argument("--groups", type=int, default=200_000, help="groups for (c)")
    ap.add_argument("--group-conns", type=int, default=4, help="connections creating them (c)")
    ap.add_argument("--only", choices=("a", "b", "c"), action="append",
                    help="run only these cases (repeatable)")
    ap.add_argument("--router-tree", type=Path,
                    help="measure the router of this checkout (with its own .venv), e.g. a "
                    "commit before the fixes")
    args = ap.parse_args()
    global ROUTER_TREE
    ROUTER_TREE = args.router_tree.resolve() if args.router_tree else None
    cases: list[tuple[str, Callable[[argparse.Namespace, Report], None]]] = [
        ("a", case_floods), ("b", case_partial), ("c", case_admin)]
    report = Report()
    tree = ROUTER_TREE or REPO
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    print(f"gossiprouter bench-hostile: router of {tree} ({head or 'unknown commit'}), "
          f"{os.cpu_count()} cores, Python {sys.version.split()[0]}", flush=True)
    for key, fn in cases:
        if args.only and key not in args.only:
            continue
        try:
            fn(args, report)
        except RouterDied as e:
            report.add(f"({key}) ROUTER DIED", str(e))
    print()
    print("| measure | value | note |")
    print("|---|---|---|")
    for r in report.rows:
        print(f"| {r.measure} | {r.value} | {r.note} |")


if __name__ == "__main__":
    main()
