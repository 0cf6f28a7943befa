"""Tests of the load-test analysis: the Spark delivery audit, the report files and the CLI.

A small run is built by hand with the real writers (tests/audit_runs.py), with known faults:
lost, duplicated and reordered deliveries, a member that leaves mid-run, one that is killed, one
that joins late, a message whose send record is missing and a delivery to a non-member. All
Spark tests share one local Spark session (module-scoped) so the module takes seconds rather
than minutes.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from gossiprouter.analytics.audit import (
    AuditInputError,
    analyze,
    loopback_master,
    session_settings,
)
from gossiprouter.analytics.cli import (
    EXIT_FAILED,
    EXIT_INCOMPLETE,
    EXIT_INPUT,
    EXIT_LOSS,
    EXIT_THRESHOLD,
    analyze_command,
)
from gossiprouter.analytics.latency import size_labels
from gossiprouter.analytics.report.baseline import load_baseline
from gossiprouter.analytics.report.model import Report
from gossiprouter.analytics.spark_io import HadoopFs, _log_cause
from gossiprouter.analytics.timeline import membership_intervals
from gossiprouter.loadtest.records import (
    MEMBERSHIP_SCHEMA,
    RECORD_SCHEMA,
    RecordWriter,
)
from tests.audit_runs import LATENCY, MS, SLOW_LATENCY, T0, S, build_run, run_fixture
from tests.chromium import Browser, find_chromium
from tests.procs import free_port

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

run_dir = run_fixture("run", build_run)


@pytest.fixture(scope="module")
def report(spark: SparkSession, run_dir: Path) -> Report:
    return analyze(str(run_dir), str(run_dir / "report"), spark=spark)


def test_writer_files_have_the_schema(run_dir: Path) -> None:
    files = sorted((run_dir / "records").glob("*.parquet"))
    assert len(files) > 8  # batch_rows=10: several files per process
    for f in files:
        assert pq.read_schema(f).equals(RECORD_SCHEMA, check_metadata=False)
    assert not list((run_dir / "records").glob(".*"))  # no temporary files left behind
    timeline = pq.read_table(run_dir / "membership.parquet")
    assert timeline.schema.equals(MEMBERSHIP_SCHEMA, check_metadata=False)
    assert timeline.num_rows == 10


def test_record_writer_flushes_by_batch_and_time(tmp_path: Path) -> None:
    now = [0]
    w = RecordWriter(tmp_path, run="r", proc=1, batch_rows=3, clock=lambda: now[0])
    assert w.send("p1", 0, "g", 10) == "p1/0"
    w.send("p1", 1, "g", 10, dest="p2")
    assert w.buffered == 2 and not w.files
    w.recv("p2", 0, "g", "p1", 10, 5)
    assert w.buffered == 0 and len(w.files) == 1
    w.send("p1", 2, "g", 10)
    w.close()
    assert len(w.files) == 2
    rows = pq.read_table(w.files[0]).to_pylist()
    assert [r["cast"] for r in rows] == ["multicast", "unicast", "multicast"]
    assert rows[1]["dest"] == "p2" and rows[2]["receiver"] == "p1"
    assert rows[2]["t_recv_ns"] == 0 and rows[2]["t_send_ns"] == 5
    with pytest.raises(ValueError):
        w.send("p1", 3, "g", 10)
    eager = RecordWriter(tmp_path / "eager", run="r", proc=2, flush_interval_s=0.0)
    eager.send("p2", 0, "g", 10)
    assert len(eager.files) == 1 and eager.buffered == 0


def test_membership_intervals() -> None:
    intervals, warnings = membership_intervals([
        (10, "g", "m", "join"),
        (20, "g", "m", "leave"),
        (20, "g", "m", "join"),  # rejoin at the same instant: one continuous membership
        (30, "g", "m", "leave"),
        (40, "g", "m", "join"),
        (50, "g", "k", "killed"),  # never joined
        (5, "g", "s", "join"),
    ])
    by_member = {(i.member, i.start_ns): i for i in intervals}
    assert set(by_member) == {("m", 10), ("m", 40), ("s", 5)}
    assert by_member["m", 10].end_ns == 30 and by_member["m", 10].next_start_ns == 40
    assert by_member["m", 40].end_ns is None and by_member["m", 40].status == "left"
    assert by_member["s", 5].status == "stayed"
    assert len(warnings) == 1 and "k killed g" in warnings[0]


@pytest.mark.spark
def test_delivery_audit(report: Report) -> None:
    c, a = report.counts, report.audit
    assert report.runs == ["unit-run"]
    assert report.manifest == {"scenario": "unit", "peers": 7}
    assert (c.records, c.send_records, c.recv_records) == (155, 36, 119)
    assert (c.messages, c.messages_without_send_record, c.deliveries) == (37, 1, 116)
    # a's 29 multicasts: b 29 + c 29 + d 9 (seq 0..8) + e 19 (seq 0..18) + f 24 (seq 5..28);
    # e/0: a, b, c, d; x -> y: 5; y -> x: 1.
    assert a.expected == 120
    assert a.delivered == 114
    assert a.lost.count == 6
    assert [(s["msg_id"], s["receiver"]) for s in a.lost.sample] == [
        ("a/2", "d"), ("a/3", "c"), ("a/7", "b"), ("a/15", "e"), ("a/16", "e"), ("x/2", "y")]
    assert [s["receiver_status"] for s in a.lost.sample] == [
        "left", "stayed", "stayed", "killed", "killed", "stayed"]
    # No router restart: every loss happened while sender and receiver were registered,
    # including those to d (which left later) and e (killed later).
    assert a.lost_registered.count == 6 and a.lost_reconnect.count == 0
    assert (a.lost_to_left, a.lost_to_killed) == (1, 2)
    # Sample times are seconds since the start of the run (its first send, at 1 s).
    assert [s["t_send_s"] for s in a.lost.sample] == [2.0, 3.0, 7.0, 15.0, 16.0, 2.0]
    assert a.duplicated.count == 2 and a.duplicate_copies == 3
    assert [(s["msg_id"], s["receiver"], s["copies"]) for s in a.duplicated.sample] == [
        ("a/5", "b", 2), ("a/20", "c", 3)]
    assert a.out_of_order.count == 2 and a.out_of_order_pairs == 2
    assert [(s["msg_id"], s["receiver"], s["after_seq"]) for s in a.out_of_order.sample] == [
        ("a/11", "c", 12), ("a/25", "b", 27)]
    # d's a/9 (delivered), e's a/19 and f's a/4 (not delivered).
    assert (a.undetermined.count, a.undetermined_delivered) == (3, 1)
    assert sorted((s["msg_id"], s["receiver"], s["t_recv_s"] is not None)
                  for s in a.undetermined.sample) == [
        ("a/19", "e", False), ("a/4", "f", False), ("a/9", "d", True)]
    assert [(s["msg_id"], s["receiver"]) for s in a.unexpected.sample] == [("a/0", "x")]
    assert not report.ok and report.verdict.status == "LOSS"
    assert report.verdict.exit_code == EXIT_LOSS


@pytest.mark.spark
def test_latency_and_throughput(report: Report) -> None:
    lat = report.latency
    assert lat is not None
    assert lat.count == 116
    # The reordered a/25 reaches b after a/27, sent two seconds later.
    assert lat.p50_ns == LATENCY and lat.max_ns == 2 * S + 2 * MS
    assert report.latency_by_cast["unicast"].count == 5
    assert report.latency_by_cast["unicast"].max_ns == SLOW_LATENCY
    assert set(report.latency_by_group) == {"g1", "g2"}
    assert report.latency_by_group["g2"].count == 5
    assert list(report.latency_by_size) == ["100", "1000"]
    assert report.latency_by_size["1000"].count == 5
    assert sum(report.latency_histogram.counts) == 116
    assert len(report.latency_histogram.edges_ns) == len(report.latency_histogram.counts) + 1
    tp = report.throughput
    assert [b.t_s for b in tp] == list(range(len(tp)))
    assert sum(b.sends for b in tp) == 37
    assert sum(b.deliveries for b in tp) == 116
    assert sum(b.lost for b in tp) == 6
    assert tp[0].sends == 2  # a/0 and x/0, both at 1 s, the first send
    # No manifest t0: the run spans the first send (1 s) to the last receive (29.001 s);
    # its last second is covered only for a millisecond, every other one fully.
    assert [b.covered_s for b in tp[:-1]] == [1.0] * (len(tp) - 1)
    assert 0 < tp[-1].covered_s < 0.01
    # Latency over time, by send second: a/25 (sent at 26 s, second 25) arrived late.
    slow = {p.t_s: p for p in report.latency_over_time}
    assert sum(p.count for p in report.latency_over_time) == 116
    assert slow[25].max_ns == 2 * S + 2 * MS and slow[25].p50_ns == LATENCY
    assert slow[4].max_ns == SLOW_LATENCY  # x/4, sent at 5 s
    # Each second's p95 too (report.html's p95 line), between its p50 and its max.
    assert all(p.p95_ns is not None and p.p50_ns <= p.p95_ns <= p.max_ns
               for p in report.latency_over_time)
    # Breakdowns by group: g2 is x and y (5 + 1 expected, x/2 lost).
    g2 = report.by_group["g2"]
    assert (g2.sent, g2.expected, g2.delivered, g2.lost_registered) == (7, 6, 5, 1)
    assert report.by_process == {}  # the hand-made manifest lists no processes


@pytest.mark.spark
def test_report_files(report: Report, run_dir: Path) -> None:
    out = run_dir / "report"
    data = json.loads((out / "report.json").read_text())
    assert data["ok"] is False
    assert data["verdict"]["status"] == "LOSS" and data["verdict"]["exit_code"] == EXIT_LOSS
    assert data["audit"]["lost_registered"]["count"] == 6
    assert data["manifest"]["scenario"] == "unit"
    page = (out / "report.html").read_text()
    images = re.findall(r'src="data:image/(png|svg\+xml);base64,([A-Za-z0-9+/=]+)"', page)
    # latency over time, histogram, throughput, by group (no process list: no such chart);
    # the plots over the run are SVG, the others PNG
    assert [kind for kind, _ in images] == ["svg+xml", "png", "svg+xml", "png"]
    for kind, img in images:
        assert base64.b64decode(img).startswith(
            b"\x89PNG\r\n\x1a\n" if kind == "png" else b"<?xml")
    assert "a/3" in page  # the samples are in the page


@pytest.mark.spark
def test_cli_exit_codes(spark: SparkSession, run_dir: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "cli-report"
    result = runner.invoke(analyze_command, [str(run_dir), "--out", str(out)])
    assert result.exit_code == EXIT_LOSS, result.output
    # Every phase with the time since the start, the driver's address, then the durations.
    assert re.search(r"^\[\s*\d+\.\d s\] reading records…$", result.stderr, re.M)
    assert re.search(r"^\[\s*\d+\.\d s\] auditing…$", result.stderr, re.M)
    assert re.search(r"Spark driver at 127\.0\.0\.1:\d+ \(loopback", result.stderr)
    assert re.search(r"done: Spark start \d+\.\d s, reading \d+\.\d s, audit \d+\.\d s, "
                     r"figures \d+\.\d s, order \d+\.\d s, summary \d+\.\d s, "
                     r"report \d+\.\d s; total \d+\.\d s", result.stderr)
    assert re.search(r"lost while registered\s+6\s+\(sender and receiver both registered; "
                     r"of which to receivers that later left 1, later killed 2\)", result.stdout)
    assert re.search(r"verdict\s+LOSS: 6 deliveries lost while the sender and the receiver "
                     r"were both registered$", result.stdout, re.M)
    # (The prefix is matched loosely: the CLI's error prefix is shared with other commands.)
    assert re.fullmatch(r"gossiprouter: error: 6 deliveries lost while the sender and the "
                        r"receiver were both registered \(see the report; --allow-loss to "
                        r"accept\)", result.stderr.strip().splitlines()[-1])
    assert (out / "report.html").exists()


@pytest.mark.spark
def test_cli_allow_loss_settle_and_sample(
    spark: SparkSession, run_dir: Path, report: Report, tmp_path: Path,
) -> None:
    out = tmp_path / "settle0"
    # Compared with the same run at the default settle window (the report fixture's).
    result = CliRunner().invoke(analyze_command, [
        str(run_dir), "--out", str(out), "--allow-loss", "--settle", "0", "--sample", "2",
        "--baseline", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert f"compared with the baseline unit-run ({run_dir}/report/report.json):" in \
        result.stdout
    assert re.search(r"^verdict\s+LOSS\s+LOSS ACCEPTED\s+changed$", result.stdout, re.M)
    assert re.search(r"^lost\s+6\s+7\s+\+1 \(\+16\.7 %\)$", result.stdout, re.M)
    assert re.search(r"^deliveries expected\s+120\s+122\s+\+2 \(\+1\.7 %\)$", result.stdout,
                     re.M)
    # (the last column: the noise hint, "same" for an unchanged figure)
    assert re.search(r"^latency p50 \(ms\)\s+1\.00\s+1\.00\s+same\s+same$", result.stdout,
                     re.M)
    a = json.loads((out / "report.json").read_text())["audit"]
    # With no settle window nothing is undetermined: a/9, sent the instant d left, was due
    # to d (and delivered); a/19, sent the instant e was killed, was due to e and is lost;
    # a/4, sent before f joined, was not due to f.
    assert (a["undetermined"]["count"], a["undetermined_delivered"]) == (0, 0)
    assert (a["expected"], a["delivered"]) == (122, 115)
    assert (a["lost"]["count"], a["lost_to_killed"]) == (7, 3)
    assert a["lost_registered"]["count"] == 7
    assert [(s["msg_id"], s["receiver"]) for s in a["lost"]["sample"]] == [
        ("a/2", "d"), ("a/3", "c")]
    assert len(a["lost_registered"]["sample"]) == 2
    # --allow-loss turns the verdict into LOSS ACCEPTED (exit 0), never plain LOSS.
    verdict = json.loads((out / "report.json").read_text())["verdict"]
    assert verdict["status"] == "LOSS ACCEPTED" and verdict["exit_code"] == 0
    assert re.search(r"^verdict\s+LOSS ACCEPTED: 7 deliveries lost .*\(accepted with "
                     r"--allow-loss\)$", result.stdout, re.M)


@pytest.mark.spark
def test_hadoop_filesystem_io(spark: SparkSession, tmp_path: Path) -> None:
    # The code path used for non-local URIs (hdfs://, s3a://), exercised on file: URIs.
    fs = HadoopFs(spark)
    uri = f"file://{tmp_path}/sub/report.json"
    assert not fs.exists(uri)
    fs.write_bytes(uri, b'{"x": 1}')
    assert (tmp_path / "sub" / "report.json").read_bytes() == b'{"x": 1}'
    assert fs.exists(uri) and fs.read_bytes(uri) == b'{"x": 1}'
    assert fs.names(f"file://{tmp_path}/sub") == ["report.json"]


def test_cli_input_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(analyze_command, [str(tmp_path / "nope")])
    assert result.exit_code == EXIT_INPUT
    assert result.output.strip() == (
        f"gossiprouter: error: run directory {tmp_path / 'nope'} does not exist")
    assert not (tmp_path / "nope").exists()
    (tmp_path / "empty" / "records").mkdir(parents=True)
    result = runner.invoke(analyze_command, [str(tmp_path / "empty")])
    assert result.exit_code == EXIT_INPUT
    assert result.output.startswith("gossiprouter: error: no records in ")
    assert len(result.output.strip().splitlines()) == 1
    with pytest.raises(AuditInputError):
        analyze(str(tmp_path / "empty"), str(tmp_path / "out"))
    # A baseline that was never analysed fails before Spark starts, in one line.
    result = runner.invoke(analyze_command, [str(tmp_path / "empty"), "--baseline",
                                             str(tmp_path / "empty")])
    assert result.exit_code == EXIT_INPUT
    assert result.output.strip() == (
        f"gossiprouter: error: --baseline {tmp_path / 'empty'}: no report.json there or in "
        f"{tmp_path / 'empty'}/report (run `gossiprouter analyze {tmp_path / 'empty'}` first)")


# --------------------------------------------------------------------------- run variants


def _variant(src: Path, dst: Path, manifest: dict[str, object]) -> Path:
    """The hand-made run with another manifest."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("report"))
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


# A complete manifest as the driver writes it: t0 at 0 s, the router restarted at 2.5 s
# (down until every member was registered again at 3.5 s), processes and their counters.
RESTART_MANIFEST: dict[str, object] = {
    "format": "gossiprouter-loadtest-run/1", "run": "unit-run", "scenario": "unit-restart",
    "scenario_config": {"name": "unit-restart", "description": "hand-made, one restart",
                        "duration": 29.0, "drain": 1.0,
                        "groups": [{"name": "g1", "members": 6, "rate": 1.0, "sizes": [100],
                                    "unicast": 0.0},
                                   {"name": "g2", "members": 2, "rate": 1.0, "sizes": [1000],
                                    "unicast": 1.0}],
                        "events": [], "thresholds": {"max_ms": 5000.0}},
    "router": {"address": "127.0.0.1:1", "spawned": True},
    "processes": [{"proc": 0, "members": ["a", "b", "c"]}, {"proc": 1, "members": ["d", "e", "f"]},
                  {"proc": 2, "members": ["x", "y"]}],
    "status": "ok", "t0_ns": T0,
    "events": [{"at": 2.5, "action": "restart-router", "what": "restart router",
                "t_ns": T0 + 5 * S // 2, "up_ns": T0 + 3 * S, "registered_ns": T0 + 7 * S // 2}],
    "host": {"hostname": "unit", "platform": "Linux", "cores": 2, "memory_bytes": 8 << 30},
    "resources": {"cores": 2, "interval_s": 1.0,
                  "router_settings": {"fast_path": "on", "dispatcher": "on"},
                  "samples": [{"t_s": float(t), "load1": 0.5 + t / 10, "processes": {
                      "router": {"cpu_s": 0.2 * t, "rss_bytes": (40 + t) << 20},
                      "p0": {"cpu_s": 0.1 * t, "rss_bytes": 30 << 20}}} for t in range(30)]},
    "counters": {"p0": {"send_errors": 0, "router_errors_by_code": {"unknown_destination": 30},
                        "slots": 90, "slots_late": 2, "slots_skipped": 4,
                        "send_lag_max_s": 1.25},
                 "p2": {"send_errors": 2, "router_errors_by_code": {}}},
}


@pytest.fixture(scope="module")
def restart_run(spark: SparkSession, run_dir: Path, report: Report,
                tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Report]:
    # Compared with the plain hand-made run (the report fixture wrote its report).
    path = _variant(run_dir, tmp_path_factory.mktemp("restart") / "run", RESTART_MANIFEST)
    return path, analyze(str(path), str(path / "report"), spark=spark,
                         baseline=load_baseline(str(run_dir)))


@pytest.mark.spark
def test_losses_across_a_router_restart_are_named_so(
    restart_run: tuple[Path, Report],
) -> None:
    _, report = restart_run
    a = report.audit
    # Windows [t_send, t_send + 1 s] overlapping the outage [2.5 s, 3.5 s]: a/2 to d and
    # x/2 to y (both sent at 3 s) were lost across the reconnect; the other four were not.
    assert sorted((s["msg_id"], s["receiver"]) for s in a.lost_reconnect.sample) == [
        ("a/2", "d"), ("x/2", "y")]
    assert [(s["msg_id"], s["receiver"]) for s in a.lost_registered.sample] == [
        ("a/3", "c"), ("a/7", "b"), ("a/15", "e"), ("a/16", "e")]
    assert (a.lost.count, a.lost_registered.count, a.lost_reconnect.count) == (6, 4, 2)
    assert (a.lost_to_left, a.lost_to_killed) == (0, 2)
    # Times count from the manifest's t0: a/2 was sent at 3 s.
    assert {s["msg_id"]: s["t_send_s"] for s in a.lost_reconnect.sample}["a/2"] == 3.0
    assert [(e.t_s, e.up_s, e.end_s) for e in report.events] == [(2.5, 3.0, 3.5)]
    assert report.verdict.status == "LOSS"
    # The run lasted t0 + 29 s + 1 s drain: 30 whole seconds.
    assert len(report.throughput) == 30
    assert all(b.covered_s == 1.0 for b in report.throughput)
    p2 = report.by_process["p2"]
    assert (p2.sent, p2.lost_reconnect, p2.lost_registered) == (7, 1, 0)
    assert [(e.kind, e.count, e.by_process) for e in report.load_errors] == [
        ("router error: unknown_destination", 30, {"p0": 30}), ("send failed", 2, {"p2": 2})]


@pytest.mark.spark
def test_a_federated_router_outage_cuts_only_the_pairs_with_an_end_on_it(
    spark: SparkSession, run_dir: Path, tmp_path: Path,
) -> None:
    # The same outage, of one router of a federation that holds d (the driver lists its
    # members in the event): a/2 to d was cut by it, but x/2 to y, both on other routers
    # that stayed up, is an unexplained loss.
    manifest = dict(RESTART_MANIFEST)
    manifest["events"] = [dict(RESTART_MANIFEST["events"][0],  # type: ignore[index]
                               router=1, members=["d", "e"])]
    path = _variant(run_dir, tmp_path / "run", manifest)
    a = analyze(str(path), str(path / "report"), spark=spark).audit
    assert [(s["msg_id"], s["receiver"]) for s in a.lost_reconnect.sample] == [("a/2", "d")]
    assert ("x/2", "y") in [(s["msg_id"], s["receiver"]) for s in a.lost_registered.sample]
    assert (a.lost_registered.count, a.lost_reconnect.count) == (5, 1)


@pytest.mark.spark
def test_only_reconnect_losses_read_ok(
    spark: SparkSession, run_dir: Path, tmp_path: Path,
) -> None:
    # The router down for the whole run: every loss is across a reconnect, none
    # unexplained, and plain analyze says OK (exit 0) while naming them.
    manifest = dict(RESTART_MANIFEST)
    manifest["events"] = [{"at": 0, "action": "restart-router", "what": "restart router",
                           "t_ns": T0, "up_ns": T0 + S, "registered_ns": T0 + 40 * S}]
    path = _variant(run_dir, tmp_path / "run", manifest)
    result = CliRunner().invoke(analyze_command, [str(path)])
    assert result.exit_code == 0, result.output
    assert re.search(r"^verdict\s+OK: no delivery lost while the sender and the receiver were "
                     r"both registered; 6 deliveries lost across a reconnect \(router "
                     r"restart\), as expected$", result.stdout, re.M)
    assert "LOSS" not in result.stdout
    # The same run held to a p50 of 0.5 ms (it has 1 ms): THRESHOLD, exit 5, said last.
    config = RESTART_MANIFEST["scenario_config"]
    assert isinstance(config, dict)
    manifest["scenario_config"] = {**config, "thresholds": {"p50_ms": 0.5}}
    path = _variant(run_dir, tmp_path / "held", manifest)
    result = CliRunner().invoke(analyze_command, [str(path), "--allow-loss"])
    assert result.exit_code == EXIT_THRESHOLD, result.output
    assert result.stderr.strip().splitlines()[-1].startswith(
        "gossiprouter: error: p50 latency 1.00 ms over the threshold of 0.5 ms; no delivery "
        "lost while")


@pytest.mark.spark
def test_interrupted_run_is_incomplete(
    spark: SparkSession, run_dir: Path, tmp_path: Path,
) -> None:
    manifest = dict(RESTART_MANIFEST, status="interrupted")
    path = _variant(run_dir, tmp_path / "run", manifest)
    for extra in ([], ["--allow-loss"]):  # --allow-loss does not make it complete
        result = CliRunner().invoke(analyze_command, [str(path), *extra])
        assert result.exit_code == EXIT_INCOMPLETE, result.output
        assert re.search(r"^verdict\s+INCOMPLETE: the load test was interrupted", result.stdout,
                         re.M)
        assert re.match(r"gossiprouter: error: the load test was interrupted: the figures "
                        r"cover a partial run", result.stderr.strip().splitlines()[-1])
    page = (path / "report" / "report.html").read_text()
    assert "The load test did not complete (status interrupted)" in page
    assert '<td class="r-fail">FAIL</td>' in page


# --------------------------------------------------------------------------- Spark start


def test_driver_stays_on_loopback_for_a_loopback_master() -> None:
    for master in ("local[*]", "local", "spark://127.0.0.1:7077", "spark://localhost:7077",
                   "spark://[::1]:7077", "spark://127.0.0.1:7077,127.0.0.2:7078"):
        assert loopback_master(master), master
        s = session_settings(master)
        assert (s["spark.driver.host"], s["spark.driver.bindAddress"]) == ("127.0.0.1",) * 2
    for master in ("spark://10.0.0.5:7077", "spark://127.0.0.1:7077,master2:7077", "yarn"):
        assert not loopback_master(master), master
        assert "spark.driver.host" not in session_settings(master)
    # --conf spark.driver.host=... wins (a real cluster's routable address).
    s = session_settings("spark://10.0.0.5:7077", {"spark.driver.host": "10.0.0.9"})
    assert s["spark.driver.host"] == "10.0.0.9"


def test_unreachable_master_fails_fast_with_the_cause(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    run = tmp_path / "run"
    build_run(run)
    result = CliRunner().invoke(analyze_command, [str(run), "--master",
                                                  f"spark://127.0.0.1:{port}"])
    assert result.exit_code == EXIT_FAILED, result.output
    # One line, naming the master and the cause. It comes from the TCP check made before
    # any Spark context (bounded by MASTER_CONNECT_TIMEOUT), not from Spark's own give-up
    # after a minute of retries: the progress shows no driver was ever started.
    assert "Spark driver at" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert re.fullmatch(rf"gossiprouter: error: cannot reach the Spark master "
                        rf"spark://127\.0\.0\.1:{port} \(127\.0\.0\.1:{port}: Connection "
                        rf"refused\)", last)  # no Spark log: Spark never started
    assert "stopped SparkContext" not in result.output


def test_spark_log_cause_is_the_last_error_line(tmp_path: Path) -> None:
    log = tmp_path / "spark.log"
    log.write_text(
        "26/11/26 06:00:01 WARN StandaloneAppClient$ClientEndpoint: Failed to connect to "
        "master 127.0.0.1:7077\n"
        "26/11/26 06:01:01 ERROR StandaloneSchedulerBackend: Application has been killed. "
        "Reason: All masters are unresponsive! Giving up.\n"
        "26/11/26 06:01:01 WARN StandaloneSchedulerBackend: Application ID is not "
        "initialized yet.\n")
    assert _log_cause(log) == ("Application has been killed. Reason: All masters are "
                               "unresponsive! Giving up.")
    assert _log_cause(tmp_path / "missing.log") is None


def test_sizes_are_bucketed_by_powers_of_two() -> None:
    # The range a scenario with sizes = {min = 64, max = 2048} draws from: six rows, not 1,985.
    labels = size_labels(range(64, 2049))
    assert [labels[k] for k in sorted(labels)] == [
        "64-127", "128-255", "256-511", "512-1023", "1024-2047", "2048"]
    assert size_labels([64, 256, 1024]) == {64: "64", 256: "256", 1024: "1024"}
    assert size_labels([0, 1, 3]) == {0: "0", 1: "1", 2: "3"}


# --------------------------------------------------------------------------- in a browser


@pytest.mark.spark
def test_report_in_headless_chromium(restart_run: tuple[Path, Report], tmp_path: Path) -> None:
    if find_chromium() is None:
        pytest.fail("chromium is not installed (scripts/setup installs it)")
    path, _ = restart_run
    page = path / "report" / "report.html"
    with Browser() as browser:
        browser.open(page.as_uri(), width=1280)
        png = browser.screenshot(tmp_path / "report.png")
        sections = browser.evaluate(
            "[...document.querySelectorAll('section[id]')].map(s => s.id)")
        images = browser.evaluate(
            "[...document.images].map(i => [i.alt, i.complete, i.naturalWidth, "
            "i.getBoundingClientRect().width])")
        details_open = browser.evaluate("document.querySelector('#manifest details').open")
        verdict = browser.evaluate("document.getElementById('verdict').innerText")
        errors_table = browser.evaluate("document.querySelector('#errors table').innerText")
        undetermined = browser.evaluate("document.getElementById('anomalies').innerText")
        scenario = browser.evaluate("document.getElementById('scenario').innerText")
        checks = browser.evaluate("document.getElementById('checks').innerText")
        baseline = browser.evaluate("document.getElementById('baseline').innerText")
        environment = browser.evaluate("document.getElementById('environment').innerText")
        page_width = browser.evaluate("document.documentElement.scrollWidth")
        console = browser.console_errors()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert sections == ["scenario", "checks", "summary", "baseline", "latency", "throughput",
                        "environment", "breakdown", "errors", "anomalies", "manifest"]
    assert "send pattern\tg1: 1 msg/s per member, 100 B, multicast only; g2: 1 msg/s per " \
        "member, 1000 B, 100 % unicast" in scenario
    assert "latency max\t<= 5000 ms\t2,002 ms\tpass" in checks
    assert "sends on schedule (coordinated omission)\t0 skipped, 0 late\t4 skipped, 2 late " \
        "of 90\twarn" in checks
    assert "lost\t6\t4\t-2 (-33.3 %)" in baseline
    assert "router settings\tfast path on, dispatcher on" in environment
    assert "router\tCPU 20 % mean, 20 % max (100 % = one core); memory 69 MiB max" in environment
    assert [alt for alt, *_ in images] == [
        "latency percentiles over time", "latency distribution", "throughput over time",
        "CPU and memory over time", "breakdown by group", "breakdown by peer process"]
    for alt, complete, natural, shown in images:
        assert complete and natural > 0, alt
        assert shown > 1000, alt  # drawn at the page's width (1280 px less margins)
    assert page_width <= 1280  # nothing wider than the window
    assert details_open is False  # the raw manifest is folded away
    assert verdict.startswith("LOSS: 4 deliveries lost while the sender and the receiver")
    assert "router error: unknown_destination\t30" in errors_table
    assert "Undetermined: 3 (showing 3)" in undetermined
    assert console == []
