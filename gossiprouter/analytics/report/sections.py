"""The report's tables as rows of text, shown by the terminal summary (:mod:`.summary`) and
report.html (:mod:`.html_page`) alike: latency by group, size, cast and scope, a topics
run's audit by scope, the checks (each against its threshold), and the scenario."""

from __future__ import annotations

from typing import Any, Final

from gossiprouter.analytics.report.formatting import fmt_int, fmt_ms
from gossiprouter.analytics.report.manifest import send_schedule
from gossiprouter.analytics.report.model import Report
from gossiprouter.analytics.report.parts import LatencyStats
from gossiprouter.analytics.report.verdict import thresholds

__all__ = ["LATENCY_HEADERS", "check_rows", "latency_rows", "scenario_name", "scenario_rows",
           "scope_table"]


LATENCY_HEADERS: Final = ("latency (ms)", "count", "p50", "p90", "p95", "p99", "p99.9", "max")


def latency_rows(report: Report) -> list[list[str]]:
    rows: list[list[str]] = []

    def add(label: str, s: LatencyStats) -> None:
        rows.append([label, fmt_int(s.count), *(fmt_ms(v) for v in (
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


def scope_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the "by scope" table of a topics run."""
    headers = ["scope", "sent", "expected", "delivered", "lost", "duplicated",
               "extra copies", "unexpected", "in flux", "p50 ms", "p95 ms", "p99 ms", "max ms"]
    rows = []
    for key, b in report.by_scope.items():
        lat = b.latency
        rows.append([key, *(fmt_int(n) for n in (
            b.sent, b.expected, b.delivered, b.lost, b.duplicated, b.duplicate_copies,
            b.unexpected, b.in_flux)),
            *((fmt_ms(lat.p50_ns), fmt_ms(lat.p95_ns), fmt_ms(lat.p99_ns), fmt_ms(lat.max_ns))
              if lat else ("-",) * 4)])
    return headers, rows


def scenario_name(report: Report) -> str:
    name = (report.manifest or {}).get("scenario")
    return str(name) if isinstance(name, str | int | float) else ""


def check_rows(report: Report) -> list[tuple[str, str, str, str]]:
    """(check, threshold, observed, result) rows; result is pass, FAIL, accepted, warn or
    info."""
    a = report.audit
    status = report.run_status
    rows = [("the load test completed", "status ok", status or "unknown (no manifest)",
             "info" if status is None else "pass" if status == "ok" else "FAIL")]
    for t in thresholds(report.manifest, report.latency):
        rows.append((f"latency {t.label}", f"<= {t.limit_ms:g} ms",
                     "no deliveries" if t.observed_ns is None else
                     f"{fmt_ms(t.observed_ns)} ms", "pass" if t.ok else "FAIL"))
    schedule = send_schedule(report.manifest)
    if schedule is not None:
        # Not a failure by itself (k6 counts dropped iterations, too), but a latency
        # measured by a loader that fell behind is understated: shown where it is judged.
        rows.append(("sends on schedule (coordinated omission)", "0 skipped, 0 late",
                     f"{fmt_int(schedule.skipped)} skipped, {fmt_int(schedule.late)} late "
                     f"of {fmt_int(schedule.slots)}", "pass" if schedule.on_time else "warn"))
    if report.kind == "topics":
        lost = a.lost.count
        rows += [
            ("lost (expected subscriber never received it)", "0", fmt_int(lost),
             "pass" if lost == 0 else "accepted" if report.allow_loss else "FAIL"),
            ("duplicated", "0", fmt_int(a.duplicated.count),
             "pass" if a.duplicated.count == 0 else "FAIL"),
            ("unexpected deliveries", "0", fmt_int(a.unexpected.count),
             "pass" if a.unexpected.count == 0 else "FAIL"),
            (f"in flux (patterns changing, settle {report.settle_s:g} s)", "not checked",
             fmt_int(a.undetermined.count), "info"),
        ]
        return rows
    lost = a.lost_registered.count
    rows.append(("lost while sender and receiver were both registered", "0", fmt_int(lost),
                 "pass" if lost == 0 else "accepted" if report.allow_loss else "FAIL"))
    rows.append(("lost across a reconnect (router restart)", "expected, not checked",
                 fmt_int(a.lost_reconnect.count), "info"))
    for name, n in (("duplicated", a.duplicated.count), ("out of order", a.out_of_order.count),
                    ("unexpected deliveries", a.unexpected.count)):
        rows.append((name, "not checked", fmt_int(n), "info"))
    rows.append((f"undetermined (membership changed within the {report.settle_s:g} s window)",
                 "not checked", fmt_int(a.undetermined.count), "info"))
    return rows


def scenario_rows(report: Report) -> list[tuple[str, str]]:
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
