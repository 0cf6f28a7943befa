"""Tests of the report's rendering and verdicts, on hand-made Report objects (no Spark).

The Spark side (how the figures are computed) is in test_audit.py; here: the verdicts and
exit codes for each situation, what the HTML and the terminal summary show, and the parts
derived from the manifest (events, load-test errors).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from gossiprouter.analytics.report.baseline import BaselineError, comparison_rows, load_baseline
from gossiprouter.analytics.report.environment import environment_rows
from gossiprouter.analytics.report.files import write_report
from gossiprouter.analytics.report.formatting import fmt_ms
from gossiprouter.analytics.report.html_page import render_html
from gossiprouter.analytics.report.manifest import load_errors, run_events
from gossiprouter.analytics.report.model import Report
from gossiprouter.analytics.report.parts import (
    Audit,
    Breakdown,
    Counts,
    Finding,
    Histogram,
    LatencyPoint,
    LatencyStats,
    RunEvent,
    ScopeBreakdown,
    ThroughputBucket,
    size_bucket,
)
from gossiprouter.analytics.report.plots import (
    _figure,
    _latency_histogram,
    _latency_over_time,
    _pyplot,
    log_ticks,
    plot_caption,
)
from gossiprouter.analytics.report.summary import format_summary
from gossiprouter.analytics.report.verdict import EXIT_INCOMPLETE, EXIT_LOSS, EXIT_THRESHOLD

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
                allow_loss: bool = False, lat: LatencyStats | None = None,
                **kw: Any) -> Report:
    lat = lat or LatencyStats(10, 1000, 2000.0, 1500, 3000, 4000, 5000, 9000, 9000)
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
                        # As Scenario.to_dict writes it: [send] folded into each group.
                        "groups": [{"name": "alpha", "members": 4, "rate": 50,
                                    "sizes": [256], "unicast": 0.2}]},
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
    # The plots over the run are SVG, the others PNG (plots.SVG_PLOTS).
    return re.findall(r'<img id="plot-[a-z-]+" alt="([^"]+)" src="data:image/(?:png|svg\+xml);'
                      r'base64,', page)


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
    # are not counted as a 5/s dip; the mean is 105 deliveries over 2.25 s. The steady
    # rate is over the sending window (2 s): 100 deliveries.
    assert re.search(r"^throughput\s+50 deliveries/s steady \(sending window, 2 s\); 47/s "
                     r"mean over 3 s with the drain, 60/s peak$", summary, re.M)
    # Without a duration there is no sending window to tell from the drain.
    summary = format_summary(make_report(audit(), {"status": "ok"}))
    assert re.search(r"^throughput\s+47 deliveries/s mean over 3 s, 60/s peak$", summary, re.M)


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
    page = (tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 1  # the latency distribution
    assert page.count("data:image/svg+xml;base64,") == 2  # latency and throughput over time


@pytest.mark.parametrize(("ns", "text"), [
    (286_251_500_000, "286,252"), (286_251_500, "286"), (28_625_150, "28.6"),
    (1_500_000, "1.50"), (286_000, "0.286"), (42_000, "0.042"), (3_000, "0.003"), (0, "0")])
def test_latency_is_in_ms_with_few_significant_digits(ns: int, text: str) -> None:
    assert fmt_ms(ns) == text


def test_every_latency_table_is_in_ms_with_p95() -> None:
    lat = LatencyStats(10, 1000, 2_000_000.0, 1_500_000, 3_000_000, 4_000_000, 5_000_000,
                       286_251_500, 286_251_500)
    by_scope = {"local": ScopeBreakdown(sent=5, expected=5, delivered=5, latency=lat)}
    for kind, scopes in (("route", {}), ("topics", by_scope)):
        report = make_report(manifest=dict(MANIFEST), kind=kind, lat=lat, by_scope=scopes)
        summary, page = format_summary(report), render_html(report)
        for text in (summary, page):
            assert "µs" not in text and "286,251" not in text
        assert re.search(r"^latency \(ms\)\s+count\s+p50\s+p90\s+p95\s+p99\s+p99\.9\s+max$",
                         summary, re.M)
        assert re.search(r"^all\s+10\s+1\.50\s+3\.00\s+4\.00\s+5\.00\s+286\s+286$", summary,
                         re.M)
        assert "<th>latency (ms)</th><th>count</th><th>p50</th><th>p90</th><th>p95</th>" in page
        assert "1.50 / 4.00 / 5.00 / 286 ms" in page
    assert re.search(r"^local\s.*\s1\.50\s+4\.00\s+5\.00\s+286$", summary, re.M)
    assert "<th>p50 ms</th><th>p95 ms</th><th>p99 ms</th><th>max ms</th>" in page


def test_scenario_table_shows_the_send_pattern() -> None:
    page = render_html(make_report(manifest=dict(MANIFEST)))
    assert ("<tr><th>send pattern</th><td>50 msg/s per member, 256 B, 20 % unicast</td>"
            "</tr>") in page
    # Groups that send differently: one pattern each.
    config = dict(MANIFEST["scenario_config"], groups=[
        {"name": "a", "members": 2, "rate": "max", "sizes": {"min": 64, "max": 128},
         "unicast": 0.0},
        {"name": "b", "members": 2, "rate": 5, "sizes": [64, 1024], "unicast": 0.5}])
    page = render_html(make_report(manifest=dict(MANIFEST, scenario_config=config)))
    assert ("<td>a: as fast as possible, 64-128 B, multicast only; b: 5 msg/s per member, "
            "64/1024 B, 50 % unicast</td>") in page


def test_scenario_table_of_a_topics_run() -> None:
    config = {"name": "topics", "duration": 8.0, "drain": 1.0, "seed": 1, "routers": 2,
              "publishers": 2, "subscribers": 10, "rate": 20.0, "global_share": 0.5,
              "size": 100, "churn_interval": 1.0, "settle": 0.5,
              "patterns": ["v{p}/pos/*", "+/pos/eu/+"]}
    page = render_html(make_report(manifest={"kind": "topics", "scenario": "topics",
                                             "status": "ok", "scenario_config": config},
                                   kind="topics"))
    for row in ("<tr><th>routers</th><td>2 (federated through one MQTT broker)</td></tr>",
                "<tr><th>publishers</th><td>2 per router, 20 publications/s each, 100 B, "
                "50 % global</td></tr>",
                "<tr><th>subscribers</th><td>10 per router, one pattern changed every 1 s "
                "on average (settle 0.5 s)</td></tr>",
                "<tr><th>patterns</th><td>v{p}/pos/*, +/pos/eu/+ ({p}: a publisher&#x27;s "
                "number)</td></tr>"):
        assert row in page


def _with_thresholds(**limits: float) -> dict[str, Any]:
    return dict(MANIFEST, scenario_config=dict(MANIFEST["scenario_config"],
                                               thresholds=limits))


def test_a_latency_threshold_fails_the_verdict() -> None:
    # make_report's latency: p99 5,000 ns (0.005 ms), max 9,000 ns.
    report = make_report(manifest=_with_thresholds(p99_ms=0.004, max_ms=1))
    v = report.verdict
    assert (v.status, v.exit_code) == ("THRESHOLD", EXIT_THRESHOLD)
    assert v.text.startswith("p99 latency 0.005 ms over the threshold of 0.004 ms; no "
                             "delivery lost")
    page = render_html(report)
    assert ('<tr><td>latency p99</td><td>&lt;= 0.004 ms</td><td>0.005 ms</td>'
            '<td class="r-fail">FAIL</td></tr>') in page
    assert ('<tr><td>latency max</td><td>&lt;= 1 ms</td><td>0.009 ms</td>'
            '<td class="r-pass">pass</td></tr>') in page
    assert make_report(manifest=_with_thresholds(p99_ms=0.005)).verdict.status == "OK"
    # A loss says more than a slow run; nothing delivered fails a threshold.
    assert make_report(audit(lost=1), _with_thresholds(p99_ms=0.004)).verdict.status == "LOSS"
    empty = make_report(manifest=_with_thresholds(p50_ms=1))
    empty.latency = None
    assert empty.verdict.text.startswith("no latency to hold to the p50 threshold (1 ms)")


def test_scheduled_sends_show_coordinated_omission() -> None:
    counters = {
        "p0": {"slots": 1000, "slots_late": 3, "slots_skipped": 40, "send_lag_max_s": 1.5},
        "p1": {"slots": 1000, "slots_late": 0, "slots_skipped": 0, "send_lag_max_s": 0.002},
    }
    report = make_report(manifest=dict(MANIFEST, counters=counters))
    assert re.search(r"^sends\s+1,960 of 2,000 scheduled \(98\.0 %\); 40 skipped, 3 late \(a "
                     r"slot or more behind\), worst 1,500 ms behind$", format_summary(report),
                     re.M)
    page = render_html(report)
    assert ("<tr><td>sends on schedule (coordinated omission)</td><td>0 skipped, 0 late</td>"
            '<td>40 skipped, 3 late of 2,000</td><td class="r-warn">warn</td></tr>') in page
    assert "1,960 / 2,000 (40 skipped, 3 late)" in page
    assert report.verdict.status == "OK"  # shown, not failed
    on_time = make_report(manifest=dict(MANIFEST, counters={"p1": counters["p1"]}))
    assert re.search(r"^sends\s+1,000 of 1,000 scheduled \(100\.0 %\), every one on time$",
                     format_summary(on_time), re.M)
    # An older run (no pacing counters) or every sender at rate "max": no such row.
    assert "scheduled" not in format_summary(make_report(manifest=dict(MANIFEST)))


def _drawn(draw: Any, report: Report) -> tuple[Any, Any]:
    plt = _pyplot()
    fig, ax = _figure(plt, "test")
    draw(fig, ax, report)
    fig.canvas.draw()
    return fig, ax


def _labels(axis: Any) -> list[str]:
    lo, hi = sorted(axis.get_view_interval())
    return [t.label1.get_text() for t in axis.get_major_ticks()
            if t.label1.get_text() and lo <= t.get_loc() <= hi]


def test_log_latency_axes_have_enough_tick_labels() -> None:
    # 1 to 4 µs: less than a decade, where matplotlib's own log locator labels nothing.
    report = make_report()
    fig, ax = _drawn(_latency_histogram, report)
    assert _labels(ax.xaxis) == ["0.001", "0.002", "0.003", "0.004"]
    _pyplot().close(fig)
    fig, ax = _drawn(_latency_over_time, report)
    assert len(_labels(ax.yaxis)) >= 4
    _pyplot().close(fig)
    assert log_ticks(0.5, 300) == [0.5, 1, 2, 5, 10, 20, 50, 100, 200]
    assert log_ticks(1.2, 2.9) == [1.25, 1.5, 1.75, 2, 2.25, 2.5, 2.75]


def test_plot_captions_only_for_what_is_drawn() -> None:
    assert plot_caption(make_report()) == ""  # no events, no manifest: no drain either
    assert "<p class=caption>" not in render_html(make_report())
    plain = dict(MANIFEST, events=[])
    assert plot_caption(make_report(manifest=plain)) == (
        "<p class=caption>The grey span is the drain: sending stopped, and the deliveries "
        "still arriving are drawn as blocks of their own, not as the lines running down to "
        "0.</p>")
    report = make_report(manifest=dict(MANIFEST), events=run_events(MANIFEST, T0))
    caption = plot_caption(report)
    assert caption.startswith("<p class=caption>Dashed lines mark the scenario&#x27;s events; "
                              "a shaded span is an outage")
    kill_only = make_report(manifest=dict(MANIFEST), events=run_events(MANIFEST, T0)[:1])
    assert "outage" not in plot_caption(kill_only)
    assert render_html(report).count(caption) == 2  # latency over time and throughput


def test_topics_histogram_draws_local_and_global_apart() -> None:
    def scope(edges: list[float], counts: list[int]) -> ScopeBreakdown:
        return ScopeBreakdown(sent=5, expected=5, delivered=5, histogram=Histogram(edges, counts))

    edges = [1e6, 2e6, 4e6, 8e6]
    report = make_report(kind="topics", by_scope={"local": scope(edges, [5, 0, 0]),
                                                  "global": scope(edges, [0, 1, 4])})
    fig, _ = _drawn(_latency_histogram, report)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "local deliveries", "global deliveries", "local CDF", "global CDF"]
    _pyplot().close(fig)


def test_baseline_comparison(tmp_path: Path) -> None:
    old = make_report(manifest=dict(MANIFEST))
    write_report(old, str(tmp_path / "old" / "report"))
    baseline = load_baseline(str(tmp_path / "old"))  # the run directory: its report/
    assert baseline["runs"] == ["r-1"] and baseline["key_figures"]["p99_ms"] == 0.005
    assert load_baseline(str(tmp_path / "old" / "report" / "report.json")) == baseline
    slower = LatencyStats(10, 1000, 2_000_000.0, 1_500_000, 3_000_000, 4_000_000, 6_200_000,
                          9_000_000, 9_000_000)
    new = make_report(audit(lost=2), dict(MANIFEST), lat=slower, baseline=baseline)
    rows = {r[0]: r[1:] for r in comparison_rows(new)}
    assert rows["verdict"] == ["OK", "LOSS", "changed", ""]
    assert rows["lost"] == ["0", "2", "+2", ""]
    assert rows["deliveries made"] == ["100", "98", "-2 (-2.0 %)", ""]
    assert rows["latency p99 (ms)"] == ["0.005", "6.20", "+6.20 ms (+123,900.0 %)",
                                        "beyond noise (±20 %): worse"]
    assert rows["throughput steady (deliveries/s)"] == ["50", "50", "same", "same"]
    assert "sends skipped" not in rows  # neither run was paced
    summary = format_summary(new)
    assert f"compared with the baseline r-1 ({tmp_path}/old/report/report.json):" in summary
    assert re.search(r"^key figure\s+baseline\s+this run\s+change\s+noise$", summary, re.M)
    page = render_html(new)
    assert re.findall(r'<section id="([a-z]+)">', page)[3] == "baseline"
    assert "<tr><td>lost</td><td>0</td><td>2</td><td>+2</td><td></td></tr>" in page
    assert 'id="baseline"' not in render_html(old)
    topics = make_report(manifest=dict(MANIFEST), kind="topics", baseline=baseline)
    assert f"({tmp_path}/old/report/report.json; a route run against this topics run):" in \
        format_summary(topics)
    data = json.loads((tmp_path / "old" / "report" / "report.json").read_text())
    assert data["key_figures"]["verdict"] == "OK"


@pytest.mark.parametrize(("setup", "message"), [
    (lambda p: None, "--baseline {p}: no such run directory or report"),
    (lambda p: p.mkdir(), "--baseline {p}: no report.json there or in {p}/report (run "
                          "`gossiprouter analyze {p}` first)"),
    (lambda p: (p.mkdir(), (p / "report.json").write_text('{"format": "x"}')),
     "--baseline {p}: {p}/report.json is not a report of gossiprouter analyze"),
    (lambda p: (p.mkdir(), (p / "report.json").write_text(
        '{"format": "gossiprouter-loadtest-report/2"}')),
     "--baseline {p}: {p}/report.json was written by an older version without key figures "
     "(run `gossiprouter analyze {p}` again)"),
])
def test_baseline_errors_say_why(tmp_path: Path, setup: Any, message: str) -> None:
    p = tmp_path / "other"
    setup(p)
    with pytest.raises(BaselineError) as e:
        load_baseline(str(p))
    assert str(e.value) == message.format(p=p)


RESOURCES: dict[str, Any] = {
    "cores": 2, "interval_s": 1.0,
    "router_settings": {"fast_path": "on", "dispatcher": "on", "direct_send": "on",
                        "coalesce_writes": "off", "slow_consumer_policy": "disconnect",
                        "jgroups_slow_consumer_policy": "drop",
                        "outbound_queue_bytes": "16777216", "write_timeout": "10"},
    "samples": [
        {"t_s": 0.0, "load1": 0.5, "processes": {
            "router": {"cpu_s": 1.0, "rss_bytes": 50 << 20},
            "p0": {"cpu_s": 2.0, "rss_bytes": 40 << 20},
            "p1": {"cpu_s": 2.0, "rss_bytes": 40 << 20}}},
        {"t_s": 1.0, "load1": 1.5, "processes": {
            "router": {"cpu_s": 1.5, "rss_bytes": 60 << 20},
            "p0": {"cpu_s": 2.25, "rss_bytes": 40 << 20},
            "p1": {"cpu_s": 2.25, "rss_bytes": 41 << 20}}},
        # The router restarted: its CPU counter starts again (no negative step drawn).
        {"t_s": 2.0, "load1": 2.5, "processes": {
            "router": {"cpu_s": 0.1, "rss_bytes": 30 << 20},
            "p0": {"cpu_s": 2.75, "rss_bytes": 40 << 20},
            "p1": {"cpu_s": 2.75, "rss_bytes": 40 << 20}}},
    ]}
HOST = {"host": {"hostname": "box", "platform": "Linux-6", "cores": 2,
                 "memory_bytes": 8 << 30},
        "versions": {"gossiprouter": "1.0", "python": "3.11.2", "rich": None}}


def test_environment_router_settings_cpu_memory_and_load() -> None:
    report = make_report(manifest=dict(MANIFEST, resources=RESOURCES, **HOST))
    rows = dict(environment_rows(report))
    assert rows["router settings"] == (
        "fast path on, dispatcher on, direct send on, coalesced writes off, slow consumers: "
        "disconnect, JGroups slow consumers: drop, outbound queue 16 MiB, write timeout 10 s")
    assert rows["host"] == "box, 2 cores, 8,192 MiB memory, Linux-6"
    assert rows["versions"] == "gossiprouter 1.0, python 3.11.2"
    assert rows["host load average (1 min)"] == "0.50 to 2.50, mean 1.50 (2 cores)"
    # The router: 50 % of a core in the first second; the restart's step is not drawn.
    assert rows["router"] == "CPU 50 % mean, 50 % max (100 % = one core); memory 60 MiB max"
    # The peers summed: 25 % + 25 %, then 50 % + 50 %.
    assert rows["load generator (2 processes)"] == (
        "CPU 75 % mean, 100 % max (100 % = one core); memory 81 MiB max")
    summary = format_summary(report)
    assert re.search(r"^router settings\s+fast path on, dispatcher on,", summary, re.M)
    assert re.search(r"^host load average \(1 min\)\s+0\.50 to 2\.50", summary, re.M)
    page = render_html(report)
    assert re.findall(r'<section id="([a-z]+)">', page)[5] == "environment"
    assert "CPU and memory over time" in _images(page)
    assert "<tr><th>router settings</th><td>fast path on," in page
    # An external router is not sampled: said so, not left blank.
    external = dict(MANIFEST, router={"address": "127.0.0.1:1", "spawned": False},
                    resources=dict(RESOURCES, router_settings={}, samples=[
                        {"t_s": 0.0, "load1": 1.0, "processes": {}}]), **HOST)
    assert dict(environment_rows(make_report(manifest=external)))["router settings"] == (
        "not known: an external router is not sampled")
    # A peer's figures taken before the sample (its last counters): its rate is over its
    # own interval, 0.25 CPU s in 0.5 s.
    stale = json.loads(json.dumps(RESOURCES))
    stale["samples"] = stale["samples"][:2]
    del stale["samples"][1]["processes"]["p1"]
    stale["samples"][1]["processes"]["p0"]["t_s"] = 0.5
    rows = dict(environment_rows(make_report(manifest=dict(MANIFEST, resources=stale))))
    assert rows["load generator (2 processes)"].startswith("CPU 50 % mean, 50 % max")
    # An older run's manifest has none of it: no section, no rows.
    assert environment_rows(make_report(manifest=dict(MANIFEST))) == []
    assert 'id="environment"' not in render_html(make_report(manifest=dict(MANIFEST)))


def test_the_plots_read_no_late_field() -> None:
    # EarlyPlots draws from a report made before the order check and the samples: no plot
    # may read what that report lacks (plots.LATE_FIELDS).
    from gossiprouter.analytics.report import plots

    class Guarded(Report):
        def __getattribute__(self, name: str) -> Any:
            assert name not in plots.LATE_FIELDS, f"a plot reads Report.{name}"
            return super().__getattribute__(name)

    report = make_report(manifest=MANIFEST, events=run_events(MANIFEST, T0))
    guarded = Guarded(**{f: report.__dict__[f] for f in report.__dataclass_fields__})
    assert set(plots.plot_images(guarded)) == set(plots.plot_images(report))


def test_early_plots_are_kept_only_for_a_report_they_fit(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    from gossiprouter.analytics.report import plots

    drawn: list[Report] = []

    def fake(report: Report) -> dict[str, str]:
        drawn.append(report)
        return {"throughput": str(len(report.throughput))}

    monkeypatch.setattr(plots, "plot_images", fake)
    early = make_report()
    # The order check found something, the report was timed and warned: the plots stand.
    final = dataclasses.replace(early, audit=audit(lost=3), analysis_s=9.0, warnings=["w"],
                                generated_at="later", baseline={"runs": []})
    assert plots.EarlyPlots(early).images(final) == {"throughput": "3"}
    assert drawn == [early]
    # A field the plots show differs: drawn again, from the final report.
    changed = dataclasses.replace(early, throughput=[ThroughputBucket(0, 1, 1, 0)])
    assert plots.EarlyPlots(early).images(changed) == {"throughput": "1"}
    assert drawn[1:] == [early, changed]
