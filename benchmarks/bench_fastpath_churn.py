"""Connection churn while the compiled fast path routes (issue 24, docs/performance.md).

Four native senders multicast into group ``g`` (four receivers) while one client opens a
connection, registers in a group of its own, and drops it, again and again. Every churn cycle
changes the routing table; the question is how much of ``g``'s traffic that pushes back to
Python. It prints, per churn rate: the share of ``g``'s frames the relay thread relayed,
the upcalls to Python per 1,000 frames (the churning client's own included), the thread's
invalidations, and the wall time. Churn cycles are spread over the run by progress; those not
done when the last frame arrives are left out (``cycles done``).

``--tree DIR`` (repeatable) runs the same load against another checkout's gossiprouter (its
``server/_relay*.so`` built), one column each: before/after in one run. Each case runs in
its own process. A benchmark, not a test: it prints figures and asserts nothing about speed;
``--frames`` and ``--cycles`` bound the work, not the time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def worker(frames: int, cycles: int, same_group: bool) -> dict[str, float]:
    """One case, in this process (the gossiprouter on sys.path)."""
    import trio

    from gossiprouter.core.config import Config
    from gossiprouter.ops.runtime import Operations
    from gossiprouter.protocol import native as wire
    from gossiprouter.server.listener import Server

    senders, receivers, batch = 4, 4, 8
    per_sender = frames // senders // batch * batch
    total = per_sender * senders

    async def client(addr: tuple[str, int]) -> trio.SocketStream:
        s = await trio.open_tcp_stream(*addr)
        await s.send_all(wire.PREAMBLE + wire.encode(wire.Hello((1,), "bench", None)))
        await reply(s, wire.Welcome)
        return s

    async def reply(s: trio.SocketStream, kind: type) -> None:
        dec = wire.Decoder(max_frame=1 << 20)
        while True:
            f = dec.next_frame()
            if f is not None:
                if isinstance(f, kind):
                    return
                continue
            data = await s.receive_some(65536)
            if not data:
                raise EOFError("router closed a benchmark connection")
            dec.feed(data)

    async def main() -> dict[str, float]:
        cfg = Config(host="127.0.0.1", port=0, fast_path="on", idle_timeout=0)
        server = Server(cfg, hooks=Operations(cfg))
        got = [0] * receivers
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            addr = server.address
            assert addr is not None and server.fast is not None
            ss = [await client(addr) for _ in range(senders)]
            rs = [await client(addr) for _ in range(receivers)]
            for i, s in enumerate(ss + rs):
                await s.send_all(wire.encode(wire.Connect(1, "g", b"m%d" % i, None, ())))
                await reply(s, wire.Ok)
            frame = {s: wire.encode(wire.Route("g", None, b"m%d" % i, b"p" * 100))
                     for i, s in enumerate(ss)}
            flen = len(next(iter(frame.values())))
            done = trio.Event()

            async def drain(k: int, s: trio.SocketStream) -> None:
                n = 0
                while n < total * flen:
                    n += len(await s.receive_some(1 << 20))
                    got[k] = n // flen
                if all(g >= total for g in got):
                    done.set()

            async def discard(s: trio.SocketStream) -> None:
                # Senders get the others' multicasts: a sender that stopped reading would be
                # evicted, and everything to it would go through Python for that reason.
                while await s.receive_some(1 << 20):
                    pass

            async def send(s: trio.SocketStream) -> None:
                for _ in range(per_sender // batch):
                    await s.send_all(frame[s] * batch)
                    await trio.sleep(0)

            cycled = 0

            async def churn() -> None:
                nonlocal cycled
                for c in range(cycles):
                    while min(got) < total * c // cycles:
                        await trio.sleep(0.0005)
                    s = await client(addr)
                    group = "g" if same_group else "churn"
                    await s.send_all(wire.encode(wire.Connect(1, group, b"c%d" % c, None, ())))
                    await reply(s, wire.Ok)
                    await trio.aclose_forcefully(s)
                    cycled += 1

            server.hub.sync()
            c0 = server.hub.counters
            routed0, relayed0 = c0.routed, c0.fast_relayed
            up0, inv0 = server.fast.upcalls, server.fast.info()["invalidations"]
            t0 = time.perf_counter()
            for k, s in enumerate(rs):
                nursery.start_soon(drain, k, s)
            nursery.start_soon(churn)
            for s in ss:
                nursery.start_soon(discard, s)
                nursery.start_soon(send, s)
            await done.wait()
            wall = time.perf_counter() - t0
            server.hub.sync()
            c = server.hub.counters
            routed = c.routed - routed0
            out = {
                "frames": float(total),
                "cycles": float(cycled),
                "relayed_pct": 100.0 * (c.fast_relayed - relayed0) / max(routed, 1),
                "upcalls_per_1000": 1000.0 * (server.fast.upcalls - up0) / total,
                "invalidations": float(server.fast.info()["invalidations"] - inv0),
                "wall_s": wall,
            }
            nursery.cancel_scope.cancel()
        return out

    return trio.run(main)


def run_case(tree: Path, frames: int, cycles: int, same_group: bool) -> dict[str, float]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(tree),
           "--frames", str(frames), "--cycles", str(cycles)]
    if same_group:
        cmd.append("--same-group")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=40_000, help="multicasts in all")
    ap.add_argument("--cycles", type=int, nargs="+", default=[0, 20, 100, 400],
                    help="churn cycles over the run (one table row each)")
    ap.add_argument("--tree", type=Path, action="append", default=None,
                    help="a checkout to compare (default: this one)")
    ap.add_argument("--same-group", action="store_true",
                    help="the churning client registers in g itself (every cycle changes g)")
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is not None:
        sys.path.insert(0, str(args.worker.resolve()))
        print(json.dumps(worker(args.frames, args.cycles[0], args.same_group)))
        return 0
    trees: list[Path] = args.tree or [ROOT]
    rows: list[list[Any]] = []
    for cycles in args.cycles:
        row: list[Any] = [cycles]
        for tree in trees:
            r = run_case(tree, args.frames, cycles, args.same_group)
            row += [f"{r['cycles']:.0f}", f"{r['relayed_pct']:.1f}",
                    f"{r['upcalls_per_1000']:.1f}",
                    f"{r['invalidations']:.0f}", f"{r['wall_s']:.2f}"]
        rows.append(row)
    head = ["churn cycles asked"]
    for tree in trees:
        name = tree.resolve().name
        head += [f"{name}: cycles done", "relayed %", "upcalls/1000", "invalidations",
                 "wall s"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
