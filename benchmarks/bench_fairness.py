"""Fairness benchmark: one client's PING round trip while another connection floods the router.

Starts a router process, then measures an honest native client's PING round trip (sequential
PINGs over one connection) first with the router otherwise idle, then while a flooder process
runs, in the same run. Floods (``--flood``, repeatable; default all):

* ``ping``: native PINGs at about 1 MB/s on one connection, the flooder reading its PONGs;
* ``heartbeat``: JGroups 5.x HEARTBEATs at about 1 MB/s (the router echoes each one);
* ``pipeline``: 100,000 cheap requests (GET_MEMBERS) written at once on one connection.

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
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gossiprouter.protocol import jgroups5 as j5  # noqa: E402
from gossiprouter.protocol import native as wire  # noqa: E402
from tests.procs import free_port, wait_listening  # noqa: E402

FLOODS = ("ping", "heartbeat", "pipeline")
RATE = 1_000_000  # flood bytes per second (ping, heartbeat)
PIPELINE = 100_000


def _native(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(wire.PREAMBLE + wire.encode(wire.Hello((1,), "bench")))
    dec = wire.Decoder()
    while not dec.frames():
        data = s.recv(65536)
        if not data:
            raise RuntimeError("router closed the connection before WELCOME")
        dec.feed(data)
    return s


def _flooder(port: int, kind: str, seconds: float, out: mp.Queue[tuple[int, str]]) -> None:
    """Flood for ``seconds`` (or until the router closes us); report (answers, close reason)."""
    if kind == "heartbeat":
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        one = j5.heartbeat()
    else:
        s = _native(port)
        one = (wire.encode(wire.Ping(7)) if kind == "ping"
               else wire.encode(wire.GetMembers(1, "no-such-group")))
    answers = 0
    closed = ""
    dec = wire.Decoder(max_frame=1 << 26)
    stop = threading.Event()

    def read() -> None:
        nonlocal answers, closed
        s.settimeout(0.2)
        while not stop.is_set():
            try:
                data = s.recv(1 << 20)
            except TimeoutError:
                continue
            except OSError as e:
                closed = closed or f"reset ({e.strerror})"
                return
            if not data:
                closed = closed or "closed"
                return
            if kind == "heartbeat":
                answers += len(data) // len(one)
                continue
            dec.feed(data)
            for f in dec.frames():
                if isinstance(f, wire.Error):
                    closed = f"ERROR {f.code}"
                else:
                    answers += 1

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
    ap.add_argument("router_args", nargs="*", help="extra `gossiprouter serve` options")
    a = ap.parse_args()
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(a.src))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gossiprouter", "serve", "--host", "127.0.0.1", "--port",
         str(port), "--log-level", "warning", *a.router_args],
        cwd=a.src, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, proc)
        honest = _native(port)
        print(f"router from {a.src}; honest client's PING round trip in ms")
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
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
