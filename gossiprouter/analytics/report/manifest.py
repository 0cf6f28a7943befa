"""What the run's manifest (written by the load test's driver) tells the report: the run's
status, the scenario's events as played, the errors the peers counted and the senders'
schedule (coordinated omission). Each reads the manifest as JSON data and copes with what
an older or an interrupted run left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from gossiprouter.analytics.report.parts import LoadError, RunEvent

__all__ = ["FRAMING", "HostFigures", "SendSchedule", "host_figures", "load_errors",
           "run_events", "run_status", "send_schedule"]


def run_status(manifest: dict[str, Any] | None) -> str | None:
    """The load test's own outcome from the manifest: "ok", "interrupted", "failed",
    "running" (the driver never finished it) or None (no manifest)."""
    status = (manifest or {}).get("status")
    return str(status) if status is not None else None


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


@dataclass(frozen=True)
class HostFigures:
    """What the machine was doing during the run, in three figures that say whether two
    runs can be compared (``analyze --baseline``): the host's one-minute load average
    (mean and max over the run's samples), its cores, and whether the router's fast path
    was on ("on", "off"; None when not known: an external or unsampled router)."""

    load_mean: float | None
    load_max: float | None
    cores: int | None
    fast_path: str | None

    @property
    def busy(self) -> bool:
        """More runnable threads than cores on average: every figure of the run is noisier."""
        return (self.load_mean is not None and self.cores is not None
                and self.load_mean > self.cores)


def host_figures(manifest: dict[str, Any] | None) -> HostFigures:
    """The run's :class:`HostFigures`, from the manifest's ``host`` and ``resources``."""
    m = manifest or {}
    host = m.get("host") if isinstance(m.get("host"), dict) else {}
    res = m.get("resources") if isinstance(m.get("resources"), dict) else {}
    assert isinstance(host, dict) and isinstance(res, dict)
    loads = [float(s["load1"]) for s in res.get("samples") or ()
             if isinstance(s, dict) and isinstance(s.get("load1"), int | float)]
    cores = host.get("cores", res.get("cores"))
    settings = res.get("router_settings")
    fast = settings.get("fast_path") if isinstance(settings, dict) else None
    return HostFigures(
        round(sum(loads) / len(loads), 2) if loads else None,
        round(max(loads), 2) if loads else None,
        cores if isinstance(cores, int) and not isinstance(cores, bool) else None,
        str(fast) if fast is not None else None)
