"""Micro-benchmark of the router's hot loop alone: NativeSession.on_data, no sockets.

Feeds 64 KiB chunks of ROUTE frames (unicast, and multicast to a group of 8)
into a session and reports ns per frame; the receivers' outboxes are drained
between chunks as a writer would. Use it to measure a change to the per-chunk
routing function in isolation (``--profile`` prints a cProfile summary).

Cases: ``unicast`` / ``fanout``, one header for every frame (one run per chunk);
``-mixed``, one header but 64 sizes (a run extended frame by frame); ``interleaved``,
unicast from 4 senders in turn, so every frame starts a new run (a header lookup each).
``--code DIR`` imports gossiprouter from another checkout (e.g. the commit before a
change), so that one script measures both sides of a comparison. ``--cpu`` measures the
process's CPU time instead of wall time: on a shared machine, other processes' load then
does not count (docs/performance.md, "Federation").
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

# This checkout's benchmarks package (--code only chooses where gossiprouter comes from).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.profiling import measured

CASES = [("unicast", 100), ("unicast", 1000), ("fanout", 100), ("fanout", 1000),
         ("unicast-mixed", 100), ("fanout-mixed", 100), ("interleaved", 100)]
SENDERS = 4  # the interleaved case
CPU = False  # --cpu: process CPU time instead of wall time


def setup(case: str, size: int) -> tuple[Any, list[Any], bytes, int]:
    """A sender session past HELLO, its receivers, one chunk of frames and their count."""
    # Imported here so that --code can choose which checkout is measured.
    wire = importlib.import_module("gossiprouter.protocol.native")
    config = importlib.import_module("gossiprouter.core.config")
    base = importlib.import_module("gossiprouter.sessions.base")
    native = importlib.import_module("gossiprouter.sessions.native")
    mixed = case.endswith("-mixed")
    unicast = not case.startswith("fanout")
    hub = base.Hub(config.Config(port=0))
    sender = native.NativeSession(hub, "sender")
    sender.on_data(wire.encode(wire.Hello((1,), "b")), 0.0)
    senders = [b"S%d" % i for i in range(SENDERS)] if case == "interleaved" else [b"S"]
    for s in senders:
        hub.table.connect(sender, "g", s)
    receivers = []
    for i in range(1 if unicast else 7):
        r = native.NativeSession(hub, f"r{i}")
        hub.table.connect(r, "g", b"R%d" % i)
        receivers.append(r)
    dest = b"R0" if unicast else None
    sizes = [size // 2 + (i * 37) % (size + 1) for i in range(64)] if mixed else [size]
    one = b"".join(wire.encode_route("g", dest, s, bytes(n)) for n in sizes for s in senders)
    reps = max(1, 65536 // len(one))
    sender.outbox.take()
    return sender, receivers, one * reps, reps * len(sizes) * len(senders)


def run(case: str, size: int, seconds: float) -> float:
    sender, receivers, chunk, n = setup(case, size)
    frames = 0
    clock = time.process_time if CPU else time.perf_counter
    t0 = clock()
    while clock() - t0 < seconds:
        for _ in range(20):
            sender.on_data(chunk, 0.0)
            for r in receivers:
                r.outbox.take()
        frames += 20 * n
    return (clock() - t0) / frames * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--code", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="the checkout whose gossiprouter is measured (default: this one)")
    ap.add_argument("--cases", nargs="+", metavar="CASE",
                    help="only these cases (e.g. unicast fanout-mixed interleaved)")
    ap.add_argument("--cpu", action="store_true", help="CPU time of this process, not wall time")
    args = ap.parse_args()
    global CPU
    CPU = args.cpu
    sys.path.insert(0, str(args.code.resolve()))
    print(f"code: {importlib.import_module('gossiprouter').__file__}")
    for case, size in CASES:
        if args.cases and case not in args.cases:
            continue
        ns = measured(partial(run, case, size, args.seconds), args.profile, 6)
        copies = 7 if case.startswith("fanout") else 1
        print(f"{case:13} {size:5d} B: {ns:7.0f} ns per received frame, "
              f"{ns / copies:6.0f} ns per delivered copy")


if __name__ == "__main__":
    main()
