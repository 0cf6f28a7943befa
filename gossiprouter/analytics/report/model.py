"""The :class:`Report`: everything the analysis of one run found, as report.json holds it
(:meth:`Report.to_dict`), with its verdict (:mod:`.verdict`) and its key figures
(:func:`key_figures`: the headline figures a later run is compared by, with the
throughput summary they draw on).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Final

from gossiprouter.analytics.report.manifest import (
    host_figures,
    load_errors,
    run_status,
    send_schedule,
)
from gossiprouter.analytics.report.parts import (
    Audit,
    Breakdown,
    Counts,
    Histogram,
    LatencyPoint,
    LatencyStats,
    LoadError,
    RunEvent,
    ScopeBreakdown,
    ThroughputBucket,
)
from gossiprouter.analytics.report.verdict import Verdict, judge

__all__ = ["ENVIRONMENT_FIGURES", "KEY_FIGURES", "REPORT_FORMAT", "Report", "ThroughputSummary",
           "key_figures", "throughput_summary"]


REPORT_FORMAT: Final = "gossiprouter-loadtest-report/3"


@dataclass
class Report:
    """Everything the analysis of one run found."""

    run_dir: str
    out_dir: str
    generated_at: str
    settle_s: float
    spark_master: str
    spark_version: str
    analysis_s: float
    manifest: dict[str, Any] | None
    runs: list[str]
    counts: Counts
    audit: Audit
    latency: LatencyStats | None
    latency_by_group: dict[str, LatencyStats]
    latency_by_size: dict[str, LatencyStats]
    """By payload size, bucketed by powers of two (see :func:`~.parts.size_bucket`)."""
    latency_by_cast: dict[str, LatencyStats]
    latency_histogram: Histogram
    throughput: list[ThroughputBucket]
    warnings: list[str] = field(default_factory=list)
    latency_over_time: list[LatencyPoint] = field(default_factory=list)
    by_group: dict[str, Breakdown] = field(default_factory=dict)
    by_process: dict[str, Breakdown] = field(default_factory=dict)
    events: list[RunEvent] = field(default_factory=list)
    allow_loss: bool = False
    """``--allow-loss``: a loss while registered is accepted (verdict LOSS ACCEPTED, exit 0)."""
    kind: str = "route"
    """``"route"`` (the ROUTE load test) or ``"topics"`` (``loadtest-topics``)."""
    by_scope: dict[str, ScopeBreakdown] = field(default_factory=dict)
    """Topics runs: the audit by scope."""
    baseline: dict[str, Any] | None = None
    """``analyze --baseline``: the earlier run to compare with, from
    :func:`~.baseline.load_baseline` (its ``runs``, ``path`` and ``key_figures``)."""

    @property
    def run_status(self) -> str | None:
        """The load test's own outcome from the manifest: "ok", "interrupted", "failed",
        "running" (the driver never finished it) or None (no manifest)."""
        return run_status(self.manifest)

    @property
    def load_errors(self) -> list[LoadError]:
        return load_errors(self.manifest)

    @property
    def verdict(self) -> Verdict:
        return judge(self.audit, self.manifest, self.latency, self.kind, self.allow_loss)

    @property
    def ok(self) -> bool:
        """True when the verdict lets ``analyze`` exit 0."""
        return self.verdict.ok

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form written to report.json."""
        v = self.verdict
        data: dict[str, Any] = {
            "format": REPORT_FORMAT, "ok": v.ok,
            "verdict": {"status": v.status, "text": v.text, "exit_code": v.exit_code},
            "run_status": self.run_status,
            "load_errors": [dataclasses.asdict(e) for e in self.load_errors],
            "key_figures": key_figures(self),
        }
        data.update(dataclasses.asdict(self))
        return data


# The figures two runs are compared by (analyze --baseline): key, label, how to show it.
KEY_FIGURES: Final = (
    ("verdict", "verdict", "text"),
    ("messages", "messages sent", "int"),
    ("expected", "deliveries expected", "int"),
    ("delivered", "deliveries made", "int"),
    ("lost", "lost", "int"),
    ("duplicated", "duplicated", "int"),
    ("p50_ms", "latency p50 (ms)", "ms"),
    ("p95_ms", "latency p95 (ms)", "ms"),
    ("p99_ms", "latency p99 (ms)", "ms"),
    ("p999_ms", "latency p99.9 (ms)", "ms"),
    ("max_ms", "latency max (ms)", "ms"),
    ("steady_per_s", "throughput steady (deliveries/s)", "rate"),
    ("mean_per_s", "throughput mean (deliveries/s)", "rate"),
    ("sends_skipped", "sends skipped", "int"),
    ("sends_late", "sends late", "int"),
)

# Where each run ran (in key_figures too): what tells a real change from the machine's
# noise when two runs are compared (:mod:`.baseline`).
ENVIRONMENT_FIGURES: Final = (
    ("load_mean", "host load average (1 min, mean)", "load"),
    ("cores", "host cores", "int"),
    ("fast_path", "router fast path", "text"),
)


def key_figures(report: Report) -> dict[str, Any]:
    """The run's headline figures (KEY_FIGURES) and where it ran (ENVIRONMENT_FIGURES), as
    report.json's ``key_figures``: what a later run is compared with. Latencies in ms;
    None where the run has no such figure."""
    a, lat = report.audit, report.latency
    tp = throughput_summary(report)
    schedule = send_schedule(report.manifest)
    lost = a.lost.count if report.kind == "topics" else a.lost_registered.count
    figures: dict[str, Any] = {
        "verdict": report.verdict.status, "messages": report.counts.messages,
        "expected": a.expected, "delivered": a.delivered, "lost": lost,
        "duplicated": a.duplicated.count,
    }
    for key in ("p50", "p95", "p99", "p999", "max"):
        ns = getattr(lat, f"{key}_ns", None) if lat is not None else None
        figures[f"{key}_ms"] = None if ns is None else ns / 1e6
    figures["steady_per_s"] = None if tp.steady is None else round(tp.steady, 3)
    figures["mean_per_s"] = round(tp.mean, 3)
    figures["sends_skipped"] = schedule.skipped if schedule else None
    figures["sends_late"] = schedule.late if schedule else None
    host = host_figures(report.manifest)
    figures.update(load_mean=host.load_mean, cores=host.cores, fast_path=host.fast_path)
    return figures


@dataclass(frozen=True)
class ThroughputSummary:
    """Deliveries per second: ``mean`` over every second of the run (drain included),
    ``peak`` of one second, and ``steady`` over the sending window only (the seconds
    before ``duration``, when the load was on: the rate the router sustained, which the
    drain's idle seconds would dilute); ``steady_sends`` is the send rate then. None
    when the manifest gives no duration."""

    mean: float
    peak: float
    seconds: int
    steady: float | None = None
    steady_sends: float | None = None
    steady_s: float = 0.0


def throughput_summary(report: Report) -> ThroughputSummary:
    series = [b for b in report.throughput if b.covered_s > 0]
    if not series:
        return ThroughputSummary(0.0, 0.0, 0)
    total = sum(b.deliveries for b in series)
    span = sum(b.covered_s for b in series)
    peak = max(b.deliveries / b.covered_s for b in series if b.covered_s >= 0.5) \
        if any(b.covered_s >= 0.5 for b in series) else 0.0
    config = (report.manifest or {}).get("scenario_config")
    duration = config.get("duration") if isinstance(config, dict) else None
    if not isinstance(duration, int | float) or duration <= 0:
        return ThroughputSummary(total / span, peak, len(series))
    # Each second's share inside [0, duration): a run of 2.5 s counts half of second 2.
    window = [(b, min(b.covered_s, duration - b.t_s)) for b in series if b.t_s < duration]
    steady_s = sum(w for _, w in window)
    if steady_s <= 0:
        return ThroughputSummary(total / span, peak, len(series))
    deliveries = sum(b.deliveries * w / b.covered_s for b, w in window)
    sends = sum(b.sends * w / b.covered_s for b, w in window)
    return ThroughputSummary(total / span, peak, len(series), deliveries / steady_s,
                             sends / steady_s, steady_s)
