"""Router throughput benchmark: msgs/s and router CPU per message (``scripts/bench``).

Starts a fresh router process per case and drives it with load-generator
processes speaking the native protocol over raw sockets (pre-encoded frame
batches, byte counting on the receive side), so the generators stay cheap.
Prints a table; ``--json FILE`` also writes the figures. A benchmark, not a
test: it asserts nothing about speed.

Router CPU per message is the router process's user+system CPU seconds
divided by the messages it delivered, so it does not depend on how fast the
load generator is.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gossiprouter.protocol import native as wire  # noqa: E402
from tests.procs import RouterProcess  # noqa: E402

WARMUP = 1.0


@dataclass
class Result:
    case: str
    payload: int
    delivered_per_s: float
    router_cpu_us_per_msg: float
    router_cpu_util: float


def _peer(port: int, group: str, addr: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(wire.PREAMBLE + wire.encode(wire.Hello((1,), "bench")))
    s.sendall(wire.encode(wire.Connect(1, group, addr, None, ())))
    dec = wire.Decoder()
    got = 0
    while got < 2:
        dec.feed(s.recv(65536))
        got += len(dec.frames())
    return s


def _batch(group: str, dest: bytes | None, addr: bytes, size: int, mixed: bool) -> bytes:
    """About 64 KiB of frames: all of ``size`` bytes, or (mixed) sizes spread over
    size/2 .. 3*size/2 so that no two neighbours are alike (the router's slow path)."""
    if not mixed:
        frame = wire.encode_route(group, dest, addr, bytes(size))
        return frame * max(1, 65536 // len(frame))
    sizes = [size // 2 + (i * 37) % (size + 1) for i in range(64)]
    one = b"".join(wire.encode_route(group, dest, addr, bytes(n)) for n in sizes)
    return one * max(1, 65536 // len(one))


def frame_len(group: str, dest: bytes | None, size: int, mixed: bool) -> float:
    """The mean frame length of what a sender sends."""
    if not mixed:
        return len(wire.encode_route(group, dest, b"S0", bytes(size)))
    sizes = [size // 2 + (i * 37) % (size + 1) for i in range(64)]
    return sum(len(wire.encode_route(group, dest, b"S0", bytes(n))) for n in sizes) / 64


def _member(port: int, group: str, addr: bytes, dest: bytes | None, size: int | None,
            mixed: bool, flen: float, start: float, t0: float, t1: float,
            ready: threading.Barrier, out: mp.Queue) -> None:  # type: ignore[type-arg]
    """One member: optionally sends as fast as it can; counts what it receives in [t0, t1]."""
    s = _peer(port, group, addr)
    s.settimeout(0.5)
    if size is not None:
        batch = _batch(group, dest, addr, size, mixed)

        def send() -> None:
            while time.time() < start:
                time.sleep(0.001)
            try:
                while time.time() < t1 + 0.2:
                    s.sendall(batch)
            except OSError:
                pass

        threading.Thread(target=send, daemon=True).start()
    ready.wait()
    window = 0
    while True:
        try:
            data = s.recv(1 << 20)
        except TimeoutError:
            if time.time() > t1:
                break
            continue
        if not data:
            break
        now = time.time()
        if t0 <= now <= t1:
            window += len(data)
        elif now > t1:
            break
    out.put(window / flen)
    s.close()


def run_case(case: str, size: int, seconds: float) -> Result:
    mixed = case.endswith("-mixed")
    ctx = mp.get_context("fork")
    with RouterProcess(None, "--log-level", "warning") as router:
        group = "bench"
        # (addr, dest, payload size or None for a pure receiver)
        members: list[tuple[bytes, bytes | None, int | None]]
        if case.startswith("unicast"):
            members = [(b"S%d" % i, b"R%d" % i, size) for i in range(4)]
            members += [(b"R%d" % i, None, None) for i in range(4)]
            flen = frame_len(group, b"R0", size, mixed)
        else:
            members = [(b"S0", None, size), (b"S1", None, size)]
            members += [(b"R%d" % i, None, None) for i in range(6)]
            flen = frame_len(group, None, size, mixed)
        start = time.time() + 2.0
        t0, t1 = start + WARMUP, start + WARMUP + seconds
        ready: threading.Barrier = ctx.Barrier(len(members) + 1)
        out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
        procs = [
            ctx.Process(target=_member, args=(router.port, group, a, d, sz, mixed, flen, start,
                                              t0, t1, ready, out))
            for a, d, sz in members
        ]
        for p in procs:
            p.start()
        ready.wait()
        while time.time() < t0:
            time.sleep(0.01)
        cpu0 = router.cpu_seconds()
        while time.time() < t1:
            time.sleep(0.01)
        cpu1 = router.cpu_seconds()
        delivered = sum(out.get(timeout=30) for _ in members)
        for p in procs:
            p.join(30)
        cpu = cpu1 - cpu0
        return Result(case, size, delivered / seconds, cpu / delivered * 1e6 if delivered else 0.0,
                      cpu / seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="measured seconds per case")
    ap.add_argument("--runs", type=int, default=1, help="runs per case (median reported)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    every = [("unicast", 100), ("unicast", 1000), ("fanout", 100), ("fanout", 1000),
             ("unicast-mixed", 100), ("fanout-mixed", 100)]
    ap.add_argument("--cases", nargs="+", metavar="CASE", choices=[f"{c}-{n}" for c, n in every],
                    help="only these cases, named CASE-PAYLOAD (e.g. unicast-100; default: all)")
    args = ap.parse_args()
    cases = [(c, n) for c, n in every if args.cases is None or f"{c}-{n}" in args.cases]
    results = []
    print(f"gossiprouter bench: {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"{args.seconds:g} s per case, {args.runs} run(s) each", flush=True)
    for case, size in cases:
        runs = [run_case(case, size, args.seconds) for _ in range(args.runs)]
        med = sorted(runs, key=lambda r: r.delivered_per_s)[len(runs) // 2]
        results.append(med)
        print(f"  {case:13} {size:5d} B: {med.delivered_per_s:12,.0f} deliveries/s, "
              f"{med.router_cpu_us_per_msg:6.2f} us router CPU/msg "
              f"(router CPU {med.router_cpu_util:.0%})"
              + (f"  [runs: {', '.join(f'{r.delivered_per_s:,.0f}' for r in runs)}]"
                 if len(runs) > 1 else ""), flush=True)
    print()
    print("| case | payload | deliveries/s | router CPU µs/msg | router CPU |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r.case} | {r.payload} B | {r.delivered_per_s:,.0f} | "
              f"{r.router_cpu_us_per_msg:.2f} | {r.router_cpu_util:.0%} |")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))


if __name__ == "__main__":
    main()
