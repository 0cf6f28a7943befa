"""Tests of the report's rendering and verdicts, on hand-made Report objects (no Spark).

The Spark side (how the figures are computed) is in test_audit.py; here: the verdicts and
exit codes for each situation, what the HTML and the terminal summary show, and the parts
derived from the manifest (events, load-test errors).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gossiprouter.analytics.report import (
    EXIT_INCOMPLETE,
    EXIT_LOSS,
    Audit,
    Breakdown,
    Counts,
    Finding,
    Histogram,
    LatencyPoint,
    LatencyStats,
    Report,
    RunEvent,
    ThroughputBucket,
    format_summary,
    load_errors,
    render_html,
    run_events,
    size_bucket,
    write_report,
)

S = 1_000_000_000
T0 = 500 * S


def audit(lost: int = 0, reconnect: int = 0, undetermined: int = 0) -> Audit:
    nothing = Finding(0)
    sample = [{"msg_id": "a-0/1", "receiver": "b-1", "t_send_s": 1.25}]
    return Audit(
        expected=100, delivered=100 - lost - reconnect,
        lost=Finding(lost + reconnect), lost_registered=Finding(lost, sample if lost else []),
        lost_reconnect=Finding(reconnect, sample if reconnect else []),
        lost_to_left=0, lost_to_killed=0, duplicated=nothing, duplicate_copies=0,
        out_of_order=nothing, out_of_order_pairs=0,
        undetermined=Finding(undetermined, [{"msg_id": "u/1", "receiver": "c-2",
                                             "t_recv_s": None}] if undetermined else []),
        undetermined_delivered=0, unexpected=nothing)


def make_report(a: Audit | None = None, manifest: dict[str, Any] | None = None,
                allow_loss: bool = False, **kw: Any) -> Report:
    lat = LatencyStats(10, 1000, 2000.0, 1500, 3000, 5000, 9000, 9000)
    return Report(
        run_dir="runs/r", out_dir="runs/r/report", generated_at="now", settle_s=1.0,
        spark_master="local[1]", spark_version="4", analysis_s=1.0, manifest=manifest,
        runs=["r-1"], counts=Counts(200, 100, 100, 100, 0, 100, 8, 8, 2),
        audit=a or audit(), latency=lat, latency_by_group={"alpha": lat},
        latency_by_size={"64-127": lat, "1024": lat}, latency_by_cast={"multicast": lat},
        latency_histogram=Histogram([1000.0, 2000.0, 4000.0], [6, 4]),
        throughput=[ThroughputBucket(0, 50, 40, 0), ThroughputBucket(1, 50, 60, 1),
                    ThroughputBucket(2, 0, 5, 0, covered_s=0.25)],
        latency_over_time=[LatencyPoint(0, 5, 1500, 5000, 9000),
                           LatencyPoint(1, 5, 1400, 4000, 8000)],
        allow_loss=allow_loss, **kw)


MANIFEST: dict[str, Any] = {
    "scenario": "small", "status": "ok", "t0_ns": T0,
    "scenario_config": {"description": "two groups", "duration": 2.0, "drain": 1.0,
                        "groups": [{"name": "alpha", "members": 4}],
                        "send": {"rate": 50, "unicast": 0.2}},
    "processes": [{"proc": 0, "members": ["alpha-0"]}],
    "events": [{"at": 1.0, "action": "kill", "what": "kill process 1", "t_ns": T0 + S + S // 10},
               {"at": 1.5, "action": "restart-router", "what": "restart router",
                "t_ns": T0 + 3 * S // 2, "up_ns": T0 + 2 * S, "registered_ns": T0 + 5 * S // 2}],
    "counters": {
        "p0": {"send_errors": 1, "router_errors_by_code": {"unknown_destination": 12},
               "bad_payloads": 0, "dropped": 0},
        "p1": {"send_errors": 0, "router_errors_by_code": {"unknown_destination": 18,
                                                           "forbidden": 2}, "dropped": 3},
    },
}


@pytest.mark.parametrize(("a", "status", "allow", "verdict", "code"), [
    (audit(), "ok", False, "OK", 0),
    (audit(reconnect=62), "ok", False, "OK", 0),
    (audit(lost=3), "ok", False, "LOSS", EXIT_LOSS),
    (audit(lost=3, reconnect=5), "ok", True, "LOSS ACCEPTED", 0),
    (audit(), "interrupted", False, "INCOMPLETE", EXIT_INCOMPLETE),
    (audit(lost=3), "interrupted", True, "INCOMPLETE", EXIT_INCOMPLETE),
    (audit(), "failed", False, "INCOMPLETE", EXIT_INCOMPLETE),
    (audit(), None, False, "OK", 0),  # no manifest: nothing says the run was incomplete
])
def test_verdicts_and_exit_codes(a: Audit, status: str | None, allow: bool, verdict: str,
                                 code: int) -> None:
    manifest = None if status is None else {"status": status}
    v = make_report(a, manifest, allow).verdict
    assert (v.status, v.exit_code) == (verdict, code)
    assert v.ok == (code == 0)


def test_verdict_texts_name_what_happened() -> None:
    v = make_report(audit(reconnect=62), {"status": "ok"}).verdict
    assert v.text == ("no delivery lost while the sender and the receiver were both "
                      "registered; 62 deliveries lost across a reconnect (router restart), "
                      "as expected")
    v = make_report(audit(lost=1), {"status": "ok"}, allow_loss=True).verdict
    assert v.text == ("1 delivery lost while the sender and the receiver were both registered "
                      "(accepted with --allow-loss)")
    v = make_report(audit(lost=2), {"status": "interrupted"}).verdict
    assert v.text == ("the load test was interrupted: the figures cover a partial run "
                      "(2 deliveries lost while registered)")


def test_a_frame_that_did_not_parse_at_a_peer_fails_the_run() -> None:
    """The load test's receiver-side framing check (peer counters ``framing_violations``):
    a member's corrupted stream fails the verdict even when every delivery was recorded."""
    manifest = {"status": "ok", "counters": {"p0": {"framing_violations": 2}}}
    v = make_report(audit(), manifest, allow_loss=True).verdict
    assert (v.status, v.exit_code) == ("CORRUPT", EXIT_LOSS)
    assert v.text == "2 frames from the router did not parse at the receiving member (a " \
        "stream cut into)"


def test_events_are_relative_to_the_start() -> None:
    assert run_events(MANIFEST, T0) == [
        RunEvent(1.1, "kill", "kill process 1"),
        RunEvent(1.5, "restart-router", "restart router", up_s=2.0, end_s=2.5)]
    # A manifest without played events: the scenario's schedule.
    scheduled = {"scenario_config": {"events": [{"at": 4.0, "action": "kill", "process": 2}]}}
    assert run_events(scheduled, None) == [RunEvent(4.0, "kill", "kill 2")]
    assert run_events(None, T0) == []


def test_load_errors_from_the_counters() -> None:
    assert [(e.kind, e.count, e.by_process) for e in load_errors(MANIFEST)] == [
        ("router error: unknown_destination", 30, {"p0": 12, "p1": 18}),
        ("dropped (receive buffer full)", 3, {"p1": 3}),
        ("router error: forbidden", 2, {"p1": 2}),
        ("send failed", 1, {"p0": 1}),
    ]
    assert load_errors(None) == [] and load_errors({"counters": "junk"}) == []


def test_size_bucket() -> None:
    assert [size_bucket(n) for n in (0, 1, 64, 127, 128, 2048)] == [
        (0, 0), (1, 1), (64, 127), (64, 127), (128, 255), (2048, 4095)]


def _images(page: str) -> list[str]:
    return re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,', page)


def test_html_layout(tmp_path: Path) -> None:
    report = make_report(
        audit(lost=2, undetermined=4), dict(MANIFEST),
        events=run_events(MANIFEST, T0),
        by_group={"alpha": Breakdown(sent=100, expected=100, delivered=98, lost_registered=2)},
        by_process={"p0": Breakdown(sent=50, expected=50, delivered=49, lost_registered=1)})
    page = render_html(report)
    ids = re.findall(r'<section id="([a-z]+)">', page)
    assert ids == ["scenario", "checks", "summary", "latency", "throughput", "breakdown",
                   "errors", "anomalies", "manifest"]
    # The verdict comes first, then the scenario in words; the manifest is folded away.
    assert page.index('id="verdict"') < page.index('id="scenario"')
    assert "<tr><th>description</th><td>two groups</td></tr>" in page
    assert "<tr><th>duration</th><td>2 s sending + 1 s drain</td></tr>" in page
    assert re.search(r"<details><summary>raw manifest.json</summary><pre>\{", page)
    assert ("<tr><td>lost while sender and receiver were both registered</td><td>0</td>"
            '<td>2</td><td class="r-fail">FAIL</td></tr>') in page
    assert _images(page) == ["latency percentiles over time", "latency distribution",
                             "throughput over time", "breakdown by group",
                             "breakdown by peer process"]
    assert ("<tr><td>router error: unknown_destination</td><td>30</td>"
            "<td>p0 12, p1 18</td></tr>") in page
    assert "<h3>Undetermined: 4 (showing 1)</h3>" in page
    assert "<td>1.25</td>" in page  # sample times in seconds since the start
    assert 'width=device-width' in page and "img{display:block;width:100%" in page
    # Nothing shows raw monotonic nanoseconds.
    assert str(T0 + S + S // 10) not in page.split("<details>")[0]
    write_report(report, str(tmp_path))
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["verdict"] == {"status": "LOSS", "text": report.verdict.text,
                               "exit_code": EXIT_LOSS}
    assert data["load_errors"][0]["count"] == 30
    assert list(data["latency_by_size"]) == ["64-127", "1024"]


def test_interrupted_run_is_flagged_everywhere() -> None:
    report = make_report(manifest=dict(MANIFEST, status="interrupted"))
    page = render_html(report)
    assert "The load test did not complete (status interrupted)" in page
    assert '<strong>INCOMPLETE</strong>' in page and "(exit code 4)" in page
    summary = format_summary(report)
    assert re.search(r"^verdict\s+INCOMPLETE: the load test was interrupted", summary, re.M)
    assert "OK" not in summary.split("verdict", 1)[1].splitlines()[0]


def test_summary_tables() -> None:
    summary = format_summary(make_report(audit(reconnect=7), dict(MANIFEST)))
    assert re.search(r"^lost across reconnect\s+7\s+\(sent while a router restart was under "
                     r"way\)$", summary, re.M)
    assert re.search(r"^router error: unknown_destination\s+30\s+p0 12, p1 18$", summary, re.M)
    assert re.search(r"^size 64-127 B\s+10\s", summary, re.M)
    # Rates over the covered part of each second: the last quarter-second's 5 deliveries
    # are not counted as a 5/s dip; the mean is 105 deliveries over 2.25 s.
    assert re.search(r"^throughput\s+47 deliveries/s mean, 60/s peak, over 3 s$", summary, re.M)


def test_report_of_an_empty_audit_renders(tmp_path: Path) -> None:
    # No deliveries at all: no latency, an empty histogram; the writers must still work.
    nothing = Finding(0)
    report = Report(
        run_dir="r", out_dir=str(tmp_path), generated_at="now", settle_s=1.0,
        spark_master="local[1]", spark_version="4", analysis_s=0.0, manifest=None, runs=[],
        counts=Counts(1, 1, 0, 1, 0, 0, 1, 0, 1),
        audit=Audit(0, 0, nothing, nothing, nothing, 0, 0, nothing, 0, nothing, 0, nothing, 0,
                    nothing),
        latency=None, latency_by_group={}, latency_by_size={}, latency_by_cast={},
        latency_histogram=Histogram([], []), throughput=[ThroughputBucket(0, 1, 0, 0)],
    )
    assert re.search(r"^verdict\s+OK: no delivery lost", format_summary(report), re.M)
    write_report(report, str(tmp_path))
    assert json.loads((tmp_path / "report.json").read_text())["latency"] is None
    assert (tmp_path / "report.html").read_text().count("data:image/png;base64,") == 3
