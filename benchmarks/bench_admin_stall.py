"""How long the admin endpoint holds routing: PING round trips while /groups or /metrics runs.

Starts a router with its metrics/admin port, fills it with ``--groups`` groups (one connection
WATCHing them all), then, per case, runs a loop of sequential PINGs on another connection while
a thread fetches an admin URL; prints the fetch's duration and size and the longest PING round
trip while it ran (the routing stall), next to the same loop with no fetch. Cases:

* ``/groups``: one GET (all groups before paging; the first page after);
* ``/groups (every page)``: every page, following ``next`` (only where the router pages);
* ``/metrics``.

``--src DIR`` runs the router from another checkout (e.g. a ``git worktree`` of main) to
measure the code before a change. A benchmark, not a test: it asserts nothing about time.

    .venv/bin/python benchmarks/bench_admin_stall.py --groups 200000
    .venv/bin/python benchmarks/bench_admin_stall.py --groups 200000 --src /tmp/base
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.routers import free_port, native_client, serving  # noqa: E402
from gossiprouter.protocol import native as wire  # noqa: E402


def _fill(port: int, n: int) -> socket.socket:
    """One connection watching n groups; returns it (kept open)."""
    s = native_client(port)
    got = 0
    dec = wire.Decoder()

    def read() -> None:
        nonlocal got
        while got < n:
            data = s.recv(1 << 20)
            if not data:
                raise RuntimeError("router closed the filling connection")
            dec.feed(data)
            for f in dec.frames():
                if not isinstance(f, wire.Ok):
                    raise RuntimeError(f"WATCH refused: {f}")
                got += 1

    t = threading.Thread(target=read)
    t.start()
    for i in range(0, n, 10_000):
        s.sendall(b"".join(wire.encode(wire.Watch(j + 1, f"group-{j:07d}"))
                           for j in range(i, min(n, i + 10_000))))
    t.join()
    return s


def _ping_loop(s: socket.socket, stop: threading.Event) -> list[float]:
    dec = wire.Decoder()
    out: list[float] = []
    nonce = 0
    while not stop.is_set() or not out:
        nonce += 1
        t0 = time.perf_counter()
        s.sendall(wire.encode(wire.Ping(nonce)))
        while True:
            f = dec.next_frame()
            if isinstance(f, wire.Pong) and f.nonce == nonce:
                break
            if f is None:
                dec.feed(s.recv(65536))
        out.append(time.perf_counter() - t0)
        time.sleep(0.0005)
    return out


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as r:
        data: bytes = r.read()
        return data


def _all_pages(base: str) -> bytes:
    total = b""
    after = None
    while True:
        body = _get(base + "/groups" + ("" if after is None else "?after=" + quote(after)))
        total += body
        after = json.loads(body).get("next")
        if after is None:
            return total


def _case(s: socket.socket, fetch: object) -> tuple[float, int, list[float]]:
    stop = threading.Event()
    result: list[object] = []

    def run() -> None:
        t0 = time.perf_counter()
        if callable(fetch):
            result.append(fetch())
        else:
            time.sleep(1.0)
            result.append(b"")
        result.append(time.perf_counter() - t0)
        stop.set()

    t = threading.Thread(target=run)
    t.start()
    rtts = _ping_loop(s, stop)
    t.join()
    body = result[0]
    assert isinstance(body, bytes)
    took = result[1]
    assert isinstance(took, float)
    return took, len(body), rtts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=200_000)
    ap.add_argument("--src", type=Path, default=REPO,
                    help="checkout to run the router from (default: this one)")
    a = ap.parse_args()
    port, mport = free_port(), free_port()
    extra: list[str] = []
    config = next(p for p in (a.src / "gossiprouter" / "core" / "config.py",
                              a.src / "gossiprouter" / "config.py") if p.exists())
    if "watches_per_connection" in config.read_text():
        # This router bounds WATCH, groups and control frames: lift the bounds to fill it.
        extra = ["--watches-per-connection", "0", "--max-groups", "0", "--control-rate", "0"]
    with serving(a.src, port, "--metrics", f"127.0.0.1:{mport}", *extra):
        t0 = time.perf_counter()
        keep = _fill(port, a.groups)
        print(f"router from {a.src}: {a.groups} groups (filled in "
              f"{time.perf_counter() - t0:.1f}s)")
        base = f"http://127.0.0.1:{mport}"
        honest = native_client(port)
        paged = "next" in json.loads(_get(base + "/groups?limit=1"))
        cases: list[tuple[str, object]] = [("no fetch (1 s)", None),
                                           ("/groups", lambda: _get(base + "/groups"))]
        if paged:
            cases.append(("/groups (every page)", lambda: _all_pages(base)))
        cases.append(("/metrics", lambda: _get(base + "/metrics")))
        print(f"{'case':<22} {'fetch s':>8} {'bytes':>11} {'RTT p50 ms':>11} "
              f"{'p99 ms':>8} {'max ms':>9}")
        for name, fetch in cases:
            took, size, rtts = _case(honest, fetch)
            ms = sorted(x * 1000 for x in rtts)
            print(f"{name:<22} {took:>8.2f} {size:>11} {ms[len(ms) // 2]:>11.2f} "
                  f"{ms[min(len(ms) - 1, int(len(ms) * 0.99))]:>8.2f} {ms[-1]:>9.2f}")
        keep.close()


if __name__ == "__main__":
    main()
