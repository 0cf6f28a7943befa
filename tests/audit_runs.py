"""Hand-made load-test runs for the analysis tests, and a fixture of one.

:func:`build_run` writes a small group run with the real writers, with known faults: lost,
duplicated and reordered deliveries, a member that leaves mid-run, one that is killed, one that
joins late, a message whose send record is missing and a delivery to a non-member (the
expectations are in tests/test_audit.py's test_delivery_audit). :func:`run_fixture` makes a
module-scoped fixture of a run builder: tests/test_audit.py's for this one,
tests/test_topics_audit.py's for its topics run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gossiprouter.loadtest.records import MembershipWriter, RecordWriter

S = 1_000_000_000  # ns per second
MS = 1_000_000
T0 = 1_000 * S  # an arbitrary monotonic-clock origin
LATENCY = 1 * MS
SLOW_LATENCY = 50 * MS  # the one slow delivery: x/4 to y


@dataclass
class Delivery:
    sender: str
    seq: int
    group: str
    receiver: str
    t_send: int
    t_recv: int
    dest: str | None = None


def build_run(run_dir: Path) -> None:
    """Write the hand-made run (see the expectations in test_delivery_audit)."""
    with MembershipWriter(run_dir / "membership.parquet") as m:
        for member in ("a", "b", "c", "d", "e"):
            m.join("g1", member, T0)
        for member in ("x", "y"):
            m.join("g2", member, T0)
        m.join("g1", "f", T0 + 5 * S + S // 2)  # joins late, at 5.5 s
        m.leave("g1", "d", T0 + 10 * S)
        m.killed("g1", "e", T0 + 20 * S)
    (run_dir / "manifest.json").write_text(json.dumps({"scenario": "unit", "peers": 7}))

    sends: list[tuple[str, int, str, int, str | None]] = []  # sender, seq, group, t, dest
    recvs: list[Delivery] = []

    # a multicasts in g1 at 1 s, 2 s, ... 29 s (seq 0..28).
    for seq in range(29):
        t = T0 + (seq + 1) * S
        sends.append(("a", seq, "g1", t, None))
        receivers = ["b", "c"]
        if seq <= 9:  # d leaves at 10 s: seq 9 (sent at 10 s) is undetermined, delivered
            receivers.append("d")
        if seq <= 18:  # e killed at 20 s: seq 19 is undetermined and not delivered
            receivers.append("e")
        if seq >= 5:  # f joined at 5.5 s: seq 4 is undetermined and not delivered
            receivers.append("f")
        lost = {(3, "c"), (7, "b"), (2, "d"), (15, "e"), (16, "e")}
        for r in receivers:
            if (seq, r) not in lost:
                recvs.append(Delivery("a", seq, "g1", r, t, t + LATENCY))
    # Duplicates: b gets a/5 twice, c gets a/20 three times.
    recvs.append(Delivery("a", 5, "g1", "b", T0 + 6 * S, T0 + 6 * S + 2 * MS))
    recvs += [Delivery("a", 20, "g1", "c", T0 + 21 * S, T0 + 21 * S + k * MS) for k in (2, 3)]
    # Reordering: c gets a/12 before a/11; b gets a/25 after a/27.
    for d in recvs:
        if (d.sender, d.receiver, d.seq) == ("a", "c", 11):
            d.t_recv = T0 + 13 * S + 2 * MS
        if (d.sender, d.receiver, d.seq) == ("a", "b", 25):
            d.t_recv = T0 + 28 * S + 2 * MS
    # A delivery to x, which is not in g1.
    recvs.append(Delivery("a", 0, "g1", "x", T0 + S, T0 + S + LATENCY))
    # e multicasts once at 3 s but its send record was never flushed (killed later).
    recvs += [Delivery("e", 0, "g1", r, T0 + 3 * S, T0 + 3 * S + LATENCY) for r in "abcd"]

    # x unicasts to y at 1..5 s (x/2 lost, x/4 slow), then to zz, a non-member, at 6 s.
    for seq in range(5):
        t = T0 + (seq + 1) * S
        sends.append(("x", seq, "g2", t, "y"))
        if seq != 2:
            lat = SLOW_LATENCY if seq == 4 else LATENCY
            recvs.append(Delivery("x", seq, "g2", "y", t, t + lat, dest="y"))
    sends.append(("x", 5, "g2", T0 + 6 * S, "zz"))
    # y unicasts to x at 2 s.
    sends.append(("y", 0, "g2", T0 + 2 * S, "x"))
    recvs.append(Delivery("y", 0, "g2", "x", T0 + 2 * S, T0 + 2 * S + LATENCY, dest="x"))

    # One writer per "process"; small batches so that each process writes several files.
    procs = {name: i for i, name in enumerate("abcdefxy")}
    writers = {name: RecordWriter(run_dir / "records", run="unit-run", proc=p, batch_rows=10)
               for name, p in procs.items()}
    def size(group: str) -> int:
        return 100 if group == "g1" else 1000

    for sender, seq, group, t, dest in sends:
        writers[sender].send(sender, seq, group, size(group), dest=dest, t_send_ns=t)
    for d in recvs:
        writers[d.receiver].recv(d.sender, d.seq, d.group, d.receiver, size(d.group), d.t_send,
                                 dest=d.dest, t_recv_ns=d.t_recv)
    for w in writers.values():
        w.close()


def run_fixture(name: str, build: Callable[[Path], None]) -> Any:
    """A module-scoped fixture: a temporary directory (``name``) holding the run ``build``
    writes, built once per test module. Its name is that of the module attribute it is
    assigned to."""

    @pytest.fixture(scope="module")
    def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
        path = tmp_path_factory.mktemp(name)
        build(path)
        return path

    return built
