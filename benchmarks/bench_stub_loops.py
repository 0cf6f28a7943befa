"""The RouterStub on each event loop: trio, asyncio, uvloop (issue 23), and main's trio client.

One router (``python -m gossiprouter serve`` on 127.0.0.1, its own process) and, for each
loop, one client process: one stub with two channels A and B in one group, A sending
``--size``-byte messages (default 100) and B receiving them through the router, as

* ``unicast``: A sends to B's address;
* ``group``: A sends to the group (A and B; the router does not echo to A).

A window of ``--window`` messages may be in flight (A waits for B beyond it), so nothing is
dropped and the figure is the stub's steady rate, not a buffer's. After ``--warmup``
messages, ``--messages`` are timed: messages/s (wall clock) and the client process's CPU
(user + system) per message, which covers one send and one receive. The router's CPU is
not in it: the same router serves every run.

The client program is the same AnyIO code on every loop (the stub runs on whichever loop
runs it). ``--baseline REF`` adds the client of git ref REF (say ``main``: the trio-only
client before the port) run on trio from a ``git archive`` of it, so a cost of the port to
trio users shows in the same table. Each case runs ``--repeat`` times, loops interleaved,
and the table has the best run's figures (as timeit: on a shared machine the other tenants
only add time and CPU).

A benchmark, not a test: it prints one table and asserts nothing. Run:
``.venv/bin/python benchmarks/bench_stub_loops.py [--messages 20000 --baseline main]``;
``--messages 200 --warmup 50 --repeat 1`` is the smoke run CI makes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.procs import RouterProcess  # noqa: E402

CASES = ("unicast", "group")

# The client: run with ``python -c CLIENT LOOP CASE PORT SIZE WARMUP MESSAGES WINDOW``;
# prints one JSON line. Plain AnyIO, so one program drives the stub on every loop.
CLIENT = r'''
import json, resource, sys, time
import anyio
from gossiprouter import RouterStub

loop, case, port, size, warmup, messages, window = sys.argv[1:8]
port, size, warmup, messages, window = map(int, (port, size, warmup, messages, window))

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

async def main():
    async with RouterStub([("127.0.0.1", port)], receive_buffer=window * 2) as stub:
        a = await stub.connect("bench", b"A")
        b = await stub.connect("bench", b"B")
        dest = b"B" if case == "unicast" else None
        payload = b"x" * size
        state = {"received": 0}
        more = anyio.Event()

        async def receive(n):
            for _ in range(n):
                await b.receive()
                state["received"] += 1
                if state["received"] % (window // 4 or 1) == 0:
                    more.set()

        async def run(n):
            nonlocal more
            state["received"] = 0
            async with anyio.create_task_group() as tg:
                tg.start_soon(receive, n)
                for sent in range(n):
                    while sent - state["received"] >= window:
                        more = anyio.Event()
                        await more.wait()
                    await a.send(payload, dest=dest)

        with anyio.fail_after(300):
            await run(warmup)
            c0, t0 = cpu(), time.perf_counter()
            await run(messages)
            c1, t1 = cpu(), time.perf_counter()
    print(json.dumps({"seconds": t1 - t0, "cpu": c1 - c0}))

if loop == "uvloop":
    anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True})
else:
    anyio.run(main, backend=loop)
'''


def baseline_tree(ref: str, into: Path) -> Path:
    """The ``gossiprouter`` package of git ref ``ref``, unpacked under ``into``."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "gossiprouter"],
                             check=True, capture_output=True).stdout
    tar = into / "baseline.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as t:
        t.extractall(into, filter="data")
    return into


def run_client(loop: str, case: str, port: int, args: argparse.Namespace,
               pythonpath: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    out = subprocess.run(
        [sys.executable, "-c", CLIENT, loop, case, str(port), str(args.size),
         str(args.warmup), str(args.messages), str(args.window)],
        env=env, capture_output=True, text=True, timeout=600, cwd=pythonpath)
    if out.returncode != 0:
        raise RuntimeError(f"{loop} {case}: client failed:\n{out.stderr}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def loops_available() -> list[str]:
    loops = ["trio", "asyncio"]
    try:
        import uvloop  # noqa: F401
        loops.append("uvloop")
    except ImportError:
        pass
    return loops


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    # (label, loop, pythonpath): this checkout's client on every loop, the baseline on trio.
    with tempfile.TemporaryDirectory() as tmp:
        clients: list[tuple[str, str, Path]] = [(lp, lp, REPO) for lp in loops_available()]
        if args.baseline:
            clients.insert(0, (f"trio ({args.baseline}'s client)", "trio",
                               baseline_tree(args.baseline, Path(tmp))))
        runs: dict[tuple[str, str], list[dict[str, float]]] = {}
        with RouterProcess() as router:
            for _ in range(args.repeat):
                for case in CASES:
                    for label, loop, path in clients:
                        r = run_client(loop, case, router.port, args, path)
                        runs.setdefault((label, case), []).append(r)
    rows = []
    for (label, case), rs in runs.items():
        # Best of the runs, as timeit does: other tenants of the machine only add time and
        # CPU (cache misses, switches), so the least disturbed run is the stub's own cost.
        secs = min(r["seconds"] for r in rs)
        cpu = min(r["cpu"] for r in rs)
        rows.append({"client": label, "case": case, "msgs_per_s": args.messages / secs,
                     "cpu_us_per_msg": cpu / args.messages * 1e6})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    ref = {r["case"]: r for r in rows if r["client"] == "trio"}
    lines = ["| case | loop (client) | messages/s | CPU µs/message | CPU vs trio |",
             "|---|---|---:|---:|---:|"]
    for case in CASES:
        for r in (r for r in rows if r["case"] == case):
            vs = r["cpu_us_per_msg"] / ref[case]["cpu_us_per_msg"]
            lines.append(f"| {case} | {r['client']} | {r['msgs_per_s']:,.0f} | "
                         f"{r['cpu_us_per_msg']:.1f} | {vs:.2f}x |")
    return "\n".join(lines)


# The sizes a run takes (each at least 1): option -> (default, help).
SIZES = {
    "messages": (20000, "timed messages per run"),
    "warmup": (2000, "untimed messages first"),
    "size": (100, "payload bytes"),
    "window": (256, "messages in flight at most"),
    "repeat": (5, "runs per case (the best is kept)"),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, (default, text) in SIZES.items():
        p.add_argument(f"--{name}", type=int, default=default, help=text)
    p.add_argument("--baseline", metavar="REF", help="also run git REF's client on trio")
    args = p.parse_args()
    for name in SIZES:
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    rows = measure(args)
    print(f"{args.messages} messages of {args.size} B, window {args.window}, best of "
          f"{args.repeat} runs")
    print(table(rows))


if __name__ == "__main__":
    main()
