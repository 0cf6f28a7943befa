"""The fast path's differential harness (benchmarks/relay_harness.py), short and bounded: the
compiled relay thread and the pure path decide every stream alike, for all three framings
(scripts/sanitize runs it longer under ASAN+UBSAN and TSAN builds)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from benchmarks import relay_harness as rh
from gossiprouter.server import fastpath

REPO = Path(__file__).resolve().parent.parent


def test_the_relay_and_the_pure_path_agree_on_every_stream() -> None:
    assert fastpath._relay is not None, "the compiled extension is not built (scripts/setup)"
    stats = rh.run(seed=24, steps=200, seconds=60, say=lambda s: None)
    # It exercised what it is for: cuts at every offset, both halves routing, evictions
    # handed to the queue, hostile frames, direct sends from threads, reopened fds.
    assert stats["cuts swept"] > 100
    assert stats["frames relayed by the thread"] > 0
    assert stats["frames routed by Python"] > 0
    assert stats["hostile frames"] > 0
    assert stats["direct sends from threads"] > 0
    assert stats["fds reused"] > 0
    assert stats["evictions"] > 0


def test_the_relay_agrees_while_connections_move_between_threads() -> None:
    """The same checks with four worker threads (relay/workers.c): connections promoted to a
    thread of their own at their first read, and given back when quiet (after 5 ms), while
    frames are checked."""
    assert fastpath._relay is not None, "the compiled extension is not built (scripts/setup)"
    stats = rh.run(seed=24, steps=200, seconds=60, say=lambda s: None, threads=4,
                   promote_reads=1)
    assert stats["worker threads"] == 4
    assert stats["promotions to a worker"] > 10
    assert stats["frames relayed by the thread"] > 0
    assert stats["frames checked at receivers"] > 1000


def test_a_violation_is_reported_with_its_seed() -> None:
    """The check bites: a receiver that is sent a frame nobody routed fails the step."""
    h = rh.Harness(1)
    h.start()
    try:
        r = h.receivers[0]
        h._push(r, b"\0\0\0\1x")
        try:
            h.settle("a stray frame")
        except rh.Violation as e:
            assert "not the next frame of any source" in str(e)
        else:
            raise AssertionError("a stray frame passed the receiver-side check")
    finally:
        h.close()


def test_a_relay_module_that_does_not_load_is_one_error_line(tmp_path: Path) -> None:
    """GOSSIPROUTER_RELAY_SO (the sanitized builds) that cannot load: the router says why in
    one line instead of running the pure path unnoticed."""
    env = dict(os.environ, GOSSIPROUTER_RELAY_SO=str(tmp_path / "missing.so"))
    env.pop("GOSSIPROUTER_FAST_PATH", None)
    p = subprocess.run([sys.executable, "-m", "gossiprouter", "serve", "--port", "0"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p
    assert p.stderr.startswith("gossiprouter: error: GOSSIPROUTER_RELAY_SO="), p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr


def test_sanitize_refuses_a_bad_option_in_one_line() -> None:
    for args, what in ((["--bogus"], "unknown option --bogus"),
                       (["--seconds", "soon"], "--seconds soon: expected a number")):
        p = subprocess.run([str(REPO / "scripts" / "sanitize"), *args], capture_output=True,
                           text=True, timeout=30)
        assert p.returncode == 2 and what in p.stderr, p
        assert len(p.stderr.splitlines()) == 1, p.stderr
