"""The run's environment: what the machine and the router were doing, from the manifest's
``host``, ``versions`` and ``resources`` (written by
:mod:`gossiprouter.loadtest.resources`): router settings, host, load average, and CPU and
memory of the router and of the load generator over the run."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Final

from gossiprouter.analytics.report.model import Report

__all__ = ["Environment", "ProcessSeries", "environment", "environment_rows"]


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
