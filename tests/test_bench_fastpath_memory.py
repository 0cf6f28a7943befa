"""benchmarks/bench_fastpath_memory.py runs (its bounded smoke size, one case, one router
process): the figures themselves are for docs/performance.md, not for a test."""

from __future__ import annotations

import pytest

from benchmarks import bench_fastpath_memory as bench


def test_the_memory_benchmark_runs_its_smoke_size(capsys: pytest.CaptureFixture[str]) -> None:
    bench.main(["--quick", "--cases", "multicast-relayed", "--paths", "on"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("case") and len(out) == 2
    assert out[1].startswith("the same, fast_path_max_bytes 1 GiB") and "MiB" in out[1]
