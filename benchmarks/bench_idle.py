"""What a router costs doing nothing (issue 30's light-load floor, session 29).

On 127.0.0.1: a mosquitto, ``--routers`` routers federated through it and one router
without a bridge, no clients. Over ``--seconds`` it reads, for each process, its CPU time
(``/proc/PID/task/*/schedstat``: nanoseconds, not ticks) and its main thread's voluntary
context switches (a router's Python thread: each one a wake-up after a sleep). It prints
per router kind the CPU in ms per second, the Python thread's wake-ups per second and the CPU
per wake-up; mosquitto's line beside them.

``--code DIR`` runs another checkout's routers (its own .venv, as bench_federation.py's
``--code``) in the same sitting, the two taking turns for ``--rounds`` rounds: a before and
after of the same machine state. On a virtual machine a wake-up after a long sleep is dear
and varies with the host's load: compare the rows of one run, not of two.

    python benchmarks/bench_idle.py                                 # 20 s, this tree
    python benchmarks/bench_idle.py --code /tmp/before --rounds 2   # before / after
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_federation import ROUTER_ARGS, CodeRouter
from tests.procs import BrokerProcess

PLAIN, FEDERATED, BROKER = "router, no bridge", "federated router", "mosquitto"


def sample(pid: int) -> tuple[int, int]:
    """(CPU ns of every thread of ``pid``, voluntary switches of its main thread)."""
    ns = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns += int(f.read().split()[0])
        except OSError:
            continue  # a thread that ended meanwhile
    with open(f"/proc/{pid}/status") as f:
        wakes = next(int(line.split()[1]) for line in f
                     if line.startswith("voluntary_ctxt_switches"))
    return ns, wakes


def measure(code: Path | None, routers: int, seconds: float, settle: float
            ) -> dict[str, list[tuple[float, float]]]:
    """One round: role -> [(CPU ms per second, main-thread wake-ups per second)]."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-idle-"))
    broker = BrokerProcess(tmp)
    CodeRouter.code = code
    plain = CodeRouter(None, *ROUTER_ARGS)
    fed = [CodeRouter(None, *ROUTER_ARGS, "--bridge", broker.url, "--router-id", f"i{i}")
           for i in range(routers)]
    try:
        broker.start()
        for r in (plain, *fed):
            r.start()
        time.sleep(settle)  # connected, synced, the first heartbeats exchanged
        roles = [(PLAIN, plain.pid), *((FEDERATED, r.pid) for r in fed), (BROKER, broker.pid)]
        before = [sample(pid) for _, pid in roles]
        t0 = time.monotonic()
        time.sleep(seconds)
        after = [sample(pid) for _, pid in roles]
        took = time.monotonic() - t0
    finally:
        for r in (plain, *fed):
            r.stop()
        broker.stop()
    out: dict[str, list[tuple[float, float]]] = {}
    for (role, _), (ns0, w0), (ns1, w1) in zip(roles, before, after, strict=True):
        out.setdefault(role, []).append(((ns1 - ns0) / 1e6 / took, (w1 - w0) / took))
    return out


def table(results: dict[str, dict[str, list[tuple[float, float]]]],
          out: Callable[[str], None] = print) -> None:
    out(f"{'tree':<14} {'process':<20} {'CPU ms/s':>9} {'wake-ups/s':>11} {'ms/wake-up':>11}")
    for tree, roles in results.items():
        for role, xs in roles.items():
            cpu = statistics.median(x[0] for x in xs)
            wakes = statistics.median(x[1] for x in xs)
            per = f"{cpu / wakes:>11.2f}" if wakes and role != BROKER else f"{'-':>11}"
            out(f"{tree:<14} {role:<20} {cpu:>9.2f} {wakes:>11.2f} {per}")
    out("(medians over the rounds and the routers of a kind; wake-ups: the main thread's "
        "voluntary context switches; mosquitto's counted over its one thread)")


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0,
                    help="how long each round measures (default 20)")
    ap.add_argument("--routers", type=int, default=3,
                    help="federated routers (default 3), beside one without a bridge")
    ap.add_argument("--rounds", type=int, default=1, help="rounds per tree (default 1)")
    ap.add_argument("--settle", type=float, default=3.0,
                    help="seconds between the start and the measure (default 3)")
    ap.add_argument("--code", type=Path, default=None,
                    help="another checkout (with its .venv): its routers too, taking turns")
    args = ap.parse_args(argv)
    if args.seconds <= 0 or args.routers < 1 or args.rounds < 1:
        ap.error("--seconds must be > 0, --routers and --rounds >= 1")
    if args.code is not None and not (args.code / ".venv" / "bin" / "python").exists():
        ap.error(f"--code {args.code}: no .venv/bin/python there")
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    if args.code is not None:
        trees.append((args.code.name or str(args.code), args.code))
    results: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for n in range(args.rounds):
        for name, code in trees:
            print(f"round {n + 1}/{args.rounds}, {name}: measuring {args.seconds:g} s",
                  flush=True)
            for role, xs in measure(code, args.routers, args.seconds, args.settle).items():
                results.setdefault(name, {}).setdefault(role, []).extend(xs)
    table(results)


if __name__ == "__main__":
    main()
