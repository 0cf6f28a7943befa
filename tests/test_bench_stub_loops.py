"""benchmarks/bench_stub_loops.py runs tiny (the stub on every loop through one router), so
the benchmark keeps working; its figures are not checked here."""

from __future__ import annotations

import subprocess
import sys

from benchmarks import bench_stub_loops as bench


def test_the_benchmark_runs_tiny_on_every_loop() -> None:
    out = subprocess.run(
        [sys.executable, "benchmarks/bench_stub_loops.py", "--messages", "100", "--warmup",
         "20", "--repeat", "1", "--window", "16"],
        cwd=bench.REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ")][1:]
    assert {(r.split("|")[1].strip(), r.split("|")[2].strip()) for r in rows} == {
        (case, loop) for case in bench.CASES for loop in bench.loops_available()}


def test_bad_sizes_are_one_line() -> None:
    out = subprocess.run([sys.executable, "benchmarks/bench_stub_loops.py", "--messages", "0"],
                         cwd=bench.REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--messages must be at least 1" in out.stderr
    assert "Traceback" not in out.stderr
