"""In-process differential harness of the compiled fast path (``gossiprouter/server/relay/``).

    python benchmarks/relay_harness.py [--seed N] [--steps N] [--seconds S]

This process plays the router's Python half around one ``gossiprouter.server._relay.Relay``, over
socketpairs: senders and receivers of all three framings (native, JGroups 2.12, 5.x) in one
relay. Each sender's stream is decided twice. The *reference* is the pure path alone: the
protocol's own scanner (``gossiprouter.protocol``) over the stream, with the session's policy
in miniature (a run is routed to its group or destination, a control frame is checked and
consumed, a malformed, oversized or negative frame closes the connection). The *run under
test* is the thread reading the socket and relaying what was learned, and this process
handling its upcalls with the same scanner and policy, learning routes as the sessions do
(``fastpath.learn_native`` / ``learn_jgroups``) and writing receivers as ``fastpath.py`` does
(``Relay.send`` while attached, the receiver's own queue and raw socket once evicted, attach
again when the queue is empty). After each step every receiver must hold exactly the
reference's frames, byte for byte and, per sender, in order, and nothing else (a
receiver-side framing check: every byte belongs to one whole expected frame); every byte a
sender wrote was handled exactly once (relayed by the thread, or handed up to Python); no
connection is handed up twice without being read again; nothing is dropped.

What it plays, chosen by ``random.Random(seed)``: batches of learned and unlearned routes,
control frames and hostile frames (lengths past ``max_frame``, negative, shorter than a learned
header, payload lengths that do not end the frame) written in pieces cut at random offsets,
and for one stream per framing at *every* offset, each cut read by the thread alone; frames
larger than ``RECV_SIZE`` and than ``max_hold``; a receiver that stops reading (evicted, then
written by its queue); a JGroups sender that receives its group's multicasts on its own
connection (read by the thread and written by it and by Python, as ``Group.targets()``
makes it); direct sends from two Python threads at once while the thread relays,
``invalidate``, a sender's EOF, and receivers and senders closed and opened again on the same
fd (the stale id must be refused by ``send``, ``take`` and ``learn``).

It drives only the Relay's Python API (what ``gossiprouter/server/fastpath.py`` calls), so it runs
unchanged against any build: ``scripts/sanitize`` runs it under ASAN+UBSAN and TSAN builds
(``GOSSIPROUTER_RELAY_SO``), ``tests/test_relay_harness.py`` a short bounded run of the
normal build. It exits 1 with the first violation and the seed.

The files: this one, the run and its steps; ``relay_check.py``, the relay, its connections and
the checks after each step; ``relay_model.py``, the reference, the connections' records and
the frames the senders write.
"""

from __future__ import annotations

import argparse
import collections
import random
import select
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import relay_check  # noqa: E402
from benchmarks.relay_check import STALL_WAITS, WAIT  # noqa: E402
from benchmarks.relay_model import (  # noqa: E402
    KINDS,
    MAX_FRAME,
    SMALL_HOLD,
    Violation,
    address,
    index_of,
)
from gossiprouter.protocol import jgroups2 as j2  # noqa: E402
from gossiprouter.protocol import jgroups5 as j5  # noqa: E402
from gossiprouter.protocol import native as wire  # noqa: E402
from gossiprouter.server import fastpath  # noqa: E402

__all__ = ["Harness", "Violation", "main", "run"]


class Harness(relay_check.Harness):
    """The machinery (relay_check.py) and the steps a run takes with it: traffic, a receiver
    or sender closed and opened again on the same fd, and the every-offset sweeps."""

    def reopen_closed(self) -> None:
        for n, s in enumerate(self.senders):
            if s.closed:
                fd = s.rsock.fileno()
                s.csock.close()
                s.rsock.close()
                t = self._open_sender(s.kind, int(s.name[-1]))
                self.senders[n] = t
                if self.twins and s.kind != "native" and t.hold != SMALL_HOLD:
                    self._twin(t)
                self._stale(s.cid, fd, t.rsock.fileno())

    def _stale(self, old: int, fd: int, new_fd: int) -> None:
        """The id of a closed connection is refused, even when its fd (and slot) is reused."""
        if fd == new_fd:
            self.stats["fds reused"] += 1
        if self.relay.send(old, b"x") != -2 or self.relay.take(old) != b"":
            raise Violation(f"the closed connection {old} still takes sends")
        live = [r.cid for r in self.receivers[:1]]
        s = self.senders[0]
        if self.relay.learn(s.cid, b"k", b"", 0, MAX_FRAME, [old, *live]):
            raise Violation(f"learn accepted the closed connection {old} as a receiver")
        if self.relay.learn(old, b"k", b"", 0, MAX_FRAME, live):
            raise Violation(f"learn accepted the closed connection {old} as a sender")

    def reopen_receiver(self) -> None:
        r = self.rng.choice([r for r in self.receivers if not r.twin_of])
        with r.lock:
            r.closed = True
        self.relay.invalidate()  # the routing table changes: RoutingTable.changed
        self.relay.close(r.cid)
        fd = r.rsock.fileno()
        r.csock.close()
        r.rsock.close()
        i = self.receivers.index(r)
        idx = int(r.addr[-1:]) if r.kind == "native" else index_of(r.kind, r.addr)
        self.receivers[i] = self._open_receiver(r.kind, idx)
        self.relay.invalidate()  # and joined again
        self.stats["receivers reopened"] += 1
        self._stale(r.cid, fd, self.receivers[i].rsock.fileno())

    def traffic(self) -> None:
        rng = self.rng
        live = [s for s in self.senders if not s.closed]
        for s in rng.sample(live, rng.randint(1, len(live))):
            data = self.batch(s, rng.randint(1, 32), hostile=0.04 if rng.random() < 0.25 else 0)
            # Written in pieces, each read alone: the first frames of a header go up and
            # teach the thread, which relays the next pieces' frames.
            cuts = [rng.randrange(1, len(data)) for _ in range(rng.randint(0, 8))]
            self.send(s, data, cuts, eof=rng.random() < 0.02)
        paused = victim = None
        sndbuf = 0
        if rng.random() < 0.3:
            paused = victim = rng.choice(self.receivers)
            paused.paused = True
            # Its socket fills at once: evicted as soon as anything is routed to it.
            sndbuf = victim.rsock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            victim.rsock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            self.stats["receivers paused"] += 1
        threads = []
        if rng.random() < 0.3:
            for t in range(2):
                seed = rng.randrange(1 << 30)
                threads.append(threading.Thread(target=self._direct, args=(t, seed)))
            for th in threads:
                th.start()
        waits = 0
        while any(s.pos < len(s.pending) and not s.closed for s in self.senders):
            if not self.pump():
                waits += 1
                if paused is not None and waits > 200:  # its socket is full: read it again
                    paused.paused = False
                    paused = None
                if waits > STALL_WAITS:
                    raise Violation(f"stalled writing: {self._diagnose()}")
                select.select([self.relay.fileno()], [], [], WAIT)
            else:
                waits = 0
        for th in threads:
            th.join()
        if victim is not None:
            victim.paused = False
            if victim.rsock.fileno() >= 0:
                victim.rsock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf // 2)
        self.settle("traffic")

    def _direct(self, t: int, seed: int) -> None:
        """A Python thread sending to receivers (replies, events) while the thread relays."""
        rng = random.Random(seed)
        source = f"T{t}"
        for i in range(rng.randint(20, 60)):
            r = rng.choice(self.receivers)
            p = b"%s|%d|" % (source.encode(), i) + rng.randbytes(rng.randrange(0, 300))
            if r.kind == "native":
                f = wire.encode_route("g", None, source.encode(), p)
            elif r.kind == "jgroups2":
                f = j2.message_to_client(None, p)
            else:
                f = j5.message("cluster", None, address("jgroups5", 200 + t), p)
            with r.lock:
                if r.closed:
                    continue
                r.expect(source, f)
                self._push(r, f)
            self.stats["direct sends from threads"] += 1

    def sweep(self, kind: str) -> None:
        """One short stream of ``kind`` cut at every offset: the thread reads each cut alone."""
        s = next(s for s in self.senders if s.kind == kind and s.hold != SMALL_HOLD)
        dest = None
        for _ in range(2):  # taught: the first goes up and is learned (90 %)
            self.send(s, self.frames.route(s, dest, 10), [])
            self.settle(f"sweep {kind}: learning")
        cut = 1
        while True:  # the streams' lengths vary with their tags: cut until one is shorter
            stream = b"".join([self.frames.route(s, dest, 10), self.frames.control(kind),
                               self.frames.route(s, dest, 30)])
            if cut >= len(stream):
                break
            self.send(s, stream, [cut])
            self.settle(f"sweep {kind}: cut at {cut}")
            self.stats["cuts swept"] += 1
            if s.closed:
                self.reopen_closed()
                s = next(s for s in self.senders if s.kind == kind and s.hold != SMALL_HOLD)
            cut += 1


def run(seed: int, steps: int, seconds: float, sweep: bool = True,
        say: Callable[[str], None] = print, twins: bool = True,
        threads: int | None = None, promote_reads: int | None = None
        ) -> collections.Counter[str]:
    """A run of at most ``steps`` steps and about ``seconds`` (the sweeps first); its
    counters. ``threads``, ``promote_reads``: the relay's worker threads and when a connection
    gets one (Relay's arguments; default: drawn from the seed). Raises Violation."""
    h = Harness(seed, twins=twins, threads=threads, promote_reads=promote_reads)
    h.start()
    deadline = time.monotonic() + seconds
    try:
        if sweep:
            for kind in KINDS:
                h.sweep(kind)
        while h.step < steps and time.monotonic() < deadline:
            h.step += 1
            x = h.rng.random()
            try:
                if x < 0.06:
                    h.reopen_receiver()
                elif x < 0.10:
                    h.invalidate()
                else:
                    h.traffic()
                h.reopen_closed()
            except Violation as e:
                raise Violation(f"step {h.step}: {e}") from None
        h.stats["steps"] = h.step
        info = h.relay.info()
        h.stats["worker threads"] = info["threads"]
        h.stats["promotions to a worker"] = info["promotions"]
        h.stats["demotions from a worker"] = info["demotions"]
        h.stats["batch"] = info["batch"]
        if info["sched_refused"]:
            raise Violation(f"SCHED_BATCH refused: errno {info['sched_refused']}")
        return h.stats
    finally:
        h.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="relay_harness", description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=None, help="replay a run (default: random)")
    ap.add_argument("--steps", type=int, default=1_000_000, help="at most this many steps")
    ap.add_argument("--seconds", type=float, default=20.0, help="about this long at most")
    ap.add_argument("--no-sweep", action="store_true", help="skip the every-offset sweeps")
    ap.add_argument("--threads", type=int, default=None, choices=range(0, 257), metavar="N",
                    help="the relay's worker threads for busy connections, 0 to 256 (default: "
                         "0, 1 or 4, drawn from the seed)")
    ap.add_argument("--no-twins", action="store_true",
                    help="no sender receives its group's multicasts on its own connection")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    mod = fastpath._relay
    where = getattr(mod, "__file__", "?")
    print(f"relay harness: seed {seed}, module {where}", flush=True)
    try:
        stats = run(seed, args.steps, args.seconds, sweep=not args.no_sweep,
                    twins=not args.no_twins, threads=args.threads)
    except Violation as e:
        print(f"relay harness: FAILED (seed {seed}): {e}", flush=True)
        return 1
    keys = sorted(stats)
    print("relay harness: " + ", ".join(f"{k} {stats[k]}" for k in keys), flush=True)
    if not stats["frames relayed by the thread"]:
        print("relay harness: FAILED: the thread relayed nothing", flush=True)
        return 1
    print(f"relay harness: OK (seed {seed}, {stats['steps']} steps, "
          f"{stats['worker threads']} worker threads, {stats['promotions to a worker']} "
          f"promotions, threads scheduled {'batch' if stats['batch'] else 'normal'})",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
