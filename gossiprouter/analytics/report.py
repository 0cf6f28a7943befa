"""The load-test report: its data model, report.json, report.html and the terminal summary.

Nothing here needs Spark: :mod:`gossiprouter.analytics.audit` computes a :class:`Report`
and this module renders it. The HTML is self-contained (plots embedded as base64 PNG, made
with matplotlib's Agg backend, so no display is needed).
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import itertools
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

__all__ = [
    "EXIT_FAILED",
    "EXIT_INCOMPLETE",
    "EXIT_INPUT",
    "EXIT_LOSS",
    "EXIT_OK",
    "EXIT_THRESHOLD",
    "KEY_FIGURES",
    "Audit",
    "BaselineError",
    "Breakdown",
    "Counts",
    "Finding",
    "Histogram",
    "LatencyPoint",
    "LatencyStats",
    "LoadError",
    "Report",
    "RunEvent",
    "ScopeBreakdown",
    "ThroughputBucket",
    "Verdict",
    "comparison_rows",
    "fmt_ms",
    "format_summary",
    "key_figures",
    "load_baseline",
    "load_errors",
    "render_html",
    "run_events",
    "size_bucket",
    "write_report",
]

REPORT_FORMAT: Final = "gossiprouter-loadtest-report/3"

T = TypeVar("T")

# Exit codes of ``gossiprouter analyze`` (the verdict decides 0, 3, 4 and 5).
EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
"""The analysis itself failed (Spark error, PySpark or Java missing, master unreachable)."""
EXIT_INPUT: Final = 2
"""Bad input: no such run directory, no records, a bad option."""
EXIT_LOSS: Final = 3
"""Deliveries were lost while the sender and the receiver were both registered."""
EXIT_INCOMPLETE: Final = 4
"""The run did not complete (interrupted or failed): its figures are partial."""
EXIT_THRESHOLD: Final = 5
"""A latency threshold of the scenario ([thresholds], as k6's) was exceeded."""


@dataclass
class Finding:
    """A counted kind of anomaly, with up to ``sample`` examples (deterministically chosen)."""

    count: int
    sample: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class LatencyStats:
    """Latency (receive time minus send time of the first copy received), in nanoseconds."""

    count: int
    min_ns: int
    mean_ns: float
    p50_ns: int
    p90_ns: int
    p95_ns: int
    p99_ns: int
    p999_ns: int
    max_ns: int


@dataclass
class LatencyPoint:
    """Latency of the deliveries of the messages sent in one second of the run."""

    t_s: int
    count: int
    p50_ns: int
    p99_ns: int
    max_ns: int


@dataclass
class Histogram:
    """Latency histogram over log-spaced bins: ``counts[i]`` in ``[edges_ns[i], edges_ns[i+1])``."""

    edges_ns: list[float]
    counts: list[int]


@dataclass
class ThroughputBucket:
    """One second of the run, counted from its start (``t_s`` seconds after it): messages
    sent, deliveries made (first copies, by receive time) and deliveries lost (by send
    time). ``covered_s`` is the part of the second inside the run (below 1 for a last,
    partial second): rates are counts divided by it."""

    t_s: int
    sends: int
    deliveries: int
    lost: int
    covered_s: float = 1.0


@dataclass
class Breakdown:
    """Counts for one group, or one peer process (as sender for ``sent``, as receiver for
    the rest)."""

    sent: int = 0
    expected: int = 0
    delivered: int = 0
    lost_registered: int = 0
    lost_reconnect: int = 0
    undetermined: int = 0
    duplicated: int = 0


@dataclass
class ScopeBreakdown:
    """A topics run's audit for one scope (``local`` or ``global``): publications sent,
    (publication, subscriber) pairs expected, delivered and lost, pairs received more than
    once and their extra copies, copies received by subscribers that were not expected
    (``unexpected``), pairs left unaudited because the subscriber was changing its
    patterns (``in_flux``), and the latency of the first copies."""

    sent: int = 0
    expected: int = 0
    delivered: int = 0
    lost: int = 0
    duplicated: int = 0
    duplicate_copies: int = 0
    unexpected: int = 0
    in_flux: int = 0
    latency: LatencyStats | None = None
    histogram: Histogram | None = None
    """The latency histogram of this scope, on the bins of the run's (drawn together)."""


@dataclass
class RunEvent:
    """A scenario event as played, in seconds since the start of the run. For a router
    restart ``end_s`` is when every member was registered again (None if that was not
    observed) and ``up_s`` when the router listened again."""

    t_s: float
    action: str
    what: str
    up_s: float | None = None
    end_s: float | None = None


@dataclass
class LoadError:
    """An error the load-test peers counted (from the manifest's counters)."""

    kind: str
    count: int
    by_process: dict[str, int]


@dataclass
class Counts:
    """What the run's records hold."""

    records: int
    send_records: int
    recv_records: int
    messages: int
    messages_without_send_record: int
    deliveries: int
    """Distinct (message, receiver) pairs received at least once."""
    senders: int
    receivers: int
    groups: int


@dataclass
class Audit:
    """Expected versus actual receivers.

    A (message, receiver) pair is *expected* when the receiver was a member of the group for
    the whole window [t_send, t_send + settle], *undetermined* when it was a member for part
    of that window only. Lost = expected and never received; a loss is *across a reconnect*
    when the window overlaps a router restart (from the router going down until every member
    was registered again), else it was lost *while the sender and the receiver were both
    registered*: the unexplained kind, which fails the verdict.
    """

    expected: int
    delivered: int
    lost: Finding
    """Every loss, of both kinds."""
    lost_registered: Finding
    """Lost while the sender and the receiver were both registered."""
    lost_reconnect: Finding
    """Lost across a reconnect: the window overlaps a router restart."""
    lost_to_left: int
    """Of ``lost_registered``: to receivers that left the group later in the run."""
    lost_to_killed: int
    """Of ``lost_registered``: to receivers whose process was killed later in the run."""
    duplicated: Finding
    """(message, receiver) pairs received more than once."""
    duplicate_copies: int
    """Copies beyond the first, summed over the duplicated pairs."""
    out_of_order: Finding
    """First copies that arrived after a higher seq of the same (group, sender, receiver)."""
    out_of_order_pairs: int
    undetermined: Finding
    """Pairs whose receiver joined or left within the window: not checked."""
    undetermined_delivered: int
    unexpected: Finding
    """Deliveries to a receiver that was neither expected nor undetermined (e.g. to the
    sender itself, to a non-member, or a unicast to someone other than its dest)."""


@dataclass(frozen=True)
class Verdict:
    """The one-word status, a sentence saying why, and the exit code of ``analyze``."""

    status: str
    text: str
    exit_code: int

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK


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
    """By payload size, bucketed by powers of two (see :func:`size_bucket`)."""
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
    """``analyze --baseline``: the earlier run to compare with, from :func:`load_baseline`
    (its ``runs``, ``path`` and ``key_figures``)."""

    @property
    def run_status(self) -> str | None:
        """The load test's own outcome from the manifest: "ok", "interrupted", "failed",
        "running" (the driver never finished it) or None (no manifest)."""
        status = (self.manifest or {}).get("status")
        return str(status) if status is not None else None

    @property
    def load_errors(self) -> list[LoadError]:
        return load_errors(self.manifest)

    @property
    def verdict(self) -> Verdict:
        return _verdict(self)

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


def key_figures(report: Report) -> dict[str, Any]:
    """The run's headline figures (KEY_FIGURES), as report.json's ``key_figures``: what a
    later run is compared with. Latencies in ms; None where the run has no such figure."""
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
    return figures


class BaselineError(ValueError):
    """``--baseline`` names no usable report; the message is one line saying why."""


def load_baseline(path: str) -> dict[str, Any]:
    """The key figures of an earlier analysed run, for ``analyze --baseline PATH``: PATH is
    its run directory (its report in PATH/report), a report directory or a report.json."""
    p = Path(path)
    candidates = [p] if p.suffix == ".json" else [p / "report" / "report.json",
                                                   p / "report.json"]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        if not p.exists():
            raise BaselineError(f"--baseline {path}: no such run directory or report")
        raise BaselineError(f"--baseline {path}: no report.json there or in {path}/report "
                            f"(run `gossiprouter analyze {path}` first)")
    try:
        data = json.loads(found.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise BaselineError(f"--baseline {path}: cannot read {found}: {e}") from None
    if not isinstance(data, dict) or not str(data.get("format", "")).startswith(
            "gossiprouter-loadtest-report/"):
        raise BaselineError(f"--baseline {path}: {found} is not a report of gossiprouter "
                            "analyze")
    figures = data.get("key_figures")
    if not isinstance(figures, dict):
        raise BaselineError(f"--baseline {path}: {found} was written by an older version "
                            f"without key figures (run `gossiprouter analyze {path}` again)")
    runs = data.get("runs")
    return {"path": str(found), "runs": runs if isinstance(runs, list) else [],
            "kind": data.get("kind"), "key_figures": figures}


def _show_figure(value: Any, how: str) -> str:
    if value is None:
        return "-"
    if how == "ms" and isinstance(value, int | float):
        return fmt_ms(value * 1e6)
    if how == "rate" and isinstance(value, int | float):
        return f"{value:,.0f}"
    if how == "int" and isinstance(value, int | float):
        return f"{value:,.0f}"
    return str(value)


def _change(old: Any, new: Any, how: str) -> str:
    """``+1.20 ms (+24.0 %)``, ``-50/s (-2.1 %)``, ``+3``, ``same``, ``changed``."""
    if how == "text" or not isinstance(old, int | float) or not isinstance(new, int | float):
        if old is None or new is None:
            return "-"
        return "same" if old == new else "changed"
    delta = new - old
    if delta == 0:
        return "same"
    if how == "ms":
        text = f"{'+' if delta > 0 else '-'}{fmt_ms(abs(delta) * 1e6)} ms"
    elif how == "rate":
        text = f"{delta:+,.0f}/s"
    else:
        text = f"{delta:+,.0f}"
    return text + (f" ({delta / old * 100:+,.1f} %)" if old else "")


def comparison_rows(report: Report) -> list[list[str]]:
    """[figure, baseline, this run, change] for each key figure either run has."""
    if report.baseline is None:
        return []
    old_figures = report.baseline.get("key_figures") or {}
    new_figures = key_figures(report)
    rows = []
    for key, label, how in KEY_FIGURES:
        old, new = old_figures.get(key), new_figures.get(key)
        if old is None and new is None:
            continue
        rows.append([label, _show_figure(old, how), _show_figure(new, how),
                     _change(old, new, how)])
    return rows


def _baseline_name(report: Report) -> str:
    b = report.baseline or {}
    runs = ", ".join(str(r) for r in b.get("runs") or []) or "an earlier run"
    other = b.get("kind")
    # Runs of two kinds can be set side by side, but their figures measure different paths.
    kinds = (f"; a {other} run against this {report.kind} run"
             if isinstance(other, str) and other != report.kind else "")
    return f"{runs} ({b.get('path')}{kinds})"


def _n(count: int, noun: str, plural: str | None = None) -> str:
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


@dataclass(frozen=True)
class ThresholdResult:
    """One ``[thresholds]`` entry of the scenario against the run's latency."""

    key: str
    """``p99_ms`` and the like (gossiprouter.loadtest.scenario.THRESHOLD_KEYS)."""
    limit_ms: float
    observed_ns: int | None
    """None when nothing was delivered (nothing to measure: the threshold fails)."""

    @property
    def label(self) -> str:
        name = self.key.removesuffix("_ms")
        return "p99.9" if name == "p999" else name

    @property
    def ok(self) -> bool:
        return self.observed_ns is not None and self.observed_ns <= self.limit_ms * 1e6


def thresholds(report: Report) -> list[ThresholdResult]:
    """The scenario's latency thresholds (from the manifest) against the run's latency."""
    config = (report.manifest or {}).get("scenario_config")
    table = config.get("thresholds") if isinstance(config, dict) else None
    if not isinstance(table, dict):
        return []
    lat = report.latency
    out = []
    for key, limit in table.items():
        if not isinstance(limit, int | float):
            continue
        field_name = key.removesuffix("_ms") + "_ns"
        observed = getattr(lat, field_name, None) if lat is not None else None
        out.append(ThresholdResult(key, float(limit),
                                   observed if isinstance(observed, int) else None))
    return out


def _verdict(report: Report) -> Verdict:
    # A loss (or an incomplete run) says more than a slow one: thresholds come after.
    v = _audit_verdict(report)
    failed = [t for t in thresholds(report) if not t.ok]
    if not v.ok or not failed:
        return v
    text = "; ".join(
        f"{t.label} latency {fmt_ms(t.observed_ns)} ms over the threshold of "
        f"{t.limit_ms:g} ms" if t.observed_ns is not None else
        f"no latency to hold to the {t.label} threshold ({t.limit_ms:g} ms): nothing was "
        "delivered" for t in failed)
    return Verdict("THRESHOLD", f"{text}; {v.text}", EXIT_THRESHOLD)


def _audit_verdict(report: Report) -> Verdict:
    # Precedence: an incomplete run first (its losses may be the interruption's doing, so
    # they prove nothing either way), then an unexplained loss, then OK.
    a = report.audit
    lost, across = a.lost_registered.count, a.lost_reconnect.count
    status = report.run_status
    if status is not None and status != "ok":
        how = {"interrupted": "was interrupted", "failed": "failed",
               "running": "never finished (the load test was stopped abruptly)"}.get(
                   status, f"ended with status {status!r}")
        text = f"the load test {how}: the figures cover a partial run"
        if lost:
            text += f" ({_n(lost, 'delivery', 'deliveries')} lost while registered)"
        return Verdict("INCOMPLETE", text, EXIT_INCOMPLETE)
    framing = sum(e.count for e in report.load_errors if e.kind == FRAMING)
    if framing:  # a member's stream corrupted: whatever the audit says, the run failed
        return Verdict("CORRUPT", f"{_n(framing, 'frame', 'frames')} from the router did not "
                       "parse at the receiving member (a stream cut into)", EXIT_LOSS)
    if report.kind == "topics":
        return _topics_verdict(report)
    reconnect = (f"; {_n(across, 'delivery', 'deliveries')} lost across a reconnect "
                 "(router restart), as expected") if across else ""
    if lost:
        text = (f"{_n(lost, 'delivery', 'deliveries')} lost while the sender and the receiver "
                f"were both registered{reconnect}")
        if report.allow_loss:
            return Verdict("LOSS ACCEPTED", text + " (accepted with --allow-loss)", EXIT_OK)
        return Verdict("LOSS", text, EXIT_LOSS)
    return Verdict("OK", "no delivery lost while the sender and the receiver were both "
                         f"registered{reconnect}", EXIT_OK)


def _topics_verdict(report: Report) -> Verdict:
    # A topic publication reaches every subscriber whose pattern matched, once: a duplicate
    # (an echo through the broker, say) or a delivery to a subscriber that did not match
    # breaks that promise as surely as a loss, so both fail the verdict too.
    a = report.audit
    wrong = []
    if a.duplicated.count:
        wrong.append(f"{_n(a.duplicated.count, 'delivery', 'deliveries')} duplicated "
                     f"({_n(a.duplicate_copies, 'extra copy', 'extra copies')})")
    if a.unexpected.count:
        wrong.append(f"{_n(a.unexpected.count, 'copy', 'copies')} delivered to subscribers "
                     "whose patterns did not match or outside the scope")
    lost = a.lost.count
    if lost:
        text = (f"{_n(lost, 'delivery', 'deliveries')} lost to subscribers whose patterns "
                "matched at send time")
        text += "".join(f"; {w}" for w in wrong)
        if report.allow_loss and not wrong:
            return Verdict("LOSS ACCEPTED", text + " (accepted with --allow-loss)", EXIT_OK)
        return Verdict("LOSS", text, EXIT_LOSS)
    if wrong:
        return Verdict("WRONG DELIVERY", "; ".join(wrong), EXIT_LOSS)
    return Verdict("OK", "every publication reached each subscriber whose patterns matched "
                         "at send time, once, and no other", EXIT_OK)


def size_bucket(size: int) -> tuple[int, int]:
    """The power-of-two bucket [lo, hi] holding a payload ``size`` in bytes."""
    if size <= 0:
        return 0, 0
    lo = 1 << (size.bit_length() - 1)
    return lo, 2 * lo - 1


def run_events(manifest: dict[str, Any] | None, origin_ns: int | None) -> list[RunEvent]:
    """The scenario's events in seconds since ``origin_ns``: as played (the manifest's
    ``events``), else as scheduled (its ``scenario_config``)."""
    if not manifest:
        return []
    played = manifest.get("events")
    out: list[RunEvent] = []
    if isinstance(played, list) and origin_ns is not None:
        def rel(v: Any) -> float | None:
            return (v - origin_ns) / 1e9 if isinstance(v, int) else None

        for e in played:
            if isinstance(e, dict) and isinstance(e.get("t_ns"), int):
                out.append(RunEvent(rel(e["t_ns"]) or 0.0, str(e.get("action", "")),
                                    str(e.get("what") or e.get("action", "")),
                                    rel(e.get("up_ns")), rel(e.get("registered_ns"))))
        return out
    config = manifest.get("scenario_config")
    scheduled = config.get("events") if isinstance(config, dict) else None
    for e in scheduled if isinstance(scheduled, list) else []:
        if isinstance(e, dict) and isinstance(e.get("at"), int | float):
            action = str(e.get("action", ""))
            out.append(RunEvent(float(e["at"]), action,
                                " ".join(str(e[k]) for k in ("action", "member", "process")
                                         if e.get(k) is not None)))
    return out


FRAMING: Final = "frames from the router that did not parse"


def load_errors(manifest: dict[str, Any] | None) -> list[LoadError]:
    """The errors the peers counted, from the manifest's per-process counters."""
    counters = (manifest or {}).get("counters")
    if not isinstance(counters, dict):
        return []
    found: dict[str, dict[str, int]] = {}

    def add(kind: str, proc: str, n: Any) -> None:
        if isinstance(n, int) and n > 0:
            found.setdefault(kind, {})[proc] = found.get(kind, {}).get(proc, 0) + n

    for proc, c in sorted(counters.items()):
        if not isinstance(c, dict):
            continue
        codes = c.get("router_errors_by_code")
        for code, n in (codes.items() if isinstance(codes, dict) else ()):
            add(f"router error: {code}", proc, n)
        add("send failed", proc, c.get("send_errors"))
        add("undecodable payload received", proc, c.get("bad_payloads"))
        add(FRAMING, proc, c.get("framing_violations"))
        add("dropped (receive buffer full)", proc, c.get("dropped"))
    return sorted((LoadError(k, sum(v.values()), v) for k, v in found.items()),
                  key=lambda e: (-e.count, e.kind))


def _fmt_int(n: int) -> str:
    return f"{n:,}"


def fmt_ms(ns: float) -> str:
    """A latency in milliseconds with 3 significant digits (2 below 0.1 ms is noise on
    any real network), whole milliseconds from 100 ms: ``0.042``, ``1.25``, ``28.6``,
    ``286``, ``1,234``. The one unit of every latency the report shows."""
    ms = ns / 1e6
    if ms >= 100:
        return f"{ms:,.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    if ms >= 1:
        return f"{ms:.2f}"
    if ms >= 0.1:
        return f"{ms:.3f}"
    return f"{ms:.2g}" if ms >= 1e-4 else "0"


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    # Plain text rather than rich: the summary goes to logs and CI output as often as to a tty.
    body = [list(r) for r in rows]
    widths = [len(h) for h in headers]
    for r in body:
        widths = [max(w, len(c)) for w, c in zip(widths, r, strict=True)]
    line = "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(
        zip(headers, widths, strict=True)))
    out = [line, "  ".join("-" * w for w in widths)]
    for r in body:
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(
            zip(r, widths, strict=True))))
    return out


LATENCY_HEADERS: Final = ("latency (ms)", "count", "p50", "p90", "p95", "p99", "p99.9", "max")


def _latency_rows(report: Report) -> list[list[str]]:
    rows: list[list[str]] = []

    def add(label: str, s: LatencyStats) -> None:
        rows.append([label, _fmt_int(s.count), *(fmt_ms(v) for v in (
            s.p50_ns, s.p90_ns, s.p95_ns, s.p99_ns, s.p999_ns, s.max_ns))])

    if report.latency is not None:
        add("all", report.latency)
    for key, s in report.latency_by_cast.items():
        add(f"cast {key}", s)
    for key, scope in report.by_scope.items():
        if scope.latency is not None:
            add(f"scope {key}", scope.latency)
    for key, s in report.latency_by_group.items():
        add(f"group {key}", s)
    for key, s in report.latency_by_size.items():
        add(f"size {key} B", s)
    return rows


def _scope_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the "by scope" table of a topics run."""
    headers = ["scope", "sent", "expected", "delivered", "lost", "duplicated",
               "extra copies", "unexpected", "in flux", "p50 ms", "p95 ms", "p99 ms", "max ms"]
    rows = []
    for key, b in report.by_scope.items():
        lat = b.latency
        rows.append([key, *(_fmt_int(n) for n in (
            b.sent, b.expected, b.delivered, b.lost, b.duplicated, b.duplicate_copies,
            b.unexpected, b.in_flux)),
            *((fmt_ms(lat.p50_ns), fmt_ms(lat.p95_ns), fmt_ms(lat.p99_ns), fmt_ms(lat.max_ns))
              if lat else ("-",) * 4)])
    return headers, rows


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


def _fmt_throughput(tp: ThroughputSummary) -> str:
    mean = f"{tp.mean:,.0f}/s mean over {tp.seconds} s with the drain, {tp.peak:,.0f}/s peak"
    if tp.steady is None:
        return f"{tp.mean:,.0f} deliveries/s mean over {tp.seconds} s, {tp.peak:,.0f}/s peak"
    return (f"{tp.steady:,.0f} deliveries/s steady (sending window, {tp.steady_s:g} s); "
            + mean)


@dataclass(frozen=True)
class SendSchedule:
    """Target against achieved sends, from the peers' pacing counters
    (:mod:`gossiprouter.loadtest.pacing`): ``slots`` the schedule had, ``skipped`` (never
    sent: the loader was over a second behind), ``late`` (sent a whole interval or more
    behind their slot) and the worst lag. Skipped and late slots are where a loader hides
    coordinated omission: the latency of what was not sent on time is not measured."""

    slots: int
    late: int
    skipped: int
    max_lag_s: float

    @property
    def achieved(self) -> int:
        return self.slots - self.skipped

    @property
    def on_time(self) -> bool:
        return self.late == 0 and self.skipped == 0


def send_schedule(manifest: dict[str, Any] | None) -> SendSchedule | None:
    """The pacing counters summed over the peer processes (None if none were paced: no
    manifest, an older run, or every sender at rate "max")."""
    counters = (manifest or {}).get("counters")
    if not isinstance(counters, dict):
        return None
    slots = late = skipped = 0
    lag = 0.0
    for c in counters.values():
        if isinstance(c, dict) and isinstance(c.get("slots"), int):
            slots += c["slots"]
            late += int(c.get("slots_late") or 0)
            skipped += int(c.get("slots_skipped") or 0)
            lag = max(lag, float(c.get("send_lag_max_s") or 0.0))
    return SendSchedule(slots, late, skipped, lag) if slots else None


def _fmt_schedule(sc: SendSchedule) -> str:
    share = 100 * sc.achieved / sc.slots
    text = f"{sc.achieved:,} of {sc.slots:,} scheduled ({share:.1f} %)"
    if sc.on_time:
        return text + ", every one on time"
    return (text + f"; {sc.skipped:,} skipped, {sc.late:,} late (a slot or more behind), "
            f"worst {fmt_ms(sc.max_lag_s * 1e9)} ms behind")


@dataclass
class ProcessSeries:
    """One process (or role) of the run over time: CPU as a share of one core (%,
    between consecutive samples) and resident memory (bytes)."""

    t_s: list[float] = field(default_factory=list)
    cpu_pct: list[float] = field(default_factory=list)
    rss_t_s: list[float] = field(default_factory=list)
    rss_bytes: list[int] = field(default_factory=list)
    processes: int = 1
    """How many processes are summed (a topics run's routers, the peer processes)."""


@dataclass
class Environment:
    """What the machine and the router were doing: from the manifest's ``host``,
    ``versions`` and ``resources`` (gossiprouter.loadtest.resources)."""

    router_settings: dict[str, str]
    cores: int | None
    memory_bytes: int | None
    hostname: str
    platform: str
    versions: dict[str, str]
    load: list[tuple[float, float]]
    """(seconds since the start, the host's one-minute load average)."""
    series: dict[str, ProcessSeries]
    """By role: ``router`` (each router of a topics run), ``peers`` (the peer processes
    summed: the load generator) and their processes."""
    router_sampled: bool


def _role(name: str) -> str:
    return "router" if name.startswith("router") else "load generator"


def environment(report: Report) -> Environment | None:
    """The run's environment (None for a manifest without any of it: an older run)."""
    m = report.manifest or {}
    host = m.get("host") if isinstance(m.get("host"), dict) else {}
    res = m.get("resources") if isinstance(m.get("resources"), dict) else {}
    assert isinstance(host, dict) and isinstance(res, dict)
    if not host and not res:
        return None
    samples = [s for s in res.get("samples") or () if isinstance(s, dict)
               and isinstance(s.get("t_s"), int | float)]
    load = [(float(s["t_s"]), float(s["load1"])) for s in samples
            if isinstance(s.get("load1"), int | float)]
    # Per process first (a CPU counter is per process; a restarted router starts at 0
    # again, so a negative step is no step), then summed by role.
    # (the sample's time, when the process's figures were taken, CPU s, RSS bytes)
    per_proc: dict[str, list[tuple[float, float, float | None, int | None]]] = {}
    for s in samples:
        for name, v in (s.get("processes") or {}).items():
            if isinstance(v, dict):
                cpu, rss, taken = v.get("cpu_s"), v.get("rss_bytes"), v.get("t_s")
                t = float(s["t_s"])
                per_proc.setdefault(str(name), []).append(
                    (t, float(taken) if isinstance(taken, int | float) else t,
                     float(cpu) if isinstance(cpu, int | float) else None,
                     int(rss) if isinstance(rss, int) else None))
    by_role: dict[str, dict[float, list[float]]] = {}
    rss_role: dict[str, dict[float, int]] = {}
    for name, pts in per_proc.items():
        role = _role(name)
        # The rate over the process's own interval, drawn at the sample's time, so the
        # processes of a role add up sample by sample.
        for (_, a1, c1, _), (t2, a2, c2, _) in itertools.pairwise(pts):
            if c1 is not None and c2 is not None and a2 > a1 and c2 >= c1:
                by_role.setdefault(role, {}).setdefault(t2, []).append(
                    (c2 - c1) / (a2 - a1) * 100)
        for t, _, _, rss in pts:
            if rss is not None:
                rss_role.setdefault(role, {})[t] = rss_role.get(role, {}).get(t, 0) + rss
    series: dict[str, ProcessSeries] = {}
    for role in sorted(set(by_role) | set(rss_role), key=lambda r: r != "router"):
        ps = series[role] = ProcessSeries(processes=sum(_role(n) == role for n in per_proc))
        for t, vals in sorted(by_role.get(role, {}).items()):
            ps.t_s.append(t)
            ps.cpu_pct.append(sum(vals))
        for t, rss in sorted(rss_role.get(role, {}).items()):
            ps.rss_t_s.append(t)
            ps.rss_bytes.append(rss)
    versions = m.get("versions") if isinstance(m.get("versions"), dict) else {}
    assert isinstance(versions, dict)
    settings = res.get("router_settings")
    cores = host.get("cores", res.get("cores"))
    return Environment(
        router_settings={str(k): str(v) for k, v in settings.items()}
        if isinstance(settings, dict) else {},
        cores=cores if isinstance(cores, int) else None,
        memory_bytes=host.get("memory_bytes") if isinstance(host.get("memory_bytes"), int)
        else None,
        hostname=str(host.get("hostname") or ""), platform=str(host.get("platform") or ""),
        # "python_implementation CPython" says nothing; another implementation is news.
        versions={str(k): str(v) for k, v in versions.items()
                  if v and (k, v) != ("python_implementation", "CPython")},
        load=load, series=series, router_sampled="router" in series)


def _mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


_SETTING_WORDS: Final = (("fast_path", "fast path"), ("dispatcher", "dispatcher"),
                         ("direct_send", "direct send"), ("coalesce_writes", "coalesced writes"),
                         ("slow_consumer_policy", "slow consumers:"),
                         ("jgroups_slow_consumer_policy", "JGroups slow consumers:"),
                         ("outbound_queue_bytes", "outbound queue"),
                         ("write_timeout", "write timeout"))


def _settings_text(settings: dict[str, str]) -> str:
    parts = []
    for key, words in _SETTING_WORDS:
        v = settings.get(key)
        if v is None:
            continue
        if key == "outbound_queue_bytes" and v.isdigit():
            v = _mb(int(v))
        elif key == "write_timeout":
            v = f"{v} s"
        parts.append(f"{words} {v}")
    return ", ".join(parts)


def environment_rows(report: Report) -> list[tuple[str, str]]:
    """The environment in words: router settings, host, load average, CPU and memory."""
    env = environment(report)
    if env is None:
        return []
    rows: list[tuple[str, str]] = []
    if env.router_settings:
        rows.append(("router settings", _settings_text(env.router_settings)))
    elif not env.router_sampled:
        router = (report.manifest or {}).get("router")
        spawned = isinstance(router, dict) and router.get("spawned")
        rows.append(("router settings", "not known: " + (
            "the router had no metrics (prometheus-client not installed)" if spawned or
            report.kind == "topics" else "an external router is not sampled")))
    host = [env.hostname, f"{env.cores} cores" if env.cores else "",
            _mb(env.memory_bytes).replace("MiB", "MiB memory") if env.memory_bytes else "",
            env.platform]
    rows.append(("host", ", ".join(h for h in host if h)))
    if env.versions:
        rows.append(("versions", ", ".join(f"{k} {v}" for k, v in env.versions.items())))
    if env.load:
        values = [v for _, v in env.load]
        rows.append(("host load average (1 min)",
                     f"{min(values):.2f} to {max(values):.2f}, mean "
                     f"{sum(values) / len(values):.2f}"
                     + (f" ({env.cores} cores)" if env.cores else "")))
    for role, ps in env.series.items():
        what = []
        if ps.cpu_pct:
            what.append(f"CPU {sum(ps.cpu_pct) / len(ps.cpu_pct):,.0f} % mean, "
                        f"{max(ps.cpu_pct):,.0f} % max (100 % = one core)")
        if ps.rss_bytes:
            what.append(f"memory {_mb(max(ps.rss_bytes))} max")
        if what:
            label = f"{role} ({ps.processes} processes)" if ps.processes > 1 else role
            rows.append((label, "; ".join(what)))
    return rows


def _scenario_name(report: Report) -> str:
    name = (report.manifest or {}).get("scenario")
    return str(name) if isinstance(name, str | int | float) else ""


def _checks(report: Report) -> list[tuple[str, str, str, str]]:
    """(check, threshold, observed, result) rows; result is pass, FAIL, accepted, warn or
    info."""
    a = report.audit
    status = report.run_status
    rows = [("the load test completed", "status ok", status or "unknown (no manifest)",
             "info" if status is None else "pass" if status == "ok" else "FAIL")]
    for t in thresholds(report):
        rows.append((f"latency {t.label}", f"<= {t.limit_ms:g} ms",
                     "no deliveries" if t.observed_ns is None else
                     f"{fmt_ms(t.observed_ns)} ms", "pass" if t.ok else "FAIL"))
    schedule = send_schedule(report.manifest)
    if schedule is not None:
        # Not a failure by itself (k6 counts dropped iterations, too), but a latency
        # measured by a loader that fell behind is understated: shown where it is judged.
        rows.append(("sends on schedule (coordinated omission)", "0 skipped, 0 late",
                     f"{_fmt_int(schedule.skipped)} skipped, {_fmt_int(schedule.late)} late "
                     f"of {_fmt_int(schedule.slots)}", "pass" if schedule.on_time else "warn"))
    if report.kind == "topics":
        lost = a.lost.count
        rows += [
            ("lost (expected subscriber never received it)", "0", _fmt_int(lost),
             "pass" if lost == 0 else "accepted" if report.allow_loss else "FAIL"),
            ("duplicated", "0", _fmt_int(a.duplicated.count),
             "pass" if a.duplicated.count == 0 else "FAIL"),
            ("unexpected deliveries", "0", _fmt_int(a.unexpected.count),
             "pass" if a.unexpected.count == 0 else "FAIL"),
            (f"in flux (patterns changing, settle {report.settle_s:g} s)", "not checked",
             _fmt_int(a.undetermined.count), "info"),
        ]
        return rows
    lost = a.lost_registered.count
    rows.append(("lost while sender and receiver were both registered", "0", _fmt_int(lost),
                 "pass" if lost == 0 else "accepted" if report.allow_loss else "FAIL"))
    rows.append(("lost across a reconnect (router restart)", "expected, not checked",
                 _fmt_int(a.lost_reconnect.count), "info"))
    for name, n in (("duplicated", a.duplicated.count), ("out of order", a.out_of_order.count),
                    ("unexpected deliveries", a.unexpected.count)):
        rows.append((name, "not checked", _fmt_int(n), "info"))
    rows.append((f"undetermined (membership changed within the {report.settle_s:g} s window)",
                 "not checked", _fmt_int(a.undetermined.count), "info"))
    return rows


def format_summary(report: Report) -> str:
    """The plain-text summary table printed by ``gossiprouter analyze``."""
    c, a = report.counts, report.audit
    name = _scenario_name(report)
    scenario = f"  (scenario {name})" if name else ""
    v = report.verdict
    tail = [["throughput", _fmt_throughput(throughput_summary(report))]]
    schedule = send_schedule(report.manifest)
    if schedule is not None:
        tail.append(["sends", _fmt_schedule(schedule)])
    tail += [[k, v] for k, v in environment_rows(report)]
    tail += [
        ["analysis", f"{report.analysis_s:.1f} s on {report.spark_master} "
                     f"(Spark {report.spark_version})"],
        ["verdict", f"{v.status}: {v.text}"],
    ]
    rows = [
        ["run", ", ".join(report.runs) + scenario],
        ["records", f"{_fmt_int(c.records)}  (send {_fmt_int(c.send_records)}, "
                    f"recv {_fmt_int(c.recv_records)})"],
        ["messages", f"{_fmt_int(c.messages)}  (without send record "
                     f"{_fmt_int(c.messages_without_send_record)})"],
        ["expected deliveries", f"{_fmt_int(a.expected)}  (delivered {_fmt_int(a.delivered)})"],
        ["lost while registered", f"{_fmt_int(a.lost_registered.count)}  (sender and receiver "
                                  "both registered; of which to receivers that later left "
                                  f"{_fmt_int(a.lost_to_left)}, later killed "
                                  f"{_fmt_int(a.lost_to_killed)})"],
        ["lost across reconnect", f"{_fmt_int(a.lost_reconnect.count)}  (sent while a router "
                                  "restart was under way)"],
        ["duplicated", f"{_fmt_int(a.duplicated.count)}  (extra copies "
                       f"{_fmt_int(a.duplicate_copies)})"],
        ["out of order", f"{_fmt_int(a.out_of_order.count)}  (in "
                         f"{_fmt_int(a.out_of_order_pairs)} sender->receiver pairs)"],
        ["undetermined", f"{_fmt_int(a.undetermined.count)}  (delivered "
                         f"{_fmt_int(a.undetermined_delivered)}, settle {report.settle_s:g} s)"],
        ["unexpected", _fmt_int(a.unexpected.count)],
        *tail,
    ]
    if report.kind == "topics":
        # Topics runs have no membership, reconnects or ordering audit: their own rows.
        rows = [rows[0],
                ["publications", f"{_fmt_int(c.messages)}  (deliveries recorded "
                                 f"{_fmt_int(c.recv_records)})"],
                ["expected deliveries", f"{_fmt_int(a.expected)}  (delivered "
                                        f"{_fmt_int(a.delivered)})"],
                ["lost", _fmt_int(a.lost.count)],
                ["duplicated", f"{_fmt_int(a.duplicated.count)}  (extra copies "
                               f"{_fmt_int(a.duplicate_copies)})"],
                ["unexpected", f"{_fmt_int(a.unexpected.count)}  (copies)"],
                ["in flux", f"{_fmt_int(a.undetermined.count)}  (subscriber changing "
                            f"patterns, settle {report.settle_s:g} s; not audited)"],
                *tail]
    width = max(len(r[0]) for r in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    errors = report.load_errors
    if errors:
        lines.append("")
        lines += _table(["load-test errors", "count", "by process"],
                        [[e.kind, _fmt_int(e.count),
                          ", ".join(f"{p} {n:,}" for p, n in e.by_process.items())]
                         for e in errors])
    if report.by_scope:
        lines.append("")
        lines += _table(*_scope_table(report))
    lat = _latency_rows(report)
    if lat:
        lines.append("")
        lines += _table(LATENCY_HEADERS, lat)
    compared = comparison_rows(report)
    if compared:
        lines += ["", f"compared with the baseline {_baseline_name(report)}:"]
        lines += _table(["key figure", "baseline", "this run", "change"], compared)
    for w in report.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return base64.b64encode(buf.getvalue()).decode("ascii")


# Wide figures (1200 px at dpi 100) drawn at the page's width, so they stay sharp on a
# large screen and shrink with a small one. Legends go above the axes, never over the data.
_WIDE: Final = (12.0, 3.6)
_COLORS: Final = {"delivered": "#4c72b0", "sent": "#55a868", "lost": "#c44e52",
                  "reconnect": "#dd8452", "undetermined": "#8c8c8c", "p50": "#4c72b0",
                  "p99": "#dd8452", "max": "#c44e52"}


def _pyplot() -> Any:
    # Agg is chosen explicitly so rendering works with no display and ignores MPLBACKEND.
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _mark_events(ax: Any, report: Report, labels: bool = True) -> None:
    """Dashed lines for the scenario's events, a shaded span for each router outage (from
    going down until every member was registered again), and the drain period greyed;
    the events named when ``labels``."""
    drain = _drain_span(report)
    if drain is not None:
        ax.axvspan(*drain, color="#eeeeee", zorder=0)
    for i, ev in enumerate(report.events):
        ax.axvline(ev.t_s, color="#555555", linestyle="--", linewidth=1, zorder=1)
        if ev.end_s is not None:
            ax.axvspan(ev.t_s, ev.end_s, color=_COLORS["reconnect"], alpha=0.15, zorder=0)
        if not labels:
            continue
        # Labels on three staggered rows, so that events close in time stay readable.
        ax.annotate(ev.what, xy=(ev.t_s, 1), xycoords=("data", "axes fraction"),
                    xytext=(3, -3 - 11 * (i % 3)), textcoords="offset points", ha="left",
                    va="top", fontsize=8, color="#333333",
                    bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none",
                          "alpha": 0.8})


def _figure(plt: Any, title: str, size: tuple[float, float] = _WIDE) -> tuple[Any, Any]:
    fig, ax = plt.subplots(figsize=size, layout="constrained")
    ax.set_title(title, loc="left", fontsize=11)
    ax.grid(True, axis="y", color="#e5e5e5")
    return fig, ax


def _legend(fig: Any, ax: Any) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside upper right", ncols=len(handles),
                   frameon=False, fontsize=9)


def log_ticks(lo: float, hi: float, at_least: int = 4) -> list[float]:
    """Tick positions for a log axis over [lo, hi] (> 0) with at least ``at_least`` of
    them inside: 1-2-5 per decade, else every digit, else evenly spaced values. (On less
    than a decade matplotlib's log locator labels one tick or none.)"""
    if not 0 < lo <= hi:
        return []
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    for subs in ((1, 2, 5), tuple(range(1, 10))):
        ticks = [m * 10.0 ** e for e in range(first, last + 1) for m in subs]
        inside = [t for t in ticks if lo <= t * (1 + 1e-9) and t <= hi * (1 + 1e-9)]
        if len(inside) >= at_least:
            return inside
    # A narrow range: evenly spaced round values, the widest step that gives enough.
    top = math.floor(math.log10(hi - lo)) if hi > lo else math.floor(math.log10(hi))
    steps = sorted((m * 10.0 ** e for e in range(top - 3, top + 1) for m in (1, 2, 2.5, 5)),
                   reverse=True)
    inside = [lo]
    for step in steps:
        inside = [float(f"{k * step:.12g}") for k in range(math.ceil(lo / step - 1e-9),
                                                          math.floor(hi / step + 1e-9) + 1)]
        if len(inside) >= at_least:
            break
    return inside


def _tick_label(ms: float) -> str:
    # Round tick values read best without trailing zeros ("50", not "50.0").
    text = f"{ms:.3g}" if ms < 1000 else f"{ms:,.0f}"
    return fmt_ms(ms * 1e6) if "e" in text else text


def _log_axis(axis: Any, lo: float, hi: float) -> None:
    """A log-scale latency axis (ms) over [lo, hi] with readable labels at every tick."""
    from matplotlib import ticker

    ticks = log_ticks(lo, hi)
    axis.set_major_locator(ticker.FixedLocator(ticks))
    axis.set_major_formatter(ticker.FixedFormatter([_tick_label(t) for t in ticks]))
    axis.set_minor_formatter(ticker.NullFormatter())


def _cdf(counts: Sequence[int]) -> list[float]:
    total = sum(counts) or 1
    return list(itertools.accumulate(n / total for n in counts))


def _latency_histogram(fig: Any, ax: Any, report: Report) -> None:
    # A topics run draws each scope on its own: local and global latency are two
    # different paths (one router, or two and the broker), one histogram would mix them.
    scoped = {k: b.histogram for k, b in report.by_scope.items()
              if b.histogram is not None and sum(b.histogram.counts) > 0}
    series = list(scoped.items()) if report.kind == "topics" and scoped else \
        [("deliveries", report.latency_histogram)]
    series = [(k, h) for k, h in series if h.counts and sum(h.counts) > 0]
    if not series:
        _no_deliveries(ax)
        ax.set_xlabel("latency (ms, log scale)")
        ax.set_ylabel("deliveries")
        return
    ax2 = ax.twinx()
    colors = [_COLORS["delivered"], _COLORS["reconnect"], _COLORS["sent"]]
    lo = hi = 0.0
    for i, (label, hist) in enumerate(series):
        edges_ms = [e / 1e6 for e in hist.edges_ns]
        widths = [b - a for a, b in itertools.pairwise(edges_ms)]
        color = colors[i % len(colors)]
        name = label if label == "deliveries" else f"{label} deliveries"
        ax.bar(edges_ms[:-1], hist.counts, width=widths, align="edge", color=color,
               alpha=0.85 if len(series) == 1 else 0.55, label=name)
        ax2.plot(edges_ms[1:], _cdf(hist.counts), color=color if len(series) > 1
                 else _COLORS["p99"], linestyle="-" if len(series) == 1 else "--",
                 label="cumulative share" if len(series) == 1 else f"{label} CDF")
        used = [(a, b) for (a, b), n in zip(itertools.pairwise(edges_ms), hist.counts,
                                             strict=True) if n]
        lo = min(lo or used[0][0], used[0][0])
        hi = max(hi, used[-1][1])
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    _log_axis(ax.xaxis, lo, hi)
    ax2.set_ylim(0, 1.01)
    ax2.set_ylabel("CDF")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    fig.legend(h1 + h2, l1 + l2, loc="outside upper right", ncols=len(h1 + h2),
               frameon=False, fontsize=9)
    ax.set_xlabel("latency (ms, log scale)")
    ax.set_ylabel("deliveries")


def _latency_over_time(fig: Any, ax: Any, report: Report) -> None:
    pts = report.latency_over_time
    if pts:
        ts = [p.t_s + 0.5 for p in pts]  # drawn at the middle of its second
        values = []
        for key, label in (("max_ns", "max"), ("p99_ns", "p99"), ("p50_ns", "p50")):
            ys = [getattr(p, key) / 1e6 for p in pts]
            values += ys
            ax.plot(ts, ys, marker=".", color=_COLORS[label], label=label)
        ax.set_yscale("log")
        positive = [v for v in values if v > 0]
        if positive:
            lo, hi = min(positive) / 1.15, max(positive) * 1.15
            ax.set_ylim(lo, hi)
            _log_axis(ax.yaxis, lo, hi)
    else:
        _no_deliveries(ax)
    _over_the_run(fig, ax, report, "latency (ms, log scale)")


def _throughput(fig: Any, ax: Any, report: Report) -> None:
    # A second the run covers only partly is drawn as a rate over the part it covers
    # (not as a dip); one covered less than half is left out (a rate over a sliver is
    # noise).
    full = [b for b in report.throughput if b.covered_s >= 0.5]
    ts = [b.t_s + 0.5 for b in full]
    ax.plot(ts, [b.deliveries / b.covered_s for b in full], marker=".",
            color=_COLORS["delivered"], label="deliveries/s")
    ax.plot(ts, [b.sends / b.covered_s for b in full], marker=".",
            color=_COLORS["sent"], label="sends/s")
    lost = [(b.t_s + 0.5, b.lost / b.covered_s) for b in full if b.lost]
    if lost:
        ax.scatter([t for t, _ in lost], [n for _, n in lost], color=_COLORS["lost"],
                   marker="x", label="lost/s (by send second)", zorder=3)
    ax.set_ylim(bottom=0)
    _over_the_run(fig, ax, report, "per second")


def _no_deliveries(ax: Any) -> None:
    ax.text(0.5, 0.5, "no deliveries", ha="center", va="center", transform=ax.transAxes)


def _over_the_run(fig: Any, ax: Any, report: Report, ylabel: str) -> None:
    """The time axis of a plot over the run (its events marked), its labels and legend."""
    _mark_events(ax, report)
    ax.set_xlim(left=0)
    ax.set_xlabel("seconds since the start of the run")
    ax.set_ylabel(ylabel)
    _legend(fig, ax)


def _resources(fig: Any, ax: Any, report: Report) -> None:
    """Three panels over the run: CPU (% of one core) of the router and of the load
    generator, their resident memory, and the host's load average (each on its own
    scale: a loaded host's load would flatten a process's CPU on a shared axis)."""
    env = environment(report)
    assert env is not None
    title = ax.get_title(loc="left")
    ax.remove()
    cpu_ax, mem_ax, load_ax = fig.subplots(3, 1, sharex=True)
    cpu_ax.set_title(title, loc="left", fontsize=11)
    colors = {"router": _COLORS["delivered"], "load generator": _COLORS["sent"]}
    for role, ps in env.series.items():
        color = colors.get(role, "#555555")
        if ps.cpu_pct:
            cpu_ax.plot(ps.t_s, ps.cpu_pct, marker=".", color=color, label=role)
        if ps.rss_bytes:
            mem_ax.plot(ps.rss_t_s, [b / 2**20 for b in ps.rss_bytes], marker=".",
                        color=color)
    if env.load:
        load_ax.plot([t for t, _ in env.load], [v for _, v in env.load], marker=".",
                     color=_COLORS["undetermined"])
        if env.cores:
            load_ax.axhline(env.cores, color="#555555", linestyle=":", linewidth=1)
            load_ax.annotate(f"{env.cores} cores", xy=(0, env.cores),
                             xycoords=("axes fraction", "data"), xytext=(3, 2),
                             textcoords="offset points", fontsize=8, color="#333333")
    for a, label in ((cpu_ax, "CPU (% of a core)"), (mem_ax, "memory (MiB)"),
                     (load_ax, "host load (1 min)")):
        a.grid(True, axis="y", color="#e5e5e5")
        a.set_ylim(bottom=0, top=max(a.get_ylim()[1], 1))
        a.set_ylabel(label, fontsize=9)
        _mark_events(a, report, labels=a is cpu_ax)
    load_ax.set_xlim(left=0)
    load_ax.set_xlabel("seconds since the start of the run")
    handles, labels = cpu_ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside upper right", ncols=len(handles),
                   frameon=False, fontsize=9)


def _breakdown_size(parts: dict[str, Breakdown]) -> tuple[float, float]:
    return (12.0, max(2.2, 0.9 + 0.45 * len(parts)))


def _breakdown(fig: Any, ax: Any, parts: dict[str, Breakdown]) -> None:
    names = list(parts)[::-1]  # first at the top
    ys = range(len(names))
    left = [0.0] * len(names)
    for key, label, color in (("delivered", "delivered", _COLORS["delivered"]),
                              ("lost_registered", "lost while registered", _COLORS["lost"]),
                              ("lost_reconnect", "lost across a reconnect",
                               _COLORS["reconnect"]),
                              ("undetermined", "undetermined", _COLORS["undetermined"])):
        vals = [float(getattr(parts[n], key)) for n in names]
        if any(vals):
            ax.barh(ys, vals, left=left, color=color, label=label, height=0.6)
            left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set_yticks(list(ys), names)
    ax.set_xlim(left=0)
    ax.set_xlabel("(message, receiver) pairs")
    ax.grid(True, axis="x", color="#e5e5e5")
    _legend(fig, ax)


def _plots(report: Report) -> dict[str, str]:
    """Base64 PNGs by section: latency histogram, latency over time, throughput and the
    breakdowns (when there is something to break down)."""
    plt = _pyplot()

    def png(title: str, draw: Callable[[Any, Any, T], None], what: T,
            size: tuple[float, float] = _WIDE) -> str:
        # One figure at a time, closed whatever happens: pyplot keeps every open one.
        fig, ax = _figure(plt, title, size)
        try:
            draw(fig, ax, what)
            return _png(fig)
        finally:
            plt.close(fig)

    plots = {
        "latency-histogram": png("Latency distribution", _latency_histogram, report),
        "latency-over-time": png("Latency over time (by send second)", _latency_over_time,
                                 report),
        "throughput": png("Throughput", _throughput, report),
    }
    env = environment(report)
    if env is not None and (env.series or env.load):
        plots["resources"] = png("CPU, memory and host load over time", _resources, report,
                                 (12.0, 6.4))
    for key, title, parts in (("by-group", "By group (receivers)", report.by_group),
                              ("by-process", "By peer process (receivers)",
                               report.by_process)):
        if parts:
            plots[key] = png(title, _breakdown, parts, _breakdown_size(parts))
    return plots


def _html_table(headers: Sequence[str], rows: Iterable[Sequence[object]],
                cls: str = "") -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows
    )
    attr = f' class="{cls}"' if cls else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _sample_html(title: str, finding: Finding, note: str = "") -> str:
    if not finding.sample:
        return ""
    headers = list(finding.sample[0].keys())
    rows = [["" if s.get(h) is None else s.get(h) for h in headers] for s in finding.sample]
    return (f"<h3>{html.escape(title)}: {finding.count:,} (showing {len(rows)})</h3>"
            + (f"<p>{html.escape(note)}</p>" if note else "")
            + _html_table(headers, rows))


def _img(plots: dict[str, str], key: str, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{plots[key]}">'


def _scenario_rows(report: Report) -> list[tuple[str, str]]:
    m = report.manifest or {}
    config = m.get("scenario_config") if isinstance(m.get("scenario_config"), dict) else {}
    assert isinstance(config, dict)
    rows: list[tuple[str, str]] = []

    def add(key: str, value: Any) -> None:
        if value not in (None, "", [], {}):
            rows.append((key, str(value)))

    add("scenario", m.get("scenario"))
    add("description", config.get("description"))
    add("scenario file", m.get("scenario_file"))
    if isinstance(config.get("duration"), int | float):
        add("duration", f"{config['duration']:g} s sending + {config.get('drain', 0):g} s drain")
    groups = [g for g in config.get("groups") or () if isinstance(g, dict)]
    if groups:
        add("groups", ", ".join(f"{g.get('name')} ({g.get('members')} members)"
                                for g in groups))
        # The scenario's [send] is folded into each group (Scenario.to_dict): one line when
        # every group sends alike, else one pattern per group.
        patterns = {g.get("name"): _send_pattern(g) for g in groups}
        if len(set(patterns.values())) == 1:
            add("send pattern", next(iter(patterns.values())))
        else:
            add("send pattern", "; ".join(f"{k}: {v}" for k, v in patterns.items()))
    processes = m.get("processes")
    if isinstance(processes, list):
        add("peer processes", len(processes))
    if report.kind == "topics":
        rows += _topics_rows(config)
    router = m.get("router")
    if isinstance(router, dict):
        how = "spawned" if router.get("spawned") else "external"
        add("router", f"{router.get('address')} ({how})")
    add("events", "; ".join(f"{e.t_s:.1f} s {e.what}" for e in report.events))
    add("run", ", ".join(report.runs))
    add("started", m.get("started_at"))
    add("finished", m.get("finished_at"))
    add("load-test status", report.run_status)
    add("settle window", f"{report.settle_s:g} s")
    return rows


def _send_pattern(group: dict[str, Any]) -> str:
    """``10 msg/s per member, 256 B, 20 % unicast`` from a group of the scenario config."""
    rate = group.get("rate")
    how = "as fast as possible" if rate == "max" else f"{rate:g} msg/s per member" \
        if isinstance(rate, int | float) else "?"
    sizes = group.get("sizes")
    if isinstance(sizes, dict):
        size = f"{sizes.get('min')}-{sizes.get('max')} B"
    elif isinstance(sizes, list):
        size = "/".join(str(v) for v in sizes) + " B"
    else:
        size = "? B"
    unicast = group.get("unicast")
    cast = (f"{unicast * 100:g} % unicast" if isinstance(unicast, int | float) and unicast
            else "multicast only")
    return f"{how}, {size}, {cast}"


def _topics_rows(config: dict[str, Any]) -> list[tuple[str, str]]:
    """The Scenario rows of a topics run (its config is a TopicsScenario as a dict)."""
    def get(key: str) -> str:
        v = config.get(key)
        return f"{v:g}" if isinstance(v, int | float) else "?"

    rows = [("routers", f"{get('routers')} (federated through one MQTT broker)"),
            ("publishers", f"{get('publishers')} per router, {get('rate')} publications/s "
                           f"each, {get('size')} B, "
                           f"{float(config.get('global_share') or 0) * 100:g} % global"),
            ("subscribers", f"{get('subscribers')} per router, one pattern changed every "
                            f"{get('churn_interval')} s on average (settle "
                            f"{get('settle')} s)")]
    patterns = config.get("patterns")
    if isinstance(patterns, list) and patterns:
        rows.append(("patterns", ", ".join(str(p) for p in patterns)
                     + " ({p}: a publisher's number)"))
    return rows


def _drain_span(report: Report) -> tuple[float, float] | None:
    config = (report.manifest or {}).get("scenario_config")
    if isinstance(config, dict) and isinstance(config.get("duration"), int | float):
        duration = float(config["duration"])
        return duration, duration + float(config.get("drain") or 0)
    return None


def plot_caption(report: Report) -> str:
    """What the marks on the plots over the run mean: only the marks there are (a run
    without events has no dashed lines to explain)."""
    parts = []
    if report.events:
        parts.append("dashed lines mark the scenario's events")
    if any(e.end_s is not None for e in report.events):
        parts.append("a shaded span is an outage: from a router going down until every "
                     "member was registered again")
    drain = _drain_span(report)
    if drain is not None and drain[1] > drain[0]:
        parts.append("the grey span is the drain (sending stopped)")
    if not parts:
        return ""
    text = "; ".join(parts)
    return f"<p class=caption>{html.escape(text[0].upper() + text[1:])}.</p>"


def render_html(report: Report) -> str:
    """The self-contained report.html."""
    plots = _plots(report)
    caption = plot_caption(report)
    a, c = report.audit, report.counts
    esc = html.escape
    v = report.verdict
    verdict_cls = "ok" if v.status == "OK" else "warn" if v.ok else "bad"
    name = _scenario_name(report)
    warnings = "".join(f"<li>{esc(w)}</li>" for w in report.warnings)
    if report.run_status not in (None, "ok"):
        warnings = (f"<li><strong>The load test did not complete (status "
                    f"{esc(str(report.run_status))}): every figure below covers a partial "
                    "run.</strong></li>") + warnings
    warn_html = f'<ul class="warnings">{warnings}</ul>' if warnings else ""
    checks = "".join(
        f"<tr><td>{esc(check)}</td><td>{esc(th)}</td><td>{esc(obs)}</td>"
        f'<td class="r-{esc(res.lower())}">{esc(res)}</td></tr>'
        for check, th, obs, res in _checks(report))
    tp = throughput_summary(report)
    schedule = send_schedule(report.manifest)
    lat = report.latency
    figures = [
        ("messages sent", _fmt_int(c.messages)),
        ("deliveries expected / made", f"{_fmt_int(a.expected)} / {_fmt_int(a.delivered)}"),
        ("latency p50 / p95 / p99 / max",
         " / ".join(fmt_ms(v) for v in (lat.p50_ns, lat.p95_ns, lat.p99_ns, lat.max_ns))
         + " ms" if lat else "no deliveries"),
        ("throughput (steady / mean / peak)",
         f"{tp.steady:,.0f} / {tp.mean:,.0f} / {tp.peak:,.0f} deliveries/s"
         if tp.steady is not None else
         f"{tp.mean:,.0f} deliveries/s mean, {tp.peak:,.0f}/s peak, {tp.seconds} s"),
        ("sends achieved / scheduled",
         f"{_fmt_int(schedule.achieved)} / {_fmt_int(schedule.slots)}"
         + ("" if schedule.on_time else
            f" ({_fmt_int(schedule.skipped)} skipped, {_fmt_int(schedule.late)} late)")
         if schedule else "not paced (rate max)" if report.manifest else "unknown"),
        ("records", f"{_fmt_int(c.records)} (send {_fmt_int(c.send_records)}, "
                    f"recv {_fmt_int(c.recv_records)})"),
        ("senders / receivers / groups", f"{c.senders} / {c.receivers} / {c.groups}"),
    ]
    figures_html = "".join(f"<div class=fig><div class=k>{esc(k)}</div>"
                           f"<div class=v>{esc(val)}</div></div>" for k, val in figures)
    compared = comparison_rows(report)
    baseline_html = (
        '<section id="baseline"><h2>Compared with the baseline</h2>'
        f"<p>Baseline: {esc(_baseline_name(report))}.</p>"
        + _html_table(["key figure", "baseline", "this run", "change"], compared, "num")
        + "</section>") if compared else ""
    env_rows = environment_rows(report)
    environment_html = (
        '<section id="environment"><h2>Environment</h2>'
        + (_img(plots, "resources", "CPU and memory over time") if "resources" in plots
           else "")
        + '<table class="kv">' + "".join(f"<tr><th>{esc(k)}</th><td>{esc(val)}</td></tr>"
                                         for k, val in env_rows)
        + "</table></section>") if env_rows else ""
    latency_rows = _latency_rows(report)
    latency_table = _html_table(LATENCY_HEADERS, latency_rows, "num") if latency_rows else ""

    def breakdown_table(title: str, parts: dict[str, Breakdown]) -> str:
        return _html_table(
            [title, "sent", "expected", "delivered", "lost while registered",
             "lost across reconnect", "undetermined", "duplicated"],
            [[k, _fmt_int(b.sent), _fmt_int(b.expected), _fmt_int(b.delivered),
              _fmt_int(b.lost_registered), _fmt_int(b.lost_reconnect),
              _fmt_int(b.undetermined), _fmt_int(b.duplicated)] for k, b in parts.items()],
            "num")

    breakdown = ""
    if report.by_scope:
        breakdown += '<h3 id="by-scope">By scope</h3>' + _html_table(
            *_scope_table(report), "num")
    if report.by_group:
        breakdown += _img(plots, "by-group", "breakdown by group") + breakdown_table(
            "group", report.by_group)
    if report.by_process:
        breakdown += _img(plots, "by-process", "breakdown by peer process") + \
            breakdown_table("process", report.by_process)
    errors = report.load_errors
    errors_html = _html_table(
        ["error", "count", "by process"],
        [[e.kind, _fmt_int(e.count), ", ".join(f"{p} {n:,}" for p, n in e.by_process.items())]
         for e in errors], "num") if errors else "<p>The peers counted no errors.</p>"
    samples = "".join([
        _sample_html("Lost while sender and receiver were both registered", a.lost_registered),
        _sample_html("Lost across a reconnect", a.lost_reconnect),
        _sample_html("Duplicated", a.duplicated),
        _sample_html("Out of order", a.out_of_order),
        _sample_html("Unexpected", a.unexpected),
        _sample_html("In flux", a.undetermined,
                     "The subscriber was changing its patterns around the send time: these "
                     "are counted, not checked.") if report.kind == "topics" else
        _sample_html("Undetermined", a.undetermined,
                     "The receiver joined or left within the settle window: these are "
                     "counted, not checked."),
    ]) or "<p>No anomalies.</p>"
    manifest = esc(json.dumps(report.manifest, indent=2, sort_keys=True))
    scenario_rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(val)}</td></tr>"
                            for k, val in _scenario_rows(report))
    css = (
        "body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1280px;"
        "padding:0 1em;color:#222}"
        "h1{margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;"
        "margin-top:1.6em}"
        "table{border-collapse:collapse;margin:.5em 0}"
        "td,th{border:1px solid #ccc;padding:.25em .6em;font-size:90%;text-align:left}"
        "table.num td+td{text-align:right;font-variant-numeric:tabular-nums}"
        "table.kv th{background:#f6f6f6;font-weight:600;white-space:nowrap}"
        "img{display:block;width:100%;height:auto;margin:.8em 0}"
        "pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:85%}"
        ".verdict{padding:.8em 1em;border-radius:6px;font-size:110%;margin:.8em 0}"
        ".verdict.ok{background:#e6f4ea;border:1px solid #2a7}"
        ".verdict.warn{background:#fff4e0;border:1px solid #d80}"
        ".verdict.bad{background:#fdecea;border:1px solid #c22}"
        ".warnings{background:#fff4e0;border:1px solid #d80;padding:.6em 2em}"
        ".r-pass{color:#2a7;font-weight:600}.r-fail{color:#c22;font-weight:600}"
        ".r-accepted,.r-warn{color:#d80;font-weight:600}.r-info{color:#666}"
        ".figs{display:flex;flex-wrap:wrap;gap:.8em}"
        ".fig{border:1px solid #ddd;border-radius:6px;padding:.5em .9em;min-width:13em}"
        ".fig .k{color:#666;font-size:85%}.fig .v{font-size:115%;font-weight:600}"
        "details summary{cursor:pointer;color:#246}"
        ".caption{color:#555;font-size:90%;margin-top:-.4em}"
        "footer{color:#777;font-size:85%;margin-top:2em}"
    )
    title = f"Load-test report{': ' + name if name else ''}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)} ({esc(", ".join(report.runs))})</title>
<style>{css}</style></head>
<body>
<h1>{esc(title)}</h1>
<div id="verdict" class="verdict {verdict_cls}"><strong>{esc(v.status)}</strong>:
{esc(v.text)} <small>(exit code {v.exit_code})</small></div>
{warn_html}
<section id="scenario"><h2>Scenario</h2>
<table class="kv">{scenario_rows}</table></section>
<section id="checks"><h2>Checks</h2>
<table><thead><tr><th>check</th><th>threshold</th><th>observed</th><th>result</th></tr>
</thead><tbody>{checks}</tbody></table></section>
<section id="summary"><h2>Summary</h2><div class="figs">{figures_html}</div></section>
{baseline_html}
<section id="latency"><h2>Latency</h2>
{_img(plots, "latency-over-time", "latency percentiles over time")}
{caption}
{_img(plots, "latency-histogram", "latency distribution")}
{latency_table}</section>
<section id="throughput"><h2>Throughput</h2>
{_img(plots, "throughput", "throughput over time")}
{caption}</section>
{environment_html}
<section id="breakdown"><h2>Breakdown</h2>
{breakdown or "<p>Nothing to break down.</p>"}</section>
<section id="errors"><h2>Load-test errors</h2>
{errors_html}</section>
<section id="anomalies"><h2>Anomalies</h2>
{samples}</section>
<section id="manifest"><h2>Manifest</h2>
<details><summary>raw manifest.json</summary><pre>{manifest}</pre></details></section>
<footer>Run directory <code>{esc(report.run_dir)}</code>; analysed in
{report.analysis_s:.1f} s on {esc(report.spark_master)} (Spark {esc(report.spark_version)}),
generated {esc(report.generated_at)}.</footer>
</body></html>
"""


def _finite(o: Any) -> Any:
    # Strict JSON has no NaN/inf; report such values (e.g. a mean over nothing) as null.
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_finite(v) for v in o]
    return o


def _write_local(path: str, data: bytes) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


def write_report(
    report: Report,
    out_dir: str,
    write: Callable[[str, bytes], None] | None = None,
) -> list[str]:
    """Write report.json and report.html into ``out_dir``; returns the paths written.

    ``write(path, data)`` writes one file; the default writes local files. The Spark job
    passes a Hadoop FileSystem writer for non-local URIs (hdfs://, s3a://, ...).
    """
    writer = write or _write_local
    base = out_dir.rstrip("/")
    json_path, html_path = f"{base}/report.json", f"{base}/report.html"
    data = json.dumps(_finite(report.to_dict()), indent=2, allow_nan=False)
    writer(json_path, (data + "\n").encode())
    writer(html_path, render_html(report).encode())
    return [json_path, html_path]
