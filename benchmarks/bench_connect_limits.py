"""Cost of the per-connection registration limits: N CONNECTs on one connection.

Registers ``--count`` members, each in its own group, through one carrier of a
:class:`~gossiprouter.routing.table.RoutingTable` whose ``groups_per_connection`` is set (just
above N, so nothing is refused) and prints the time. The check used to rebuild the
connection's set of groups on every CONNECT (quadratic: 100,000 CONNECTs took minutes); run
it on an older checkout for the before figure. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gossiprouter.core.config import Config
from gossiprouter.routing.entries import Limits
from gossiprouter.routing.table import RoutingTable
from gossiprouter.sessions.base import Hub
from gossiprouter.sessions.native import NativeSession


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, action="append",
                    help="CONNECTs on one connection (repeatable; default 10,000 and 20,000)")
    args = ap.parse_args()
    for n in args.count or [10_000, 20_000]:
        table = RoutingTable(limits=Limits(groups_per_connection=n + 1,
                                           addresses_per_connection=0))
        carrier = NativeSession(Hub(Config(port=0)), "bench")  # the table only hashes it
        t0 = time.perf_counter()
        for i in range(n):
            table.connect(carrier, f"g{i}", b"A")
        print(f"{n:,} CONNECTs on one connection, groups_per_connection {n + 1:,}: "
              f"{time.perf_counter() - t0:.2f} s", flush=True)


if __name__ == "__main__":
    main()
