"""Fairness benchmark: one client's PING round trip while another connection floods the router.

Starts a router process, then measures an honest native client's PING round trip (sequential
PINGs over one connection) first with the router otherwise idle, then while a flooder process
runs, in the same run. Floods (``--flood``, repeatable; default all):

* ``ping``: native PINGs at about 1 MB/s on one connection, the flooder reading its PONGs;
* ``heartbeat``: JGroups 5.x HEARTBEATs at about 1 MB/s (the router echoes each one);
* ``pipeline``: 100,000 cheap requests (GET_MEMBERS) written at once on one connection.
* ``relay``: 16 native members of one group multicast 100-byte ROUTE frames, 2,000 a second
  each (32,000 in, 480,000 deliveries a second; every member reads everything): with the
  compiled fast path the relay thread relays them, and the honest client's PONG waits for
  the thread's mutex (issue 24: its hold is bounded per connection, not per round of up to
  256 connections).

``--fast-path both`` runs every case twice in one run, with the router's ``--fast-path on``
and then ``off``.

Prints, per case, the honest client's RTT p50 / p99 / max in milliseconds, how many of its
PINGs were answered, and what became of the flooder (answers it got, closed or not, and the
ERROR it was closed with). ``--src DIR`` runs the router from another checkout (e.g. a
``git worktree`` of main) to measure the code before a change. A benchmark, not a test: it
asserts nothing about time.

    .venv/bin/python benchmarks/bench_fairness.py
    .venv/bin/python benchmarks/bench_fairness.py --src /tmp/base --flood ping
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.routers import free_port, native_client, serving  # noqa: E402
from gossiprouter.protocol import jgroups5 as j5  # noqa: E402
from gossiprouter.protocol import native as wire  # noqa: E402

FLOODS = ("ping", "heartbeat", "pipeline", "relay")
RELAY_MEMBERS = 16
RELAY_RATE = 2_000  # frames per second per member
RATE = 1_000_000  # flood bytes per second (ping, heartbeat)
PIPELINE = 100_000


def _read_all(s: socket.socket, stop: threading.Event, on_data: Callable[[bytes], None]
              ) -> str:
    """Read ``s`` until ``stop`` is set or the router closes it, each chunk to ``on_data``;
    how it was closed ("" if it was not)."""
    s.settimeout(0.2)
    while not stop.is_set():
        try:
            data = s.recv(1 << 20)
        except TimeoutError:
            continue
        except OSError as e:
            return f"reset ({e.strerror})"
        if not data:
            return "closed"
        on_data(data)
    return ""


def _relay_flood(port: int, seconds: float) -> tuple[int, str]:
    """RELAY_MEMBERS members multicast into one group for ``seconds``, each reading all it
    gets; (frames delivered, close reason)."""
    socks = [native_client(port) for _ in range(RELAY_MEMBERS)]
    for i, s in enumerate(socks):
        s.sendall(wire.encode(wire.Connect(1, "flood", b"f%d" % i, None, ())))
    frame = [wire.encode(wire.Route("flood", None, b"f%d" % i, b"x" * 100))
             for i in range(RELAY_MEMBERS)]
    got = [0] * RELAY_MEMBERS
    lost: list[str] = []  # members the router closed (a slow consumer, say), and how
    stop = threading.Event()

    def read(i: int) -> None:
        def count(data: bytes) -> None:
            got[i] += len(data)

        why = _read_all(socks[i], stop, count)
        if why:
            lost.append(why)

    def write(i: int) -> None:
        batch = frame[i] * 20
        period = 20 / RELAY_RATE
        t = time.monotonic()
        end = t + seconds
        try:
            while t < end:
                socks[i].sendall(batch)
                t += period
                time.sleep(max(0.0, t - time.monotonic()))
        except OSError:
            return  # closed by the router: its reader says how

    threads = [threading.Thread(target=f, args=(i,), daemon=True)
               for i in range(RELAY_MEMBERS) for f in (read, write)]
    for t in threads:
        t.start()
    for t in threads[1::2]:
        t.join()
    stop.set()
    for t in threads[0::2]:
        t.join(1.0)
    for s in socks:
        s.close()
    return sum(got) // len(frame[0]), (f"{len(lost)} of {RELAY_MEMBERS} members closed "
                                        f"({', '.join(sorted(set(lost)))})" if lost else "")


def _flooder(port: int, kind: str, seconds: float, out: mp.Queue[tuple[int, str]]) -> None:
    """Flood for ``seconds`` (or until the router closes us); report (answers, close reason)."""
    if kind == "relay":
        out.put(_relay_flood(port, seconds))
        return
    if kind == "heartbeat":
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        one = j5.heartbeat()
    else:
        s = native_client(port)
        one = (wire.encode(wire.Ping(7)) if kind == "ping"
               else wire.encode(wire.GetMembers(1, "no-such-group")))
    answers = 0
    closed = ""
    dec = wire.Decoder(max_frame=1 << 26)
    stop = threading.Event()

    def on_data(data: bytes) -> None:
        nonlocal answers, closed
        if kind == "heartbeat":
            answers += len(data) // len(one)
            return
        dec.feed(data)
        for f in dec.frames():
            if isinstance(f, wire.Error):
                closed = f"ERROR {f.code}"
            else:
                answers += 1

    def read() -> None:
        nonlocal closed
        why = _read_all(s, stop, on_data)
        closed = closed or why

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    end = time.monotonic() + seconds
    try:
        if kind == "pipeline":
            s.sendall(one * PIPELINE)
            while time.monotonic() < end and answers < PIPELINE and not closed:
                time.sleep(0.01)
        else:
            batch = one * max(1, 10_000 // len(one))  # ~10 KB, 100 batches per second
            period = len(batch) / RATE
            t = time.monotonic()
            while t < end and not closed:
                s.sendall(batch)
                t += period
                time.sleep(max(0.0, t - time.monotonic()))
    except OSError:
        reader.join(2.0)  # the router closed us: the reader sees why (an ERROR frame or not)
        closed = closed or "closed while sending"
    stop.set()
    reader.join(1.0)
    s.close()
    out.put((answers, closed))


def _rtts(s: socket.socket, seconds: float) -> list[float]:
    """Sequential PINGs for ``seconds``: round trips in seconds."""
    dec = wire.Decoder()
    out: list[float] = []
    end = time.monotonic() + seconds
    nonce = 0
    while time.monotonic() < end:
        nonce += 1
        t0 = time.perf_counter()
        s.sendall(wire.encode(wire.Ping(nonce)))
        while True:
            f = dec.next_frame()
            if f is not None:
                if isinstance(f, wire.Pong) and f.nonce == nonce:
                    break
                continue
            data = s.recv(65536)
            if not data:
                raise RuntimeError("router closed the honest client's connection")
            dec.feed(data)
        out.append(time.perf_counter() - t0)
        time.sleep(0.001)  # about 1000 samples per second at most, like a busy client
    return out


def _row(case: str, rtts: list[float], flood: str) -> str:
    ms = sorted(x * 1000 for x in rtts)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return (f"{case:<22} {statistics.median(ms):>8.2f} {p99:>8.2f} {ms[-1]:>9.2f} "
            f"{len(ms):>7}  {flood}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flood", action="append", choices=FLOODS,
                    help="flood kind (repeatable; default: all)")
    ap.add_argument("--seconds", type=float, default=4.0, help="measuring time per phase")
    ap.add_argument("--src", type=Path, default=REPO,
                    help="checkout to run the router from (default: this one)")
    ap.add_argument("--fast-path", choices=("on", "off", "both"), default=None,
                    help="the router's --fast-path (both: every case with on, then off)")
    ap.add_argument("router_args", nargs="*", help="extra `gossiprouter serve` options")
    a = ap.parse_args()
    modes = ["on", "off"] if a.fast_path == "both" else [a.fast_path]
    for mode in modes:
        _measure(a, [] if mode is None else ["--fast-path", mode])


def _measure(a: argparse.Namespace, extra: list[str]) -> None:
    port = free_port()
    with serving(a.src, port, *extra, *a.router_args) as proc:
        honest = native_client(port)
        print(f"router from {a.src} {' '.join(extra)}; honest client's PING round trip in ms")
        print(f"{'case':<22} {'p50':>8} {'p99':>8} {'max':>9} {'pings':>7}  flooder")
        print(_row("no flood", _rtts(honest, a.seconds), "-"))
        ctx = mp.get_context("spawn")
        for kind in a.flood or FLOODS:
            q: mp.Queue[tuple[int, str]] = ctx.Queue()
            p = ctx.Process(target=_flooder, args=(port, kind, a.seconds + 0.5, q))
            p.start()
            time.sleep(0.5)  # the flood is under way
            rtts = _rtts(honest, a.seconds)
            answers, closed = q.get(timeout=a.seconds + 30)
            p.join()
            print(_row(f"{kind} flood", rtts,
                       f"{answers} answers, {closed or 'still open'}"))
            time.sleep(0.5)
        if proc.poll() is not None:
            print(f"router exited with status {proc.returncode}")


if __name__ == "__main__":
    main()
