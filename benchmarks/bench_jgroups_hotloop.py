"""Micro-benchmark of the JGroups sessions' hot loops: ``on_data`` with MESSAGEs, no sockets.

Feeds 64 KiB chunks of JGroups 2.12 or 5.x MESSAGEs (unicast, multicast to a group of 8, mixed
sizes, a destination that alternates every message, and four senders of one connection taking
turns to four destinations: both defeat runs, every message is a run of one) into a session and
reports ns per received message: the fastest block of 20 chunks, in process CPU time, the figure
that other load on a shared machine distorts least. The receivers' outboxes are drained between
chunks as a writer would. ``--decoder`` disables the scanners' header cache so that every
MESSAGE goes through the codec's full decoder (the figures before the fast path).
``--profile`` prints a cProfile summary. ``--versions`` and ``--cases`` pick what to run.

The script only drives sessions through ``on_data``, so it measures another checkout too:
``--root DIR`` puts that checkout's ``gossiprouter`` first on ``sys.path``. Compare two
checkouts by alternating the runs in one sitting.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.profiling import measured  # this checkout's, whatever --root says

if __name__ == "__main__" and "--root" in sys.argv:  # the checkout to measure (see above)
    sys.path.insert(0, sys.argv[sys.argv.index("--root") + 1])

from gossiprouter.core.config import Config
from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups2_scan as j2scan
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol import jgroups5_scan as j5scan
from gossiprouter.protocol.jgroups_address import V2, V5, JAddress
from gossiprouter.sessions.base import Hub
from gossiprouter.sessions.jgroups2 import JGroups2Session
from gossiprouter.sessions.jgroups5 import JGroups5Session
from gossiprouter.sessions.jgroups_common import JGroupsSession

CASES = [("unicast", 100), ("unicast", 1000), ("fanout", 100), ("fanout", 1000),
         ("unicast-mixed", 100), ("alternating", 100), ("interleaved", 100)]
SENDERS = 4  # the interleaved case's senders, registered on one connection


def _addr(i: int, version: int) -> JAddress:
    return JAddress.from_uuid(0x1000 + i, 0x2000 + i, version=version)


def _message(version: int, dest: JAddress | None, sender: JAddress, size: int) -> bytes:
    if version == 2:
        return j2.message("g", dest, bytes(size))
    return j5.message("g", dest, sender, bytes(size))


def setup(version: int, case: str, size: int
          ) -> tuple[JGroupsSession, list[JGroupsSession], bytes, int]:
    hub = Hub(Config(port=0))
    v = V2 if version == 2 else V5

    def member(i: int, name: str) -> JGroupsSession:
        s: JGroupsSession
        if version == 2:
            s = JGroups2Session(hub, name)
            s.on_data(j2.connect("g", _addr(i, v), name, [JAddress.from_ip("127.0.0.1", 7800,
                                                                           version=v)]), 0.0)
        else:
            s = JGroups5Session(hub, name)
            s.on_data(j5.register("g", _addr(i, v), name,
                                  JAddress.from_ip("127.0.0.1", 7800, version=v)), 0.0)
        s.outbox.take()
        return s

    sender = member(0, "sender")
    receivers = [member(i + 1, f"r{i}")
                 for i in range({"fanout": 7, "interleaved": SENDERS}.get(case, 2))]
    me = _addr(0, v)
    if case == "interleaved":
        for i in range(1, SENDERS):  # more members on the sender's connection
            if version == 2:
                sender.on_data(j2.connect("g", _addr(100 + i, v), f"s{i}", None), 0.0)
            else:
                sender.on_data(j5.register("g", _addr(100 + i, v), f"s{i}", None), 0.0)
        sender.outbox.take()
        frames = [_message(version, _addr(1 + i, v), _addr(100 + i if i else 0, v), size)
                  for i in range(SENDERS)]
    elif case == "fanout":
        frames = [_message(version, None, me, size)]
    elif case == "alternating":
        frames = [_message(version, _addr(1 + i, v), me, size) for i in range(2)]
    elif case == "unicast-mixed":
        frames = [_message(version, _addr(1, v), me, size // 2 + (i * 37) % (size + 1))
                  for i in range(64)]
    else:
        frames = [_message(version, _addr(1, v), me, size)]
    one = b"".join(frames)
    reps = max(1, 65536 // len(one))
    return sender, receivers, one * reps, reps * len(frames)


def run(version: int, case: str, size: int, seconds: float) -> float:
    """ns per message of the fastest block of 20 chunks, in this process's CPU time: on a
    machine shared with other work, the best block is the figure that load distorts least."""
    sender, receivers, chunk, n = setup(version, case, size)
    # No control budget: with --decoder every MESSAGE is a control frame, and a paused session
    # would only queue the chunks (the figures would then measure nothing).
    sender.control_rate = 0
    sender.turn_left = sys.maxsize
    counters = sender.hub.counters
    routed = counters.routed
    blocks = 0
    best = float("inf")
    clock = time.process_time
    t_end = clock() + seconds
    while clock() < t_end:
        t0 = clock()
        for _ in range(20):
            sender.on_data(chunk, 0.0)
            sender.outbox.take()
            for r in receivers:
                r.outbox.take()
        best = min(best, clock() - t0)
        blocks += 1
    assert not sender.outbox.closed
    assert counters.routed - routed == blocks * 20 * n, "not every message was routed"
    return best / (20 * n) * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--decoder", action="store_true",
                    help="no header cache: every MESSAGE through the full decoder")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--versions", type=int, nargs="+", choices=(2, 5), default=[2, 5])
    ap.add_argument("--cases", nargs="+", choices=sorted({c for c, _ in CASES}),
                    help="only these cases (default: all)")
    ap.add_argument("--root", metavar="DIR",
                    help="measure the gossiprouter package of this checkout instead")
    args = ap.parse_args()
    if args.root:
        import gossiprouter
        print(f"measuring {Path(gossiprouter.__file__).parent}")
    if args.decoder:
        j2scan.Scanner._learn = lambda self, data, pos, size, max_frame: 0  # type: ignore[method-assign]
        j5scan.Scanner._learn = lambda self, data, body, end: None  # type: ignore[method-assign]
    for version in args.versions:
        for case, size in CASES:
            if args.cases and case not in args.cases:
                continue
            ns = measured(partial(run, version, case, size, args.seconds), args.profile, 8)
            print(f"jgroups{version} {case:13} {size:5d} B: {ns:7.0f} ns per received message")


if __name__ == "__main__":
    main()
