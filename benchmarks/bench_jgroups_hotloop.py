"""Micro-benchmark of the JGroups sessions' hot loops: ``on_data`` with MESSAGEs, no sockets.

Feeds 64 KiB chunks of JGroups 2.12 or 5.x MESSAGEs (unicast, multicast to a group of 8, mixed
sizes, and a destination that alternates every message, which defeats runs) into a session and
reports ns per received message; the receivers' outboxes are drained between chunks as a writer
would. ``--decoder`` disables the header cache so that every MESSAGE goes through the codec's
full decoder (the figures before the fast path). ``--profile`` prints a cProfile summary.
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
from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol.jgroups_common import V2, V5, JAddress
from gossiprouter.sessions.base import Hub
from gossiprouter.sessions.jgroups2 import JGroups2Session
from gossiprouter.sessions.jgroups5 import JGroups5Session
from gossiprouter.sessions.jgroups_common import JGroupsSession

CASES = [("unicast", 100), ("unicast", 1000), ("fanout", 100), ("fanout", 1000),
         ("unicast-mixed", 100), ("alternating", 100)]


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
    receivers = [member(i + 1, f"r{i}") for i in range(7 if case == "fanout" else 2)]
    me = _addr(0, v)
    if case == "fanout":
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
    sender, receivers, chunk, n = setup(version, case, size)
    messages = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            sender.on_data(chunk, 0.0)
            sender.outbox.take()
            for r in receivers:
                r.outbox.take()
        messages += 20 * n
    assert not sender.outbox.closed
    return (time.perf_counter() - t0) / messages * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--decoder", action="store_true",
                    help="no header cache: every MESSAGE through the full decoder")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    if args.decoder:
        JGroups2Session._learn = lambda self, data, pos, size: 0  # type: ignore[method-assign]
        JGroups5Session._learn = lambda self, data, body, end: None  # type: ignore[method-assign]
    for version in (2, 5):
        for case, size in CASES:
            if args.profile:
                prof = cProfile.Profile()
                prof.enable()
                ns = run(version, case, size, args.seconds)
                prof.disable()
                pstats.Stats(prof).sort_stats("tottime").print_stats(8)
            else:
                ns = run(version, case, size, args.seconds)
            print(f"jgroups{version} {case:13} {size:5d} B: {ns:7.0f} ns per received message")


if __name__ == "__main__":
    main()
