"""The audit on a real Spark standalone cluster: a master and one worker started from the
PySpark install (``bin/spark-class``) on 127.0.0.1, and ``gossiprouter analyze --master
spark://127.0.0.1:PORT`` in its own process (so its driver is a new JVM and its work is
done by an executor the worker launches, not in the driver as with ``local[*]``).

The run is the hand-made one of tests/audit_runs.py (155 records): the audit must find
the same faults as tests/test_audit.py's test_delivery_audit does on ``local[2]``. Every
wait is bounded; the master and the worker are stopped at the end whatever happened.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gossiprouter.analytics.report.verdict import EXIT_LOSS
from tests.audit_runs import build_run
from tests.procs import free_port, wait_listening

LOOPBACK = "127.0.0.1"
START_TIMEOUT = 90.0  # the master's and the worker's JVM start, on a loaded machine
ANALYZE_TIMEOUT = 300.0


def _spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # Every Spark service binds to loopback only (and takes its defaults from no
    # conf directory of the machine's).
    env.update({"SPARK_LOCAL_IP": LOOPBACK, "SPARK_MASTER_HOST": LOOPBACK,
                "SPARK_NO_DAEMONIZE": "1", "SPARK_CONF_DIR": "/nonexistent"})
    env.pop("SPARK_HOME", None)
    return env


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


def _wait_for_line(log: Path, needle: str, proc: subprocess.Popen[bytes],
                   timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while needle not in log.read_text(errors="replace"):
        if proc.poll() is not None:
            raise RuntimeError(f"exited with status {proc.returncode}: {log.read_text()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {needle!r} in {log} within {timeout:g} s")
        time.sleep(0.2)


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[str]:
    """A standalone master and one worker (1 core, 1 GiB) on 127.0.0.1: the master URL."""
    port, ui, worker_ui = free_port(), free_port(), free_port()
    env = _env()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        master_log = tmp_path / "master.log"
        with open(master_log, "wb") as out:
            master = subprocess.Popen(
                [str(_spark_class()), "org.apache.spark.deploy.master.Master",
                 "--host", LOOPBACK, "--port", str(port), "--webui-port", str(ui)],
                stdout=out, stderr=subprocess.STDOUT, env=env)
        procs.append(master)
        wait_listening(port, master, timeout=START_TIMEOUT)
        url = f"spark://{LOOPBACK}:{port}"
        with open(tmp_path / "worker.log", "wb") as out:
            worker = subprocess.Popen(
                [str(_spark_class()), "org.apache.spark.deploy.worker.Worker",
                 "--host", LOOPBACK, "--webui-port", str(worker_ui), "--cores", "1",
                 "--memory", "1g", "--work-dir", str(tmp_path / "work"), url],
                stdout=out, stderr=subprocess.STDOUT, env=env)
        procs.append(worker)
        _wait_for_line(master_log, "Registering worker", master, START_TIMEOUT)
        yield url
    finally:
        for p in reversed(procs):
            _stop(p)


@pytest.mark.spark
def test_audit_on_a_standalone_master_with_a_worker(standalone: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    build_run(run)
    result = subprocess.run(
        [sys.executable, "-m", "gossiprouter", "analyze", str(run), "--master", standalone,
         "--conf", "spark.executor.memory=512m", "--conf", "spark.cores.max=1"],
        capture_output=True, text=True, timeout=ANALYZE_TIMEOUT, env=_env(), check=False)
    # The hand-made run has losses: the LOSS exit status, with the report written.
    assert result.returncode == EXIT_LOSS, result.stderr[-3000:]
    report = json.loads((run / "report" / "report.json").read_text())
    assert report["spark_master"] == standalone
    audit = report["audit"]
    # The same figures as test_delivery_audit on local[2].
    assert audit["expected"] == 120 and audit["delivered"] == 114
    assert audit["lost"]["count"] == 6
    assert [(s["msg_id"], s["receiver"]) for s in audit["lost"]["sample"]] == [
        ("a/2", "d"), ("a/3", "c"), ("a/7", "b"), ("a/15", "e"), ("a/16", "e"), ("x/2", "y")]
    assert audit["duplicated"]["count"] == 2 and audit["duplicate_copies"] == 3
    assert audit["out_of_order"]["count"] == 2
    assert [(s["msg_id"], s["after_seq"]) for s in audit["out_of_order"]["sample"]] == [
        ("a/11", 12), ("a/25", 27)]
    assert audit["undetermined"]["count"] == 3 and audit["unexpected"]["count"] == 1
    assert report["counts"]["records"] == 155
