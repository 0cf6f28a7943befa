"""Micro-benchmark of the router's hot loop alone: NativeSession.on_data, no sockets.

Feeds 64 KiB chunks of ROUTE frames (unicast, and multicast to a group of 8)
into a session and reports ns per frame; the receivers' outboxes are drained
between chunks as a writer would. Use it to measure a change to the per-chunk
routing function in isolation (``--profile`` prints a cProfile summary).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gossiprouter.config import Config
from gossiprouter.protocol import native as wire
from gossiprouter.sessions.base import Hub
from gossiprouter.sessions.native import NativeSession


def setup(case: str, size: int) -> tuple[NativeSession, list[NativeSession], bytes, int]:
    mixed = case.endswith("-mixed")
    hub = Hub(Config(port=0))
    sender = NativeSession(hub, "sender")
    sender.on_data(wire.encode(wire.Hello((1,), "b")), 0.0)
    hub.table.connect(sender, "g", b"S")
    receivers = []
    for i in range(1 if case.startswith("unicast") else 7):
        r = NativeSession(hub, f"r{i}")
        hub.table.connect(r, "g", b"R%d" % i)
        receivers.append(r)
    dest = b"R0" if case.startswith("unicast") else None
    sizes = [size // 2 + (i * 37) % (size + 1) for i in range(64)] if mixed else [size]
    one = b"".join(wire.encode_route("g", dest, b"S", bytes(n)) for n in sizes)
    reps = max(1, 65536 // len(one))
    sender.outbox.take()
    return sender, receivers, one * reps, reps * len(sizes)


def run(case: str, size: int, seconds: float) -> float:
    sender, receivers, chunk, n = setup(case, size)
    frames = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            sender.on_data(chunk, 0.0)
            for r in receivers:
                r.outbox.take()
        frames += 20 * n
    return (time.perf_counter() - t0) / frames * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    for case, size in [("unicast", 100), ("unicast", 1000), ("fanout", 100), ("fanout", 1000),
                       ("unicast-mixed", 100), ("fanout-mixed", 100)]:
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            ns = run(case, size, args.seconds)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(6)
        else:
            ns = run(case, size, args.seconds)
        copies = 1 if case.startswith("unicast") else 7
        print(f"{case:13} {size:5d} B: {ns:7.0f} ns per received frame, "
              f"{ns / copies:6.0f} ns per delivered copy")


if __name__ == "__main__":
    main()
