"""Membership traffic of a federation (issue 30, acceptance 2): a rolling start of N members
over 3 routers, each joining its router at a fixed pace, through one mosquitto on 127.0.0.1.

Prints, per N: the bytes the routers published on the membership topics (counted by a
subscriber on ``%fed/#``: each message reaches the broker once), the bytes the broker wrote
(``wchar`` of its process, the subscriber's own copy taken off), the routers' CPU, and the
convergence (from the last join acknowledged until every router lists all N); beside them
the one-message-per-join bound: every join one message of its topic and its member entry,
sent once to the broker and by it to the 2 other routers.

    .venv/bin/python -m benchmarks.bench_federation_membership [--members 1000 5000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gossiprouter.federation.codec import pack_member
from gossiprouter.protocol import native as wire
from tests.nclient import NativeClient
from tests.procs import BrokerProcess, RouterProcess, proc_cpu_seconds

GROUP = "bench-members"
PHYS = (("10.0.0.1", 7800),)
ROUTERS = 3


def _addr(r: int, i: int) -> bytes:
    return b"r%d-%012d" % (r, i)  # 16 bytes, like a JGroups UUID


class Tap:
    """A subscriber on %fed/# counting the membership messages' topic and payload bytes."""

    def __init__(self, port: int) -> None:
        from paho.mqtt.client import Client, MQTTv5
        from paho.mqtt.enums import CallbackAPIVersion

        self.bytes = 0
        self.messages = 0
        self._lock = threading.Lock()
        self.client = Client(CallbackAPIVersion.VERSION2, protocol=MQTTv5)
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.subscribe("%fed/#", qos=0)
        self.client.loop_start()

    def _on_message(self, client: object, userdata: object, msg: object) -> None:
        topic: str = getattr(msg, "topic", "")
        payload: bytes = getattr(msg, "payload", b"")
        if "/members/" in topic:
            with self._lock:
                self.bytes += len(topic.encode()) + len(payload)
                self.messages += 1

    def stop(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def _wchar(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    return 0


async def rolling_start(ports: Sequence[int], members: int, rate: float,
                        wait: float) -> tuple[float, bool]:
    """Every router gets members / 3 joins at ``rate`` per second; (convergence seconds,
    converged)."""
    per = members // len(ports)
    total = per * len(ports)
    # A connection may register a bounded number of addresses: 500 each.
    joiners = [[await NativeClient.open("127.0.0.1", p) for _ in range(0, per, 500)]
               for p in ports]
    lookers = [await NativeClient.open("127.0.0.1", p) for p in ports]

    async def join(r: int) -> None:
        start = trio.current_time()
        for i in range(per):
            await trio.sleep_until(start + i / rate)
            ok = await joiners[r][i // 500].connect(GROUP, _addr(r, i), f"member-{r}-{i}",
                                                    PHYS)
            if not isinstance(ok, wire.Ok):
                raise SystemExit(f"join refused: {ok}")

    async with trio.open_nursery() as n:
        for r in range(len(ports)):
            n.start_soon(join, r)
    t0 = time.perf_counter()
    done = False
    counts: list[int] = []
    with trio.move_on_after(wait):
        while not done:
            counts = [len(await c.member_addrs(GROUP)) for c in lookers]
            done = all(x == total for x in counts)
            if not done:
                await trio.sleep(0.05)
    took = time.perf_counter() - t0
    if not done:
        print(f"  not converged: the routers list {counts} of {total}")
    for c in (*(c for cs in joiners for c in cs), *lookers):
        await c.aclose()
    return took, done


def bound(members: int, prefix: str = "gossiprouter") -> tuple[int, int]:
    """(published, broker out) bytes if every join were one message of one member entry."""
    per = members // ROUTERS
    size = 0
    for r in range(ROUTERS):
        topic = f"%fed/{prefix}/r{r}/members/{GROUP}"
        entry = pack_member([_addr(r, 0), f"member-{r}-{per}", [list(p) for p in PHYS], 1,
                             None, True, None])
        size += per * (len(topic) + len(entry))
    return size, size * (ROUTERS - 1)


def measure(members: int, rate: float, wait: float) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-fed-members-"))
    broker = BrokerProcess(tmp).start()
    routers = [RouterProcess(None, "--bridge", broker.url, "--router-id", f"r{i}",
                             "--bridge-reconnect-max", "0.5") for i in range(ROUTERS)]
    tap = None
    try:
        for r in routers:
            r.start()
        time.sleep(1.0)  # the bridges connect and resync
        tap = Tap(broker.port)
        time.sleep(0.3)
        cpu0 = [proc_cpu_seconds(r.pid) for r in routers]
        w0, tap0 = _wchar(broker.pid), tap.bytes
        took, ok = trio.run(rolling_start, [r.port for r in routers], members, rate, wait)
        time.sleep(0.5)  # the last records reach the tap
        cpu = sum(proc_cpu_seconds(r.pid) - c for r, c in zip(routers, cpu0, strict=True))
        published = tap.bytes - tap0
        out = _wchar(broker.pid) - w0 - published  # the tap's own copy taken off
        return {"published": published, "out": out, "cpu": cpu, "conv": took,
                "ok": float(ok), "messages": tap.messages}
    finally:
        if tap is not None:
            tap.stop()
        for r in routers:
            r.stop()
        broker.stop()


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--members", type=int, nargs="+", default=[1000, 5000])
    p.add_argument("--rate", type=float, default=50.0, help="joins per second per router")
    p.add_argument("--wait", type=float, default=30.0, help="seconds to converge at most")
    a = p.parse_args(argv)
    print(f"rolling start over {ROUTERS} routers, {a.rate:g} joins/s per router")
    head = (f"{'members':>8} {'published':>12} {'bound':>10} {'ratio':>6} "
            f"{'broker out':>12} {'bound':>10} {'ratio':>6} {'router CPU':>11} "
            f"{'converged':>10}")
    print(head)
    for n in a.members:
        m = measure(n, a.rate, a.wait)
        pub_b, out_b = bound(n)
        conv = f"{m['conv']:.2f} s" if m["ok"] else "no"
        print(f"{n:>8,} {m['published']:>12,.0f} {pub_b:>10,} {m['published'] / pub_b:>5.2f}x "
              f"{m['out']:>12,.0f} {out_b:>10,} {m['out'] / out_b:>5.2f}x "
              f"{m['cpu']:>9.2f} s {conv:>10}")


if __name__ == "__main__":
    main()
