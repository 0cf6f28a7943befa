"""The mutation fuzzer (``scripts/fuzz``, benchmarks/fuzz_router.py): what it generates, how it
counts, and a bounded run against a real router subprocess (issue 12, acceptance item 2)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from benchmarks import fuzz_inputs as fi
from benchmarks import fuzz_router as fz
from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol import native as wire
from gossiprouter.protocol.errors import ProtocolError
from gossiprouter.protocol.jgroups_reader import encode_utf


def _decode(proto: str, data: bytes) -> list[object]:
    """What the router's own decoder makes of an input (stops at the first error)."""
    out: list[object] = []
    try:
        if proto == "native":
            assert data.startswith(wire.PREAMBLE)
            nd = wire.Decoder()
            nd.feed(data[len(wire.PREAMBLE):])
            while (f := nd.next_frame()) is not None:
                out.append(f)
        elif proto == "jgroups2":
            d2 = j2.Decoder(max_frame=64 << 20)
            d2.feed(data)
            while (e := d2.next_event()) is not None:
                out.append(e)
        else:
            d5 = j5.Decoder(max_frame=64 << 20)
            d5.feed(data)
            while (e5 := d5.next_event()) is not None:
                out.append(e5)
    except ProtocolError:
        pass
    return out


def _unwritable(s: str | None, prefix: int = 0) -> bool:
    """True if ``s`` cannot be written back with writeUTF (with ``prefix`` more bytes)."""
    if s is None:
        return False
    try:
        return len(encode_utf(s)) - 2 + prefix > 0xFFFF
    except ProtocolError:
        return True


def test_corpus_registers_names_that_cannot_be_written_back_then_queries() -> None:
    """Every run starts with registrations the router accepts but cannot write back in a
    member reply (raw NULs, the 5.x all-groups prefix), followed by the query: issue 12
    item 1 is reachable on both JGroups protocols however short the run."""
    reached: set[str] = set()
    for inp in fi.corpus(None):
        events = _decode(inp.proto, b"".join(inp.chunks))
        if inp.proto == "jgroups2":
            regs = [e for e in events if isinstance(e, j2.Connect)
                    and (_unwritable(e.name) or _unwritable(e.group))]
            if regs and isinstance(events[-1], j2.GossipGet):
                reached.add(inp.proto)
        elif inp.proto == "jgroups5":
            regs5 = [e for e in events if isinstance(e, j5.Register)
                     and (_unwritable(e.name) or _unwritable(e.group, prefix=3))]
            if regs5 and any(isinstance(e, j5.GetMembers) and e.group is None for e in events):
                reached.add(inp.proto)
        else:
            # Native: names far beyond anything JGroups can carry, then GET_MEMBERS.
            big = [f for f in events if isinstance(f, wire.Connect)
                   and f.name is not None and len(f.name) >= 1 << 20]
            if big and isinstance(events[-1], wire.GetMembers):
                reached.add(inp.proto)
    assert reached == {"native", "jgroups2", "jgroups5"}


def test_random_inputs_cover_every_protocol_and_mutation() -> None:
    rng = random.Random(7)
    inputs = [fi.make_input(rng, None) for _ in range(600)]
    assert {i.proto for i in inputs} == set(fi.PROTOCOLS)
    kinds = {i.mutation.split(" x")[0] for i in inputs}
    assert kinds >= {"valid", "bit flips", "truncated", "length lie", "insert/delete",
                     "pipelined flood", "partial frame left open", "byte by byte",
                     "split writes", "random bytes", "valid then reset"}
    assert any(i.mutation.startswith("then ") for i in inputs)
    assert any(i.keep_open for i in inputs)
    # Same seed, same inputs: a reported crash can be replayed.
    again = random.Random(7)
    assert [fi.make_input(again, None).chunks for _ in range(50)] == [
        i.chunks for i in inputs[:50]]


def test_loss_and_crash_accounting(tmp_path: Path) -> None:
    h = fz.HonestResult(sent={"native-0": 5, "native-1": 3},
                        received={"native-0>native-1": {0, 1, 2, 4},
                                  "native-1>native-0": {0, 1, 2}})
    assert h.lost() == {"native-0>native-1": 1}
    out = fz.Outcome(honest=h)
    assert out.lost == 1 and not out.ok()
    h.received["native-0>native-1"].add(3)
    assert out.lost == 0 and out.ok()
    h.errors.append("native-0: the router closed the connection")
    assert not out.ok()  # an honest member cut off is a failure even without a loss
    h.errors.clear()
    out.tracebacks = 1
    assert out.crashes == 1 and not out.ok()
    out.tracebacks, out.router_exit = 0, 1
    assert out.crashes == 1 and not out.ok()
    assert not fz.Outcome(honest=None).ok()  # no report from the honest side is a failure

    log = tmp_path / "router.log"
    log.write_text(
        "2026 INFO gossiprouter: listening\n"
        "  + Exception Group Traceback (most recent call last):\n"
        "  |   File \"x.py\", line 1, in f\n"
        "  | ExceptionGroup: Exceptions from Trio nursery (1 sub-exception)\n"
        "    +-+---------------- 1 ----------------\n"
        "      | Traceback (most recent call last):\n"
        "      |   File \"y.py\", line 2, in g\n"
        "      | gossiprouter.protocol.errors.ProtocolError: string too long for writeUTF\n")
    n, first = fz._log_tracebacks(log)
    assert n == 1
    assert first == "gossiprouter.protocol.errors.ProtocolError: string too long for writeUTF"


@pytest.mark.slow
@pytest.mark.parametrize("auth", [False, True], ids=["default", "tokens"])
def test_short_fuzz_run_no_crash_no_honest_loss(tmp_path: Path, auth: bool) -> None:
    """The CI version of ``scripts/fuzz``: a few seconds on a fixed seed. The corpus at the
    start of every run includes the names of issue 12 item 1, so this fails while the router
    can still be crashed by them."""
    out = fz.run(6.0, seed=12, auth=auth, workdir=tmp_path, say=lambda _: None)
    report = fz.report(out, 6.0, 12, auth)
    assert out.inputs >= len(fi.corpus(None)), report
    assert set(out.by_proto) == set(fi.PROTOCOLS), report
    assert out.honest is not None, report
    assert len(out.honest.sent) == 6 and all(n > 50 for n in out.honest.sent.values()), report
    assert out.crashes == 0, report
    assert out.lost == 0 and not out.honest.errors, report
    assert out.rss_before > 0 and out.rss_peak >= out.rss_before, report
