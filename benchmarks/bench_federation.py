"""Federation benchmark (issue 22): what a group spanning routers costs, in one table.

Everything runs on 127.0.0.1: a mosquitto, routers as real ``gossiprouter serve``
processes bridged to it (``--bridge``), and one router without a bridge as the baseline.
The members are RouterStubs in this process, one stub (one connection) per member, each on
one router. It prints:

* **latency**, p50 and p99 over every delivery, of a unicast and of a 10-member group
  message (one sender, nine receivers): within one router without a bridge, within one
  federated router (local traffic, which the federation must not slow down), and across two
  routers through mosquitto (sender on router A, every receiver on router B). One message
  at a time: the next is sent when every receiver has the previous one, so this is latency,
  not queueing;
* **throughput**: 100-byte unicasts from a raw native member on one router to one on the
  same or on the other router (10 times as many within one router, which goes about 10
  times as fast), pre-encoded and sent in batches with at most 256 in flight
  (bench_topics' loader, so the routers and the broker are the limit, not a Python stub),
  in messages received per second, and the routers' CPU per message (user + system of
  every router process involved, from /proc; the broker's separately);
* **convergence**: ``--joins`` members join on each of three federated routers at once;
  the time until every router's GET_MEMBERS lists all of them;
* **interleaved** (issue 30, benchmarks/federation_mix.py): a raw native sender writes
  ``--mix`` messages at ``--mix-rate`` per second, JGroups-like (each to its own
  destination: the group, then each of 5 receivers in turn), to a group whose receivers are
  spread over the 3 federated routers (1 on the sender's, 2 on each other one), and the same
  traffic with every member on the router without a bridge (the local-only baseline):
  latency at the remote receivers, and the CPU of every process involved (routers and
  mosquitto) per message, in all and per process (the sending router, each receiving
  router, mosquitto). Once one message a tick (1,000 ticks/s), once bundled as JGroups
  bundles them: 6 a tick (a multicast and a unicast to each receiver) in one write;
* **burst**: ``--burst`` such messages at once; the latency at the receiver on the sender's
  router, for the federated group and for a group with every member on that router.
  ``--members jgroups5`` / ``jgroups2``: the interleaved and burst cases with JGroups 5.x
  or 2.12 members;
* **wake-up floor**: the CPU of a trio task's wake-up with nothing to do (and a plain epoll
  loop's), at 1,000/s: what every wake-up of a router's Python costs at least.

The difference between the across and the within-one-federated-router p50 is the broker
hop (target: <= 1 ms on loopback); the rows without and with a bridge for local traffic
show that the federation leaves local traffic alone (target: unchanged within noise).
Wall-clock figures on a shared machine are noisy: compare rows of one run. The latency and
throughput cases take turns for ``--rounds`` rounds (each figure is over all of them), so
that load from elsewhere spreads over every case instead of skewing one.

When the routers do not federate membership (a member of router B never shows up in
router A's GET_MEMBERS within ``--wait`` seconds), the cross-router rows and the
convergence say so instead of a figure.

    python benchmarks/bench_federation.py                      # the figures in docs/
    python benchmarks/bench_federation.py --messages 20 --throughput 200 --joins 20  # smoke
"""

from __future__ import annotations

import argparse
import gc
import itertools
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_topics import Loader, _native_member, run_fanout
from benchmarks.federation_mix import (
    JGROUPS2,
    JGROUPS5,
    NATIVE,
    Framing,
    MixOut,
    run_mix,
    wake_floor,
)
from benchmarks.figures import percentile
from benchmarks.machine import add_cpu_latency_option, cpu_latency
from gossiprouter.protocol import native as wire
from gossiprouter.stub import Channel, RouterStub
from tests.procs import BrokerProcess, RouterProcess, proc_cpu_seconds, wait_listening

STUB = {"reconnect_initial": 0.05, "reconnect_max": 0.5, "send_timeout": 10.0,
        "request_timeout": 10.0, "receive_buffer": 1 << 20, "heartbeat_interval": 5.0,
        "heartbeat_timeout": 30.0}
# 1,000 joins per router fit the default registration limits of one connection; the
# convergence case uses one stub per router for its joins.
ROUTER_ARGS = ("--log-level", "warning")
_group_ids = itertools.count()
LOCAL_FACTOR = 10


class CodeRouter(RouterProcess):
    """A router of another checkout (``--code DIR``: its own .venv and build), for a
    before/after in one sitting: the same cases against the routers of each tree."""

    code: Path | None = None

    def start(self) -> CodeRouter:
        if self.code is None:
            super().start()
            return self
        self.proc = subprocess.Popen(
            [str(self.code / ".venv" / "bin" / "python"), "-m", "gossiprouter", "serve",
             "--host", "127.0.0.1", "--port", str(self.port), *self.args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.code)
        wait_listening(self.port, self.proc)
        return self


@dataclass
class Row:
    case: str
    p50_us: float | None = None
    p99_us: float | None = None
    rate: float | None = None
    cpu_us: float | None = None
    note: str = ""
    samples: int = 0


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    converge_s: float | None = None
    joins_s: float | None = None
    federated: bool = False
    broker_cpu_us: float | None = None
    mix: dict[str, MixOut] = field(default_factory=dict)
    only_mix: bool = False
    # federation_mix.wake_floor: CPU µs of a trio wake-up, of a plain epoll loop's
    wake_floor: tuple[float, float] | None = None

    def row(self, case: str) -> Row:
        return next(r for r in self.rows if r.case == case)


async def _members_seen(stub: RouterStub, group: str, want: int, wait: float) -> bool:
    """True once ``stub``'s router lists ``want`` members of ``group`` (within ``wait``)."""
    with trio.move_on_after(wait):
        while len(await stub.members(group)) < want:
            await trio.sleep(0.005)
        return True
    return False


async def _arrivals(chs: Sequence[Channel], arrivals: list[float]) -> None:
    """One message on each channel; the time each arrived, each in its own task so that a
    delivery's time is its own, not when a loop over the channels got to it."""
    async def one(ch: Channel) -> None:
        await ch.receive()
        arrivals.append(time.perf_counter())

    async with trio.open_nursery() as nursery:
        for ch in chs:
            nursery.start_soon(one, ch)


async def latency(tx_router: str, rx_router: str, receivers: int, n: int, unicast: bool,
                  wait: float) -> list[float] | None:
    """Seconds from send to arrival of each delivery (``n`` messages, one at a time); None
    when ``tx_router`` never lists the receivers (no federated membership)."""
    group = f"lat-{next(_group_ids)}"
    async with trio.open_nursery() as nursery:
        tx_stub = RouterStub([tx_router], **STUB)  # type: ignore[arg-type]
        await nursery.start(tx_stub.run)
        tx = await tx_stub.connect(group, b"tx")
        rx: list[Channel] = []
        for i in range(receivers):
            st = RouterStub([rx_router], **STUB)  # type: ignore[arg-type]
            await nursery.start(st.run)
            rx.append(await st.connect(group, b"rx%d" % i))
        if not await _members_seen(tx_stub, group, receivers + 1, wait):
            nursery.cancel_scope.cancel()
            return None
        targets = rx[:1] if unicast else rx
        lat: list[float] = []
        for i in range(n + 5):  # the first five warm the paths up and are not counted
            arrivals: list[float] = []
            t0 = time.perf_counter()
            await tx.send(bytes(100), dest=b"rx0" if unicast else None)
            with trio.fail_after(max(wait, 5.0)):
                await _arrivals(targets, arrivals)
            if i >= 5:
                lat += [t - t0 for t in arrivals]
        nursery.cancel_scope.cancel()
    return lat


def throughput(tx_port: int, rx_port: int, n: int, wait: float, pids: Sequence[int],
               window: int = 256) -> tuple[int, float, float] | None:
    """(messages received, seconds, CPU seconds of ``pids``) for ``n`` unicasts of 100 bytes
    from a raw native member on ``tx_port`` to one on ``rx_port``, pre-encoded and sent in
    batches with at most ``window`` undelivered (the loader of bench_topics: the routers,
    not a Python stub, are what is measured); None when the receiver is not reachable
    through the sender's router within ``wait`` seconds (no federated membership)."""
    loader = Loader()
    tx: socket.socket | None = None
    try:
        loader.add(_native_member(rx_port, b"rx", subscribe=False))
        tx = _native_member(tx_port, b"tx", subscribe=False)
        frame = wire.encode_route("bench", b"rx", b"tx", bytes(100))
        # The receiver is known at the sender's router once a probe arrives (until then
        # the router answers unknown_destination, which nobody reads).
        deadline = time.monotonic() + wait
        while loader.received == 0:
            if time.monotonic() > deadline:
                return None
            tx.sendall(frame)
            loader.pump(0.05)
        time.sleep(0.2)
        loader.pump(0)
        loader.received = 0
        sock = tx

        def send(k: int) -> None:
            sock.sendall(frame * k)

        out = run_fanout("federation", pids, loader, send, n, 1, window)
        return int(out["deliveries"]), out["wall_s"], out["cpu_s"]
    finally:
        loader.close()
        if tx is not None:
            tx.close()


async def convergence(routers: Sequence[str], joins: int, wait: float
                      ) -> tuple[float, float] | None:
    """(seconds until the joins were acknowledged, seconds until every router lists all
    ``joins * len(routers)`` members), the joins made at once on every router; None when
    some router did not list them all within ``wait`` seconds after the joins."""
    group = f"conv-{next(_group_ids)}"
    total = joins * len(routers)
    async with trio.open_nursery() as nursery:
        joiners: list[RouterStub] = []
        lookers: list[RouterStub] = []
        for address in routers:
            for stubs in (joiners, lookers):
                st = RouterStub([address], **STUB)  # type: ignore[arg-type]
                await nursery.start(st.run)
                stubs.append(st)
        seen: dict[int, float] = {}
        t0 = time.perf_counter()

        async def join_all(stub: RouterStub, r: int) -> None:
            async with trio.open_nursery() as n:
                for i in range(joins):
                    n.start_soon(stub.connect, group, b"r%d-%d" % (r, i))

        async def look(stub: RouterStub, r: int) -> None:
            while len(await stub.members(group)) < total:
                await trio.sleep(0.002)
            seen[r] = time.perf_counter()

        async with trio.open_nursery() as n:
            for r, st in enumerate(joiners):
                n.start_soon(join_all, st, r)
        joined = time.perf_counter()
        with trio.move_on_after(wait + total / 1000):
            async with trio.open_nursery() as n:
                for r, st in enumerate(lookers):
                    n.start_soon(look, st, r)
        nursery.cancel_scope.cancel()
    if len(seen) < len(routers):
        return None
    return joined - t0, max(seen.values()) - t0


# The interleaved and burst cases: (name, where the receivers are, ticks per second or 0
# for a burst, the label of the receivers whose latency is shown).
MIX_LOCAL = "interleaved: one router, no bridge"
MIX_FAR = "interleaved: across 3 routers"
BUNDLE_LOCAL = "interleaved, 6 a tick: one router, no bridge"
BUNDLE_FAR = "interleaved, 6 a tick: across 3 routers"
BURST_FED = "burst: federated group"
BURST_ONE = "burst: group on one router"
# The processes' roles in the mix cases' CPU split (the router of a local-only case is the
# sending one).
SENDING, RECEIVING, BROKER = "sending router", "receiving router", "mosquitto"


def mix_round(res: Results, plain: RouterProcess, fed: Sequence[RouterProcess], broker: int,
              messages: int, rate: float, burst: int, wait: float,
              say: Callable[[str], None], framing: Framing = NATIVE) -> None:
    """One round of the interleaved and burst cases (added to ``res.mix``)."""
    a, b, c = (r.port for r in fed)
    spread = [(a, "local"), (b, "remote"), (b, "remote"), (c, "remote"), (c, "remote")]
    every = [*(r.pid for r in fed), broker]
    alone = [(plain.port, "local")] * 5
    cases = ((MIX_LOCAL, plain.port, alone, messages, rate, [plain.pid], 1),
             (MIX_FAR, a, spread, messages, rate, every, 1),
             (BUNDLE_LOCAL, plain.port, alone, messages, rate, [plain.pid], 6),
             (BUNDLE_FAR, a, spread, messages, rate, every, 6),
             (BURST_FED, a, spread, burst, 0.0, every, 1),
             (BURST_ONE, a, [(a, "local"), *[(a, "other")] * 4], burst, 0.0, every, 1))
    for name, tx, rx, n, r, pids, per_tick in cases:
        roles = (SENDING,) if len(pids) == 1 else (SENDING, RECEIVING, RECEIVING, BROKER)
        say(f"{name}: {n} messages")
        # This process is the loader and every receiver: a full collection of its own (the
        # latency lists grow) stalled all of them for 30 ms, which its p99 counted as the
        # routers'. Collected between the cases instead (the routers collect as always).
        gc.collect()
        gc.disable()
        try:
            out = run_mix(f"mix-{next(_group_ids)}", tx, rx, n, r, pids, wait, per_tick,
                          roles, framing)
        finally:
            gc.enable()
        if out is not None:
            res.mix.setdefault(name, MixOut()).add(out)


async def run(messages: int, group_size: int, count: int, joins: int, wait: float,
              say: Callable[[str], None] = print, rounds: int = 1, mix: int = 0,
              mix_rate: float = 1000.0, burst: int = 0, only_mix: bool = False,
              code: Path | None = None, framing: Framing = NATIVE) -> Results:
    """Start the broker and the routers (of checkout ``code``; None: this one), measure
    every case, stop them; the figures."""
    res = Results()
    tmp = Path(tempfile.mkdtemp(prefix="bench-federation-"))
    broker = BrokerProcess(tmp)
    # As docs/federation.md advises: without it mosquitto holds a small message back until
    # the receiving router ACKs the one before (Nagle), up to the delayed ACK's 40 ms.
    broker.conf.write_text(broker.conf.read_text() + "set_tcp_nodelay true\n")
    CodeRouter.code = code
    plain = CodeRouter(None, *ROUTER_ARGS)
    fed = [CodeRouter(None, *ROUTER_ARGS, "--bridge", broker.url,
                      "--bridge-reconnect-max", "0.5", "--router-id", f"r{i}")
           for i in range(3)]
    try:
        broker.start()
        for r in (plain, *fed):
            r.start()
        a, b = (f"127.0.0.1:{r.port}" for r in fed[:2])
        p = f"127.0.0.1:{plain.port}"
        # Membership federated at all? (A member of router B listed by router A.)
        probe = await latency(a, b, 1, 1, True, wait)
        res.federated = probe is not None
        unfederated = "membership not federated"

        def port_of(address: str) -> int:
            return int(address.rsplit(":", 1)[1])

        def sent_in(tx: str, rx: str) -> int:
            # Local unicasts go about 10 times as fast (the compiled relay): 10 times as
            # many keep their CPU time well above /proc's 10 ms tick.
            return count * (LOCAL_FACTOR if tx == rx else 1)

        where_: Sequence[tuple[str, str, str, list[CodeRouter]]] = (
            ("one router, no bridge", p, p, [plain]),
            ("one router, federated", a, a, fed[:1]),
            ("across two routers (mosquitto)", a, b, fed[:2]))
        cases = [("unicast", 1, True), (f"{group_size}-member group", group_size - 1, False)]
        lats: dict[str, list[float]] = {}
        tput: dict[str, list[float]] = {}  # received, seconds, router CPU, broker CPU
        # The cases take turns, round after round, so that a burst of load from elsewhere on
        # a shared machine spreads over all of them instead of skewing one.
        if only_mix:
            res.only_mix, cases, where_ = True, [], ()
        for rnd in range(rounds):
            for what, receivers, uni in cases:
                for where, tx, rx, _ in where_:
                    say(f"round {rnd + 1}/{rounds}, latency: {what}, {where}")
                    if tx == rx or res.federated:
                        lat = await latency(tx, rx, receivers, messages, uni, wait)
                        if lat is not None:
                            lats.setdefault(f"{what}: {where}", []).extend(lat)
            for where, tx, rx, procs in where_:
                say(f"round {rnd + 1}/{rounds}, throughput: unicast, {where}")
                broker_cpu = proc_cpu_seconds(broker.pid)
                out = None
                if tx == rx or res.federated:
                    out = throughput(port_of(tx), port_of(rx), sent_in(tx, rx), wait,
                                     [r.pid for r in procs])
                if out is not None:
                    acc = tput.setdefault(where, [0.0, 0.0, 0.0, 0.0])
                    for i, v in enumerate((*out, proc_cpu_seconds(broker.pid) - broker_cpu)):
                        acc[i] += v
            if mix and res.federated:
                mix_round(res, plain, fed, broker.pid, mix, mix_rate, burst, wait, say,
                          framing)
        for what, _, _ in cases:
            for where, *_ in where_:
                row = Row(f"{what}: {where}")
                lat = lats.get(row.case)
                if lat is None:
                    row.note = unfederated
                else:
                    row.p50_us, row.p99_us = percentile(lat, 0.5) * 1e6, percentile(lat, 0.99) * 1e6
                    row.samples = len(lat)
                res.rows.append(row)
        for where, tx, rx, _ in where_:
            row = Row(f"throughput, unicast: {where}")
            if where not in tput:
                row.note = unfederated
            else:
                got, secs, cpu, broker_cpu = tput[where]
                row.samples = int(got)
                row.rate = got / secs if secs else 0.0
                row.cpu_us = cpu / max(got, 1) * 1e6
                want = sent_in(tx, rx) * rounds
                if got < want:
                    row.note = f"{want - int(got)} of {want} not received"
                if where.startswith("across") and got:
                    res.broker_cpu_us = broker_cpu / got * 1e6
            res.rows.append(row)
        say(f"convergence: {joins} joins on each of 3 routers")
        conv = await convergence([f"127.0.0.1:{r.port}" for r in fed], joins, wait) \
            if res.federated and not only_mix else None
        if conv is not None:
            res.joins_s, res.converge_s = conv
    finally:
        for r in (plain, *fed):
            if r.proc is not None and r.proc.poll() is None:
                r.stop()
        broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return res


def _fmt(v: float | None, spec: str = ",.0f") -> str:
    return "-" if v is None else format(v, spec)


def mix_shown(name: str, m: MixOut) -> list[float]:
    """The latencies a mix case's row shows: the remote receivers' across routers, the
    local receiver's otherwise."""
    return m.lat.get("remote" if name in (MIX_FAR, BUNDLE_FAR) else "local", [])


def print_mix(res: Results, out: Callable[[str], None] = print) -> None:
    """The interleaved and burst rows, and their ratios against issue 30's targets."""
    if not res.mix:
        return
    out(f"{'interleaved and burst (issue 30)':<58} {'p50 µs':>9} {'p99 µs':>9} "
        f"{'msg/s':>9} {'CPU µs/msg':>11}  note")
    fig: dict[str, tuple[float, float, float]] = {}
    for name, m in res.mix.items():
        lat = mix_shown(name, m)
        note = "" if m.delivered == m.expected else \
            f"{m.expected - m.delivered} of {m.expected} deliveries missing"
        if not lat:
            out(f"{name:<58} {'-':>9} {'-':>9}  {note}")
            continue
        p50, p99 = percentile(lat, 0.5) * 1e6, percentile(lat, 0.99) * 1e6
        cpu = m.cpu_s / max(m.messages, 1) * 1e6
        fig[name] = (p50, p99, cpu)
        out(f"{name:<58} {p50:>9,.0f} {p99:>9,.0f} {m.messages / m.wall_s:>9,.0f} "
            f"{cpu:>11,.2f}  {note}")
    for far, local, what in ((MIX_FAR, MIX_LOCAL, "interleaved"),
                             (BUNDLE_FAR, BUNDLE_LOCAL, "interleaved, 6 a tick,")):
        if far in fig:
            out(f"{what} across routers, p50: {fig[far][0] / 1000:.2f} ms (target <= 2), "
                f"p99: {fig[far][1] / 1000:.2f} ms (target <= 10)")
        if far in fig and local in fig:
            ratio = (f"{fig[far][2] / fig[local][2]:.1f}x" if fig[local][2] else
                     "- (local CPU below /proc's 10 ms tick: more --mix)")
            out(f"{what} CPU per message, across routers / local-only: {ratio} (target <= 5)")
            far_m, local_m = res.mix[far], res.mix[local]
            if local_m.cpu_s:
                # The kernel's share (system time) stays whatever runs in user space.
                kernel = (far_m.sys_s / far_m.messages) / (local_m.cpu_s / local_m.messages)
                out(f"{what} of that the kernel's (system time) across routers / all CPU "
                    f"local-only: {kernel:.1f}x")
    if BURST_FED in fig and BURST_ONE in fig:
        out(f"burst, local receiver, federated group / group on one router, p50: "
            f"{fig[BURST_FED][0] / fig[BURST_ONE][0]:.2f}x, p99: "
            f"{fig[BURST_FED][1] / fig[BURST_ONE][1]:.2f}x (target <= 2)")
    print_split(res, out)


def print_split(res: Results, out: Callable[[str], None] = print) -> None:
    """The mix cases' CPU per message by process: the sending router, each receiving router
    (the mean of the two), mosquitto, and all of them."""
    out(f"{'CPU µs per message, per process (of it system)':<58} {'sending':>13} "
        f"{'each rx':>13} {'broker':>13} {'all':>15}")
    for name, m in res.mix.items():
        out(f"{name:<58} {m.per_message_us(SENDING):>13} {m.per_message_us(RECEIVING):>13} "
            f"{m.per_message_us(BROKER):>13} {m.per_message_us():>15}")
    if res.wake_floor is not None:
        out(f"a wake-up of Python with nothing to do, 1,000/s: trio {res.wake_floor[0]:,.1f} µs "
            f"CPU, a plain epoll loop {res.wake_floor[1]:,.1f} µs (each router's floor per "
            f"wake-up)")


def print_table(res: Results, joins: int, out: Callable[[str], None] = print) -> None:
    if res.rows:
        out(f"{'case':<58} {'p50 µs':>9} {'p99 µs':>9} {'msg/s':>9} {'CPU µs/msg':>11}  note")
    for r in res.rows:
        out(f"{r.case:<58} {_fmt(r.p50_us):>9} {_fmt(r.p99_us):>9} {_fmt(r.rate):>9} "
            f"{_fmt(r.cpu_us, ',.2f'):>11}  {r.note}")
    if res.broker_cpu_us is not None:
        out(f"{'  mosquitto CPU per message across routers':<58} {'':>9} {'':>9} {'':>9} "
            f"{res.broker_cpu_us:>11,.2f}")
    conv = ("membership not federated" if res.converge_s is None else
            f"{res.converge_s:.3f} s (joins acknowledged after {res.joins_s:.3f} s)")
    if not res.only_mix:
        out(f"convergence, {joins:,} joins on each of 3 routers: {conv}")
    for what in ("unicast", next((r.case.split(":")[0] for r in res.rows
                                  if "group" in r.case), "")):
        fed = next((r for r in res.rows if r.case == f"{what}: one router, federated"), None)
        far = next((r for r in res.rows
                    if r.case == f"{what}: across two routers (mosquitto)"), None)
        plain = next((r for r in res.rows if r.case == f"{what}: one router, no bridge"), None)
        if fed and far and fed.p50_us is not None and far.p50_us is not None:
            out(f"broker hop, {what}, p50: {far.p50_us - fed.p50_us:+,.0f} µs (target <= 1,000)")
        if fed and plain and fed.p50_us is not None and plain.p50_us is not None:
            out(f"local {what} with federation / without, p50: "
                f"{fed.p50_us / plain.p50_us:.2f}x (target: 1 within noise)")
    print_mix(res, out)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1000,
                    help="messages per latency case and round, one at a time (default 1000)")
    ap.add_argument("--group", type=int, default=10,
                    help="members of the group case, sender included (default 10)")
    ap.add_argument("--throughput", type=int, default=100_000,
                    help="unicasts across routers per round (default 100000); the local "
                         "cases send 10 times as many, so that their CPU time stays well "
                         "above /proc's 10 ms tick")
    ap.add_argument("--joins", type=int, default=1000,
                    help="joins on each of the 3 routers for the convergence (default 1000)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of every latency and throughput case, taking turns; the "
                         "figures are over all rounds (default 3)")
    ap.add_argument("--mix", type=int, default=5000,
                    help="messages per round of the interleaved cases (default 5000; 0: "
                         "no interleaved or burst case)")
    ap.add_argument("--mix-rate", type=float, default=1000.0,
                    help="messages per second of the interleaved cases (default 1000)")
    ap.add_argument("--burst", type=int, default=40_000,
                    help="messages per round of the burst cases (default 40000)")
    ap.add_argument("--only-mix", action="store_true",
                    help="only the interleaved and burst cases (and the probe)")
    ap.add_argument("--members", choices=("native", "jgroups5", "jgroups2"), default="native",
                    help="who sends and receives in the interleaved and burst cases: raw "
                         "native members (default), or JGroups 5.x or 2.12 RouterStubs' frames")
    ap.add_argument("--code", type=Path, default=None,
                    help="run the routers of another checkout DIR (with its .venv), e.g. "
                         "main's, for a before/after: alternate runs with and without it")
    ap.add_argument("--wait", type=float, default=5.0,
                    help="seconds to wait for a remote member to be listed (default 5)")
    add_cpu_latency_option(ap)
    args = ap.parse_args(argv)
    for name in ("messages", "throughput", "joins", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name}: expected at least 1")
    if args.group < 2:
        ap.error("--group: expected at least 2 (a sender and a receiver)")
    if args.code is not None and not (args.code / ".venv" / "bin" / "python").exists():
        ap.error(f"--code {args.code}: no .venv/bin/python there")
    if args.mix < 0 or args.burst < 0 or args.mix_rate <= 0:
        ap.error("--mix and --burst: expected 0 or more; --mix-rate: more than 0")
    with cpu_latency(args.cpu_latency_us):
        res = trio.run(run, args.messages, args.group, args.throughput, args.joins, args.wait,
                       lambda s: print(s, file=sys.stderr), args.rounds, args.mix,
                       args.mix_rate, args.burst, args.only_mix, args.code,
                       {"native": NATIVE, "jgroups5": JGROUPS5, "jgroups2": JGROUPS2}[
                           args.members])
        if res.mix:
            res.wake_floor = wake_floor()
    print_table(res, args.joins)


if __name__ == "__main__":
    main()
