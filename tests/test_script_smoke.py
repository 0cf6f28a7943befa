"""Every script in scripts/ and every benchmark in benchmarks/ runs to its end, with tiny
sizes (issue 25, item 22): a change to what they call (the report's format, a function's
name) breaks this test, not the next person who runs the script for its figures.

SMOKE lists one entry per file; a new script or benchmark without an entry fails
:func:`test_every_script_and_benchmark_has_a_smoke_entry`. An entry is either the argument
list of a short run (the file runs as a user would start it, from the repository) or, for
a file another entry or test already runs, the reason (``RunBy``). Adding one is one line.

The smoke runs do not depend on the fast path's mode, so they are marked ``one_pass``: they
run in the first of the suite's two passes (scripts/test) only.
"""

from __future__ import annotations

import importlib.machinery
import os
import re
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.one_pass  # see tests/conftest.py


@dataclass(frozen=True)
class RunBy:
    """Not run here: ``why`` names what runs it already."""

    why: str


# The file (relative to the repository) -> its arguments for a run of a few seconds.
SMOKE: dict[str, tuple[str, ...] | RunBy] = {
    "scripts/bench": ("--seconds", "0.3", "--cases", "fanout-100"),
    "scripts/bench-analyze": ("--messages-per-sender", "10"),
    "scripts/bench-hostile": ("--rtt-seconds", "0.3", "--flood-rate", "65536",
                              "--partial-conns", "2", "--partial-size", "65536", "--settle",
                              "0.2", "--groups", "200", "--group-conns", "1"),
    "scripts/bench-vs-jgroups": ("--runs", "1", "--seconds", "0.5", "--warmup", "0.3",
                                 "--cases", "unicast-100"),
    "scripts/example-config": RunBy("tests/test_packaging.py (--check)"),
    "scripts/fuzz": ("--seconds", "2", "--seed", "1"),
    "scripts/run": RunBy("tests/test_cli_ux.py (--help, a taken port) and "
                         "tests/test_scripts.py (a fresh copy, listening)"),
    "scripts/setup": ("--router",),
    "scripts/test": RunBy("it runs this suite"),
    "scripts/sanitize": RunBy("run whole by scripts/test, beside this suite (CI's sanitizer jobs)"),
    "benchmarks/bench_admin_stall.py": ("--groups", "200"),
    "benchmarks/bench_connect_limits.py": ("--count", "200"),
    "benchmarks/bench_fairness.py": ("--seconds", "0.3", "--flood", "ping"),
    "benchmarks/bench_hostile.py": RunBy("scripts/bench-hostile"),
    "benchmarks/bench_hotloop.py": ("--seconds", "0.1"),
    "benchmarks/bench_jgroups_hotloop.py": ("--seconds", "0.1"),
    "benchmarks/bench_lightpath.py": ("-n", "200", "--repeat", "1"),
    "benchmarks/bench_partial_frames.py": ("--rounds", "1", "--connections", "2"),
    "benchmarks/bench_router.py": RunBy("scripts/bench"),
    "benchmarks/bench_topics.py": ("--subscribers", "20", "--messages", "50"),
    "benchmarks/bench_vs_jgroups.py": RunBy("scripts/bench-vs-jgroups"),
    "benchmarks/fuzz_router.py": RunBy("scripts/fuzz"),
    "benchmarks/bench_fastpath_churn.py": RunBy("tests/test_bench_fastpath_churn.py"),
    "benchmarks/bench_federation.py": RunBy("tests/test_bench_federation.py"),
    "benchmarks/bench_federation_membership.py": ("--members", "30", "--rate", "300"),
    "benchmarks/bench_idle.py": ("--seconds", "0.5", "--settle", "0.5", "--routers", "2"),
    "benchmarks/bench_federation_floor.py": RunBy("tests/test_bench_federation_floor.py"),
    "benchmarks/bench_stub_loops.py": RunBy("tests/test_bench_stub_loops.py"),
    "benchmarks/bench_stalled_member.py": RunBy("nothing: it needs a JGroups 5.x build, which "
                                                "scripts/setup does not install (only 2.12); "
                                                "docs/performance.md has its run"),
    "benchmarks/bench_fastpath_memory.py": RunBy("tests/test_bench_fastpath_memory.py (--quick)"),
    "benchmarks/relay_harness.py": RunBy("tests/test_relay_harness.py, and scripts/test's "
                                         "sanitizer jobs"),
    "benchmarks/relay_build.py": RunBy("a module: scripts/sanitize builds with it"),
    "benchmarks/relay_check.py": RunBy("a module: relay_harness.py runs on it"),
    "benchmarks/relay_model.py": RunBy("a module: relay_harness.py runs on it"),
    "benchmarks/routers.py": RunBy("a module: bench_fastpath_memory.py, bench_fairness.py and "
                                   "bench_admin_stall.py run on it"),
    "benchmarks/fuzz_inputs.py": RunBy("a module: fuzz_router.py runs on it"),
    "benchmarks/federation_mix.py": RunBy("a module: bench_federation.py's interleaved, burst "
                                          "and local-only cases"),
    "benchmarks/vs_jgroups_load.py": RunBy("a module: bench_vs_jgroups.py and bench_lightpath.py "
                                           "run on it"),
    "benchmarks/vs_jgroups_procs.py": RunBy("a module: bench_vs_jgroups.py runs on it"),
    "benchmarks/vs_jgroups_tables.py": RunBy("a module: bench_vs_jgroups.py prints with it"),
    "benchmarks/machine.py": RunBy("a module: bench_vs_jgroups.py and bench_federation.py hold "
                                   "the CPU latency request with it"),
    "benchmarks/profiling.py": RunBy("a module: bench_hotloop.py and bench_jgroups_hotloop.py "
                                     "run on it"),
    "benchmarks/figures.py": RunBy("a module: bench_federation.py, bench_federation_floor.py "
                                   "and bench_hostile.py print their percentiles with it"),
}
# Run in this process, on the module's local Spark (one JVM start for all of them).
ON_SPARK = {"scripts/bench-analyze"}


def shipped() -> set[str]:
    """The scripts (executable files directly in scripts/) and the benchmarks."""
    scripts = {f"scripts/{p.name}" for p in (REPO / "scripts").iterdir()
               if p.is_file() and os.access(p, os.X_OK)}
    benchmarks = {f"benchmarks/{p.name}" for p in (REPO / "benchmarks").glob("*.py")
                  if p.name != "__init__.py"}
    return scripts | benchmarks


def test_every_script_and_benchmark_has_a_smoke_entry() -> None:
    files = shipped()
    assert sorted(files - set(SMOKE)) == [], "add a smoke entry (SMOKE) for each"
    assert sorted(set(SMOKE) - files) == [], "a smoke entry for a file that is gone"
    for name, entry in SMOKE.items():
        if isinstance(entry, RunBy) and entry.why.startswith(("scripts/", "benchmarks/")):
            assert isinstance(SMOKE.get(entry.why), tuple), f"{name}: {entry.why} is not run"


def _command(name: str) -> list[str]:
    if name.endswith(".py"):
        return [sys.executable, name]
    return [str(REPO / name)]


@pytest.mark.parametrize("name", [n for n, e in SMOKE.items()
                                  if isinstance(e, tuple) and n not in ON_SPARK])
def test_smoke_run(name: str) -> None:
    args = SMOKE[name]
    assert isinstance(args, tuple)
    r = subprocess.run([*_command(name), *args], cwd=REPO, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=600)
    assert r.returncode == 0, (f"{name} {' '.join(args)}: exit {r.returncode}\n"
                               f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


@pytest.mark.spark
@pytest.mark.parametrize("name", sorted(ON_SPARK))
def test_smoke_run_on_spark(name: str, spark: SparkSession,
                            capsys: pytest.CaptureFixture[str]) -> None:
    """A Spark script's main(argv) joins the running Spark (and leaves it running)."""
    args = SMOKE[name]
    assert isinstance(args, tuple)
    loader = importlib.machinery.SourceFileLoader(Path(name).name.replace("-", "_"),
                                                  str(REPO / name))
    module = types.ModuleType(loader.name)
    module.__file__ = str(REPO / name)
    # Registered while it runs: its dataclasses look their module up there.
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, loader.name, module)
        loader.exec_module(module)
        assert module.main(list(args)) == 0, capsys.readouterr()
    assert re.search(r"^exact faults found +yes$", capsys.readouterr().out, re.M)
    assert not spark.sparkContext._jsc.sc().isStopped()
